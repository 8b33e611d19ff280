"""The built wheel carries the CUDA sources, and an installed package reads its own copy.

Offline and CPU only: the wheel is built from a copy of the sources (the checkout keeps no
build/ folder), installed without dependencies into a fresh virtual environment that sees
the running interpreter's packages behind its own (numpy; ``_see_these_packages``), and
``dosa_cupy._build.kernel_sources`` is asked from a folder outside the repository which
files it finds.  Skipped only where venv or pip is missing, or no wheel backend is
installed (``pip install wheel``; the dev extra has it).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "dosa_cupy" / "csrc"
SUFFIXES = (".cu", ".cuh")
# what setuptools needs to build the wheel (pyproject.toml's packages and readme)
TREE = ("pyproject.toml", "README.md", "dosa_ref", "dosa_cupy", "proofs")


def _sources() -> list[str]:
    """Kernel sources of the checkout, relative to its root (POSIX separators)."""
    files = (p for p in CSRC.rglob("*") if p.is_file() and p.suffix in SUFFIXES)
    return sorted(p.relative_to(ROOT).as_posix() for p in files)


def _wheel_backend() -> bool:
    """setuptools builds wheels itself from 70.1 on, with the ``wheel`` package before."""
    if importlib.util.find_spec("wheel") is not None:
        return True
    import setuptools

    major, minor = (int(x) for x in setuptools.__version__.split(".")[:2])
    return (major, minor) >= (70, 1)


def _clean_env() -> dict:
    """This environment without PYTHONPATH (tests run with the checkout on it)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _run(cmd, cwd, timeout=120):
    r = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=_clean_env(), capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    assert r.returncode == 0, f"{' '.join(map(str, cmd))}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    if importlib.util.find_spec("pip") is None:
        pytest.skip("pip is not installed for this interpreter")
    if not _wheel_backend():
        pytest.skip("no wheel backend: setuptools < 70.1 without the wheel package")
    src = tmp_path_factory.mktemp("src")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for name in TREE:
        p = ROOT / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=ignore)
        else:
            shutil.copy2(p, src / name)
    out = tmp_path_factory.mktemp("wheel")
    _run(
        [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation",
         "--no-index", "-q", "-w", out],
        cwd=src,
    )  # fmt: skip
    wheels = list(out.glob("dosa-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_checkout_has_kernel_sources():
    assert "dosa_cupy/csrc/kernels.cu" in _sources()
    assert any(s.endswith(".cuh") for s in _sources())


def test_wheel_carries_every_cuda_source(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [s for s in _sources() if s not in names]
    assert not missing, f"{wheel.name} lacks {missing} (pyproject package-data)"


def _outer_site_dirs() -> list[str]:
    """The site-packages folders of the interpreter running the tests (a venv's own when
    it runs in one), without the checkout."""
    dirs = [sysconfig.get_paths()[k] for k in ("purelib", "platlib")] + site.getsitepackages()
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    seen = dict.fromkeys(str(Path(d)) for d in dirs if Path(d).is_dir())
    return [d for d in seen if not Path(d).resolve().is_relative_to(ROOT)]


def _see_these_packages(py: Path, cwd: Path) -> None:
    """Let the new venv import this interpreter's packages (numpy, ml_dtypes, ...) behind
    its own: a ``.pth`` listing them.  ``venv --system-site-packages`` would expose the
    *base* interpreter's packages, which inside a virtual environment are not the ones the
    suite runs with.  Plain path lines: the outer folders' own ``.pth`` files (an editable
    install's finder of the checkout) are not run, so ``dosa_cupy`` comes from the wheel."""
    probe = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    inner = Path(_run([py, "-c", probe], cwd=cwd).stdout.strip().splitlines()[-1])
    (inner / "_dosa_test_outer.pth").write_text("".join(d + "\n" for d in _outer_site_dirs()))


def test_installed_package_finds_its_own_sources(wheel, tmp_path):
    venv = tmp_path / "venv"
    if importlib.util.find_spec("venv") is None:
        pytest.skip("the venv module is not installed")
    try:
        _run([sys.executable, "-m", "venv", venv], cwd=tmp_path)
    except AssertionError as e:  # no ensurepip (e.g. Debian without python3-venv)
        pytest.skip(f"cannot create a virtual environment with pip: {str(e)[-300:]}")
    py = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    _see_these_packages(py, tmp_path)
    _run([py, "-m", "pip", "install", "--no-deps", "--no-index", "-q", wheel], cwd=tmp_path)
    probe = (
        "import json, dosa_cupy._build as b; "
        "print(json.dumps({'module': b.__file__, 'csrc': str(b.CSRC), "
        "'kernels': [str(b.CSRC / s.source) for s in (b.main_spec(256), b.KernelSpec("
        "'screen_sm90a.cu', sm90a=True))], 'sources': [str(p) for p in b.kernel_sources()]}))"
    )
    cwd = tmp_path / "elsewhere"  # not the checkout: the import must come from the venv
    cwd.mkdir()
    got = json.loads(_run([py, "-c", probe], cwd=cwd).stdout.strip().splitlines()[-1])
    csrc = Path(got["csrc"]).resolve()
    assert csrc.is_relative_to(venv.resolve()), f"sources read from {csrc}, not the venv"
    assert not csrc.is_relative_to(ROOT), csrc
    assert Path(got["module"]).resolve().is_relative_to(venv.resolve())
    assert all(Path(k).is_file() for k in got["kernels"])  # the modules' top files
    found = sorted(Path(p).relative_to(csrc.parents[1]).as_posix() for p in got["sources"])
    assert found == _sources()
    assert all(Path(p).stat().st_size > 0 for p in got["sources"])


def test_wheel_carries_the_trained_indexers(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = sorted(
        p.relative_to(ROOT).as_posix() for p in (ROOT / "dosa_ref" / "data").glob("*.safetensors")
    )
    assert shipped, "dosa_ref/data holds no trained indexer"
    missing = [s for s in shipped if s not in names]
    assert not missing, f"{wheel.name} lacks {missing} (pyproject package-data)"
