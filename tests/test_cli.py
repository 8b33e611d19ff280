"""The ``dosa`` command line: demo checks ids, unknown commands fail, fuzz finds tests;
commands outside the reference (bench, mutate) resolve from strings, never from an import
of the GPU package.  A bad argument of any command is one line on stderr naming the flag,
exit code 2; the help texts list the commands, profiles, regimes and default sizes; fuzz
runs the property tests only; progress is plain lines when stderr is not a terminal."""

import argparse
import ast
import importlib
import importlib.metadata
import importlib.util
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dosa_ref import cli, cmdline
from dosa_ref.cli import main
from dosa_ref.progress import Progress


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


# --------------------------------------------------------------------------- bad arguments


def _run(args: list[str], capsys) -> tuple[int, str, str]:
    """``main(args)`` in this process: (exit code, stdout, stderr); argparse's SystemExit
    counts as the exit code it carries."""
    try:
        rc = main(args)
    except SystemExit as e:
        rc = e.code
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _one_line_error(rc: int, err: str, flag: str) -> None:
    assert rc == 2, err
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert "Traceback" not in err and err.startswith("dosa "), err
    assert flag in err, err


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


# Every subcommand, with a bad value of one of its flags: a value argparse rejects (type=,
# choices=), a cross-flag check (ap.error) and a library ValueError named after the flag.
BAD_ARGS = [
    (["demo", "--regime", "foo"], "--regime"),
    (["demo", "--queries", "0"], "--queries"),
    (["demo", "--keys", "-5"], "--keys"),
    (["demo", "--heads", "x"], "--heads"),
    (["demo", "--K", "0"], "--K"),
    (["demo", "--seed", "-1"], "--seed"),
    (["demo", "--strategies", "local,nope"], "--strategies"),
    (["demo", "--queries", "9", "--keys", "4"], "--queries"),
    (["demo", "--nope"], "--nope"),
    (["fuzz", "--profile", "weekly"], "--profile"),
    (["calibrate", "--regime", "foo"], "--regime"),
    (["calibrate", "--queries", "0"], "--queries"),
    (["calibrate", "--layers", "0"], "--layers"),
    (["calibrate", "--queries", "64", "--keys", "8"], "--queries"),
    (["audit", "--workload", "foo"], "--workload"),
    (["audit", "--queries", "0"], "--queries"),
    (["audit", "--sample", "-1"], "--sample"),
    (["audit", "--load", "/nonexistent.npz"], "--load"),
    (["audit", "--replay", "/nonexistent.json"], "--replay"),
    (["audit", "--scale-fmt", "e5m2"], "--scale-fmt"),
    (["proofs", "--only", "no_such_statement"], "--only"),
    (["proofs", "--seed", "x"], "--seed"),
    (["mutate", "--jobs", "0"], "--jobs"),
    (["mutate", "--timeout", "-1"], "--timeout"),
    (["mutate", "--min-score", "2"], "--min-score"),
    (["mutate", "--list", "--modules", "no_such_module"], "--modules"),  # library ValueError
    (["bench", "--reps", "5", "--dry-run"], "--reps"),  # library ValueError
    (["bench", "--K", "x", "--dry-run"], "--K"),
    (["bench", "--decode", "--next-n", "3"], "--next-n"),  # the mode's own parser
    (["bench", "--decode", "--dry-run"], "--dry-run"),  # no GPU-free plan: says so
    (["bench", "--serving", "--parts", "nope"], "--parts"),
    (["bench", "--serving", "--dry-run", "--bogus"], "--bogus"),
    (["train-indexer", "--steps", "x"], "--steps"),
]


@pytest.mark.parametrize("args,flag", BAD_ARGS, ids=[" ".join(a) for a, _ in BAD_ARGS])
def test_a_bad_argument_is_one_line_naming_the_flag(args, flag, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "cupy", None)  # no GPU run may start
    target = cli.plugin_target(args[0])
    module = target.partition(":")[0] if target else None
    rc, out, err = _run(args, capsys)
    if module and not _importable(module):  # the plugin hint path instead
        assert rc == 2 and err.count("\n") == 1 and f"dosa {args[0]}:" in err, err
        return
    _one_line_error(rc, err, flag)
    assert out == ""


def test_every_command_is_driven_with_a_bad_flag():
    assert {a[0] for a, _ in BAD_ARGS} == {*cli.COMMANDS, *cli.PLUGINS}


def test_the_parser_scopes_close_after_a_command(capsys):
    """run_command's record of the command's parsers ends with the command, also when its
    parser exits; argparse itself is not touched."""
    before = (argparse.ArgumentParser.error, argparse.ArgumentParser.parse_known_args)
    _run(["proofs", "--only", "nope"], capsys)
    assert cmdline._SCOPES == []
    assert (argparse.ArgumentParser.error, argparse.ArgumentParser.parse_known_args) == before


def test_library_value_errors_name_the_flag(tmp_path, monkeypatch, capsys):
    """A plugin's ValueError "name: reason" becomes one line naming --name when the
    command's parser has that flag; any other ValueError keeps its traceback."""
    body = (
        "from dosa_ref.cmdline import CommandParser\n"
        "def main(argv):\n"
        "    ap = CommandParser(prog='dosa plug')\n"
        "    ap.add_argument('--max-things', type=int)\n"
        "    a = ap.parse_args(argv)\n"
        "    raise ValueError(f'max-things: too many, got {a.max_things}')\n"
    )
    monkeypatch.setitem(cli.PLUGINS, "plug", _plugin_module(tmp_path, monkeypatch, "dosa_pv", body))
    rc, _, err = _run(["plug", "--max-things", "9"], capsys)
    _one_line_error(rc, err, "--max-things: too many, got 9")
    assert err.startswith("dosa plug: ")
    body2 = "def main(argv):\n    raise ValueError('tensor: a bug, not an argument')\n"
    monkeypatch.setitem(
        cli.PLUGINS, "plug2", _plugin_module(tmp_path, monkeypatch, "dosa_pv2", body2)
    )
    with pytest.raises(ValueError, match="a bug"):
        main(["plug2"])


def test_value_errors_map_library_names():
    ap = cmdline.CommandParser(prog="dosa t")
    ap.add_argument("--queries", type=int)
    ap.add_argument("--K", type=int)
    assert cmdline.flag_message(ValueError("Qn: too long"), [ap], {"Qn": "--queries"}) == (
        "--queries: too long"
    )
    assert cmdline.flag_message(ValueError("K: expected 1..4096"), [ap]) == "--K: expected 1..4096"
    assert cmdline.flag_message(ValueError("D: no such flag"), [ap]) is None
    assert cmdline.flag_message(ValueError("no head here"), [ap]) is None


@pytest.mark.parametrize(
    "args,flag",
    [
        (["demo", "--regime", "foo"], "--regime"),
        (["audit", "--load", "/nonexistent.npz"], "--load"),
    ],
)
def test_bad_argument_exit_code_in_a_fresh_interpreter(args, flag):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "dosa_ref", *args], capture_output=True,
                       text=True, env=env, cwd=ROOT)  # fmt: skip
    _one_line_error(r.returncode, r.stderr, flag)
    assert r.stdout == ""


def test_unknown_command_is_one_line(capsys):
    rc, _, err = _run(["nope"], capsys)
    assert rc == 2 and err.count("\n") == 1 and "unknown command 'nope'" in err


# --------------------------------------------------------------------------- help texts


def test_top_level_help_lists_every_command_and_profile(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    lines = [ln.strip() for ln in out.splitlines()]
    for name in (*cli.COMMANDS, *cli.PLUGINS):
        line = next((ln for ln in lines if ln.startswith(f"dosa {name} ")), None)
        assert line is not None and len(line.split(None, 2)) == 3, name  # a description
    for profile in cli.FUZZ_PROFILES:
        assert profile in out
    assert out.strip() == cli.__doc__.strip()


def test_fuzz_profiles_are_the_conftest_ones(capsys):
    import re

    conftest = (ROOT / "tests" / "conftest.py").read_text()
    assert set(re.findall(r'register_profile\(\s*"(\w+)"', conftest)) == set(cli.FUZZ_PROFILES)
    with pytest.raises(SystemExit) as e:
        main(["fuzz", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out.splitlines()
    for name, text in cli.FUZZ_PROFILES.items():
        hits = [ln for ln in out if ln.split()[:1] == [name]]
        assert len(hits) == 1 and text in hits[0], (name, hits)


@pytest.mark.parametrize("cmd", ["demo", "calibrate", "audit"])
def test_workload_commands_help_lists_regimes_and_sizes(cmd, capsys):
    from dosa_ref.audit import AUDIT_OUT
    from dosa_ref.workloads import regime_names

    with pytest.raises(SystemExit):
        main([cmd, "--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps the help text
    assert all(r in out for r in regime_names())
    sizes = {"demo": ["24", "16,384", "256", "131,072", "2048"], "calibrate": ["32", "65,536"],
             "audit": ["16", "16,384", AUDIT_OUT]}[cmd]  # fmt: skip
    for s in sizes:
        assert s in out, s


def test_audit_writes_under_the_temp_dir_by_default():
    import tempfile

    from dosa_ref.audit import AUDIT_OUT

    assert Path(AUDIT_OUT).parent == Path(tempfile.gettempdir())
    assert "audit_out/" in (ROOT / ".gitignore").read_text().splitlines()


# --------------------------------------------------------------------------- fuzz, mutate


def test_fuzz_runs_only_the_property_tests(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(subprocess, "call", lambda cmd, env=None: calls.append((cmd, env)) or 0)
    assert main(["fuzz", "--profile", "dev", "--", "-x"]) == 0
    ((cmd, env),) = calls
    i = cmd.index("-m", 2)  # after "python -m pytest"
    assert cmd[i + 1] == cli.FUZZ_MARK == "property and not gpu"
    assert cmd[-1] == "-x" and env["HYPOTHESIS_PROFILE"] == "dev"


def test_conftest_marks_hypothesis_tests_property():
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-m", cli.FUZZ_MARK, "tests/test_stats.py"],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    ids = [ln for ln in r.stdout.splitlines() if "::" in ln]
    assert sorted(ids) == [
        "tests/test_stats.py::test_fractions_lie_in_the_unit_interval",
        "tests/test_stats.py::test_fractions_on_generated_workloads",
    ]


@pytest.mark.parametrize("missing", ["pytest", "hypothesis"])
@pytest.mark.parametrize("args", [["fuzz"], ["mutate", "--max-mutants", "1"]])
def test_fuzz_and_mutate_need_the_test_extra(args, missing, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(subprocess, "call", lambda *a, **k: calls.append(a) or 0)
    monkeypatch.setitem(sys.modules, missing, None)  # `import missing` → ImportError
    rc, out, err = _run(args, capsys)
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"{missing} is not installed; pip install 'dosa[test]'" in err
    assert not calls


# --------------------------------------------------------------------------- bench modes


def test_bench_serving_dry_run_needs_no_gpu(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "cupy", None)
    rc, out, err = _run(["bench", "--serving", "--dry-run", "--parts", "small,graph"], capsys)
    assert rc == 0 and err == "", err
    assert "H=32 small: Qn 1, 16, 64" in out and "H=64 graph" in out and "ragged" not in out


# --------------------------------------------------------------------------- demo output


def test_demo_statistics_are_defined_or_a_dash(capsys):
    """The issue's case: 4 queries, all anchors; fractions never above 100 %, no nan."""
    rc = main(["demo", "--queries", "4", "--keys", "1000", "--K", "64", "--heads", "8"])
    out = capsys.readouterr().out
    assert rc == 0 and "nan" not in out
    rows = [ln for ln in out.splitlines() if ln.startswith("| ") and "seeds" not in ln]
    assert len(rows) == 4
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        for c in cells[3:7]:  # survival, pruning, fully scored, anchors scored
            assert c == "-" or 0.0 <= float(c.rstrip("%")) <= 100.0, row
    local = rows[0].split("|")
    assert local[4].strip() == "-"  # nothing screened with local seeds here: undefined


# --------------------------------------------------------------------------- progress


class _Stream(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_progress_writes_lines_when_not_a_terminal():
    t = [0.0]
    buf = _Stream(tty=False)
    with Progress(100, "   dense", stream=buf, clock=lambda: t[0]) as bar:
        for _ in range(100):
            t[0] += 0.5  # 50 s in all
            bar.update()
    lines = buf.getvalue().splitlines()
    assert lines[0] == "dense: start, 100 steps"
    assert lines[1:-1] == [f"dense: {n}/100, {n / 2:.1f} s" for n in (20, 40, 60, 80)]
    assert lines[-1] == "dense: done, 100/100 in 50.0 s"
    assert "\r" not in buf.getvalue()


def test_progress_bar_on_a_terminal_and_silent_when_disabled():
    tty = _Stream(tty=True)
    with Progress(2, "x", stream=tty) as bar:
        bar.update(2)
    assert "\rx [" in tty.getvalue() and "2/2" in tty.getvalue()
    off = _Stream(tty=False)
    with Progress(2, "x", enabled=False, stream=off) as bar:
        bar.update(2)
    assert off.getvalue() == ""
