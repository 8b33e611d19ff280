"""The ``dosa`` command line: demo checks ids, unknown commands fail, fuzz finds tests;
commands outside the reference (bench, mutate) resolve from strings, never from an import
of the GPU package."""

import ast
import importlib.metadata
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dosa_ref import cli
from dosa_ref.cli import main


def test_demo_small_runs_and_checks_ids(capsys):
    rc = main(["demo", "--queries", "3", "--keys", "3000", "--heads", "8", "--K", "64"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "ids identical to dense" in out
    assert "| local |" in out and "| certificate |" in out


def test_unknown_command_fails(capsys):
    assert main(["nope"]) == 2


def test_help(capsys):
    assert main(["--help"]) == 0
    assert "dosa demo" in capsys.readouterr().out


def test_console_script_entry_point():
    r = subprocess.run(
        [sys.executable, "-m", "dosa_ref.cli", "--help"], capture_output=True, text=True
    )
    assert r.returncode == 0 and "dosa fuzz" in r.stdout


# --------------------------------------------------------------------------- plugins

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path) -> set[str]:
    """Absolute module names imported by a source file (relative imports resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    pkg = path.relative_to(ROOT).with_suffix("").parts[:-1]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = list(pkg[: len(pkg) - node.level + 1]) if node.level else []
            mod = ".".join([*base, *([node.module] if node.module else [])])
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
    return out


def test_reference_never_imports_the_gpu_package():
    files = sorted((ROOT / "dosa_ref").rglob("*.py"))
    assert len(files) > 5
    bad = {
        str(f.relative_to(ROOT)): sorted(m for m in _imports(f) if m.split(".")[0] == "dosa_cupy")
        for f in files
    }
    assert not {k: v for k, v in bad.items() if v}


def test_import_scan_sees_imports(tmp_path):
    f = ROOT / "dosa_ref" / "cli.py"
    assert "dosa_ref.progress.Progress" in _imports(f) and "importlib" in _imports(f)


def _plugin_module(tmp_path, monkeypatch, name, body):
    (tmp_path / f"{name}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{name}:main"


def test_plugin_table_runs_with_argv(tmp_path, monkeypatch):
    target = _plugin_module(tmp_path, monkeypatch, "dosa_plug_ok", "def main(argv):\n"
                            "    print('got', argv)\n    return 7\n")  # fmt: skip
    monkeypatch.setitem(cli.PLUGINS, "plug", target)
    assert cli.main(["plug", "-x", "1"]) == 7


def test_installed_entry_point_wins(monkeypatch):
    ep = importlib.metadata.EntryPoint("bench", "somewhere.else:run", cli.PLUGIN_GROUP)
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group=None: [ep])
    assert cli.plugin_target("bench") == "somewhere.else:run"
    assert cli.plugin_target("mutate") == "dosa_ref.mutate:main"  # table fallback
    assert cli.plugin_target("nope") is None


def test_gpu_and_mutate_commands_are_strings():
    assert cli.PLUGINS["bench"].startswith("dosa_cupy.bench")
    assert cli.PLUGINS["mutate"] == "dosa_ref.mutate:main"


def test_missing_plugin_module_is_a_clear_message(monkeypatch, capsys):
    monkeypatch.setitem(cli.PLUGINS, "mutate", "dosa_ref.no_such_module_here:main")
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group=None: [])
    assert cli.main(["mutate", "--help"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "module dosa_ref.no_such_module_here not found" in err


def test_mutate_command(capsys):
    if importlib.util.find_spec("dosa_ref.mutate") is not None:
        pytest.skip("dosa_ref.mutate exists: its own tests cover it")
    assert cli.main(["mutate"]) == 2
    assert "dosa mutate: not available here (module dosa_ref.mutate" in capsys.readouterr().err


def test_import_error_inside_a_plugin_is_not_hidden(tmp_path, monkeypatch):
    target = _plugin_module(tmp_path, monkeypatch, "dosa_plug_bad", "import no_such_dep_xyz\n")
    monkeypatch.setitem(cli.PLUGINS, "plug", target)
    with pytest.raises(ModuleNotFoundError, match="no_such_dep_xyz"):
        cli.main(["plug"])


def test_plugin_without_the_function(tmp_path, monkeypatch, capsys):
    target = _plugin_module(tmp_path, monkeypatch, "dosa_plug_nofn", "x = 1\n")
    monkeypatch.setitem(cli.PLUGINS, "plug", target)
    assert cli.main(["plug"]) == 2
    assert "has no function 'main'" in capsys.readouterr().err


# --------------------------------------------------------------------------- bench, no GPU

BENCH_ARGS = [["--shapes", "32x4096x131072"], ["--decode", "--filter", "x131072"]]


def _one_line_hint(err: str):
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "pip install 'dosa[gpu]'" in err and "NVIDIA GPU" in err


@pytest.mark.parametrize("args", BENCH_ARGS)
def test_bench_without_cupy(args, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "cupy", None)  # `import cupy` → ImportError
    assert main(["bench", *args]) == 2
    err = capsys.readouterr().err
    _one_line_hint(err)
    assert "CuPy is not importable" in err


@pytest.mark.parametrize("args", BENCH_ARGS)
def test_bench_without_a_gpu(args, monkeypatch, capsys):
    import types

    def no_device(*a):
        raise RuntimeError("cudaErrorNoDevice: no CUDA-capable\ndevice is detected")

    fake = types.ModuleType("cupy")
    fake.cuda = types.SimpleNamespace(Device=no_device)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    assert main(["bench", *args]) == 2
    err = capsys.readouterr().err
    _one_line_hint(err)
    assert "no usable CUDA GPU (RuntimeError: cudaErrorNoDevice: no CUDA-capable device" in err


def test_bench_dry_run_needs_no_gpu(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "cupy", None)
    assert main(["bench", "--dry-run", "--regime", "structured"]) == 0
    assert "32x4096x131072" in capsys.readouterr().out


@pytest.mark.parametrize("args", BENCH_ARGS)
def test_bench_on_this_machine_subprocess(args):
    """The console path end to end in a fresh interpreter (skipped where a GPU is usable)."""
    probe = subprocess.run(
        [sys.executable, "-c", "import cupy; cupy.cuda.Device().mem_info"],
        capture_output=True, text=True,
    )  # fmt: skip
    if probe.returncode == 0:
        pytest.skip("a GPU is usable here: dosa bench would run")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "dosa_ref", "bench", *args], capture_output=True,
                       text=True, env=env, cwd=ROOT)  # fmt: skip
    assert r.returncode == 2, r.stderr
    _one_line_hint(r.stderr)
    assert r.stdout == ""
