"""The command line's argument toolkit, shared by every ``dosa`` command and ``python -m``
entry point (the reference's and the GPU package's): ``CommandParser`` (a bad argument is one
line naming its flag, exit code 2), the ``type=`` parsers of flag values, and
``run_command``, which turns a library ``ValueError("name: reason")`` about an argument
into that line.  No command is defined here (``dosa_ref.cli``), so every parser can import
it without importing the commands.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import NoReturn

import numpy as np

__all__ = [
    "CommandParser",
    "existing_dir",
    "existing_file",
    "flag_message",
    "name_in",
    "nonnegative_int",
    "one_line",
    "positive_float",
    "positive_int",
    "run_command",
    "unit_fraction",
]


def one_line(message: object) -> str:
    """An argparse or library error message as one line: whitespace collapsed, argparse's
    "argument " prefix dropped (``--K: invalid int value: 'x'``)."""
    text = " ".join(str(message).split())
    return text[len("argument ") :] if text.startswith("argument ") else text


class CommandParser(argparse.ArgumentParser):
    """The argument parser of a ``dosa`` command: a bad argument is one line on stderr,
    ``PROG: --flag: reason``, and exit code 2.  (argparse's own ``error`` prints the usage
    first: several lines, in which the flag is hard to find.)"""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {one_line(message)}\n")

    def parse_known_args(self, args=None, namespace=None):
        if _SCOPES:  # inside run_command: remember the flags of this command
            _SCOPES[-1].append(self)
        return super().parse_known_args(args, namespace)

    @contextlib.contextmanager
    def value_errors(self, **names: str) -> Iterator[None]:
        """Inside: a ``ValueError("name: reason")`` of the library about an argument becomes
        this parser's one-line error naming the flag.  ``names`` maps the library's names to
        flags (``Qn="--queries"``); a name that is itself a flag of this parser (``K`` →
        ``--K``) needs no entry.  Any other ValueError propagates: it is not about an
        argument, and its traceback is needed."""
        try:
            yield
        except ValueError as e:
            line = flag_message(e, [self], names)
            if line is None:
                raise
            self.error(line)


def _flags(parsers: Iterable[argparse.ArgumentParser]) -> set[str]:
    # _option_string_actions: argparse's table of every option string (no public accessor)
    return {f for p in parsers for f in p._option_string_actions}


def flag_message(
    err: ValueError,
    parsers: Iterable[argparse.ArgumentParser],
    names: Mapping[str, str] | None = None,
) -> str | None:
    """``"--flag: reason"`` for a library ValueError ``"name: reason"`` (or ``"a, b: ..."``)
    whose names are flags of ``parsers`` (``K`` → ``--K``, ``logits-gib`` →
    ``--logits-gib``) or keys of ``names``; None when some name is neither."""
    head, sep, rest = str(err).partition(": ")
    if not sep or not head.strip():
        return None
    flags, names = _flags(parsers), names or {}
    out = []
    for name in (h.strip() for h in head.split(",")):
        found = names.get(name) or next(
            (f for f in (name, f"--{name}", f"--{name.replace('_', '-')}") if f in flags), None
        )
        if found is None or not found.startswith("-"):
            return None
        out.append(found)
    return one_line(f"{', '.join(dict.fromkeys(out))}: {rest}")


def _arg_type(fn: Callable[[str], object]) -> Callable[[str], object]:
    """An argparse ``type=``: ``fn``'s ValueError becomes argparse's ArgumentTypeError, whose
    text argparse prints after the flag (a ValueError would print "invalid fn value")."""

    @functools.wraps(fn)
    def parse(text: str):
        try:
            return fn(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


def _int(text: str, minimum: int, what: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise ValueError(f"expected {what}, got {text!r}") from None
    if v < minimum:
        raise ValueError(f"expected {what}, got {text!r}")
    return v


@_arg_type
def positive_int(text: str) -> int:
    """An integer ≥ 1 (counts: queries, keys, heads, K, jobs ...)."""
    return _int(text, 1, "a positive integer")


@_arg_type
def nonnegative_int(text: str) -> int:
    """An integer ≥ 0 (seeds, sample sizes)."""
    return _int(text, 0, "an integer >= 0")


def _float(text: str, ok: Callable[[float], bool], what: str) -> float:
    """``text`` as a finite number for which ``ok`` holds, else a ValueError "expected
    WHAT"."""
    try:
        v = float(text)
    except ValueError:
        v = float("nan")
    if not (np.isfinite(v) and ok(v)):
        raise ValueError(f"expected {what}, got {text!r}")
    return v


@_arg_type
def positive_float(text: str) -> float:
    """A finite number > 0 (seconds)."""
    return _float(text, lambda v: v > 0.0, "a number > 0")


@_arg_type
def unit_fraction(text: str) -> float:
    """A number in [0, 1] (a score threshold)."""
    return _float(text, lambda v: 0.0 <= v <= 1.0, "a number in [0, 1]")


@_arg_type
def existing_file(text: str) -> str:
    """The path of an existing file."""
    if not os.path.isfile(text):
        what = "a directory, not a file" if os.path.isdir(text) else "no such file"
        raise ValueError(f"{what}: {text!r}")
    return text


@_arg_type
def existing_dir(text: str) -> str:
    """The path of an existing directory."""
    if not os.path.isdir(text):
        raise ValueError(f"no such directory: {text!r}")
    return text


def name_in(names: Iterable[str], what: str) -> Callable[[str], str]:
    """A ``type=`` accepting one of ``names``: ``unknown regime 'foo' (choose from ...)``."""
    names = tuple(names)

    @_arg_type
    def parse(text: str) -> str:
        if text not in names:
            raise ValueError(f"unknown {what} {text!r} (choose from {', '.join(names)})")
        return text

    return parse


# The parsers of the running commands (run_command's scopes, innermost last): each
# CommandParser that parses registers here, so that a library ValueError about an argument
# can be told by its flag.
_SCOPES: list[list[argparse.ArgumentParser]] = []


@contextlib.contextmanager
def _command_parsers() -> Iterator[list[argparse.ArgumentParser]]:
    """The CommandParsers that parse while a command runs (``run_command``)."""
    parsers: list[argparse.ArgumentParser] = []
    _SCOPES.append(parsers)
    try:
        yield parsers
    finally:
        _SCOPES.pop()


def run_command(prog: str, fn: Callable[[list[str]], int], argv: list[str]) -> int:
    """``fn(argv)``, a command's main, with one-line argument errors: argparse's (exit 2)
    and a library ValueError ``"name: reason"`` whose name is a flag of the command's
    parsers (one line naming the flag, return 2).  Other exceptions propagate."""
    with _command_parsers() as parsers:
        try:
            return fn(argv)
        except ValueError as e:
            line = flag_message(e, parsers)
            if line is None:
                raise
            last = parsers[-1].prog if parsers else prog
            print(f"{last if last.startswith('dosa') else prog}: {line}", file=sys.stderr)
            return 2
