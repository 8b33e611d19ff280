"""The ``dosa`` command line: demo checks ids, unknown commands fail, fuzz finds tests."""

import subprocess
import sys

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
