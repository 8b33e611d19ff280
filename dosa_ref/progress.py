"""A dependency-free progress report on stderr: a bar on a terminal, plain lines elsewhere.

On a terminal the bar redraws itself in place.  When stderr is a pipe or a file (``dosa demo
--large 2>&1 | tee log``, a CI log) carriage returns would pile up into one unreadable line,
and drawing nothing leaves a long phase silent for minutes; so there each phase writes a
line when it starts, at most one line every ``every`` seconds while it runs, and one when
it ends, each with the elapsed seconds.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO


class Progress:
    """``with Progress(total, "label") as bar: bar.update(n)`` reports a phase of ``total``
    steps on ``stream`` (default stderr).

    enabled: None (default) draws ``label [####  ] i/n 3.2s`` when the stream is a terminal
    and writes plain lines (``label: start, n steps``; ``label: i/n, 12.0 s`` at most every
    ``every`` seconds; ``label: done, n/n in 31.4 s``) otherwise; True always draws the
    bar; False reports nothing.  ``clock`` is the time source (tests pass a fake one).
    """

    def __init__(
        self,
        total: int,
        label: str = "",
        enabled: bool | None = None,
        width: int = 30,
        *,
        every: float = 10.0,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.total, self.label, self.width = max(int(total), 1), label, width
        self.stream = sys.stderr if stream is None else stream
        if enabled is None:
            tty = getattr(self.stream, "isatty", lambda: False)()
            self.mode = "bar" if tty else "lines"
        else:
            self.mode = "bar" if enabled else "off"
        self.enabled = self.mode != "off"
        self.every, self.clock = float(every), clock
        self.done = 0
        self.t0 = self.clock()
        self._last_line = self.t0
        self._started = False

    @property
    def elapsed(self) -> float:
        """Seconds since the phase started."""
        return self.clock() - self.t0

    def _line(self, text: str) -> None:
        # the right-aligned labels of the demo's table pad with spaces: not in a log line
        self.stream.write(f"{self.label.strip()}: {text}\n")
        self.stream.flush()

    def _start(self) -> None:
        if not self._started:
            self._started = True
            if self.mode == "lines":
                self._line(f"start, {self.total} steps")

    def update(self, n: int = 1) -> None:
        """``n`` more steps done."""
        self._start()
        self.done = min(self.total, self.done + n)
        if self.mode == "bar":
            f = self.done / self.total
            bar = "#" * int(f * self.width)
            self.stream.write(
                f"\r{self.label} [{bar:<{self.width}}] {self.done}/{self.total} "
                f"{self.elapsed:5.1f}s"
            )
            self.stream.flush()
        elif self.mode == "lines" and self.done < self.total:
            now = self.clock()
            if now - self._last_line >= self.every:
                self._last_line = now
                self._line(f"{self.done}/{self.total}, {now - self.t0:.1f} s")

    def __call__(self, *_):
        self.update(1)

    def __enter__(self):
        self._start()
        return self

    def __exit__(self, exc_type, *exc):
        if self.mode == "bar":
            self.stream.write("\n")
            self.stream.flush()
        elif self.mode == "lines":
            how = "done" if exc_type is None else "stopped"
            self._line(f"{how}, {self.done}/{self.total} in {self.elapsed:.1f} s")
