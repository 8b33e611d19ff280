"""A dependency-free text progress bar on stderr (disabled when not a TTY unless forced)."""

from __future__ import annotations

import sys
import time


class Progress:
    """``with Progress(total, "label") as bar: bar.update(n)`` draws ``label [####  ] i/n``."""

    def __init__(self, total: int, label: str = "", enabled: bool | None = None, width: int = 30):
        self.total, self.label, self.width = max(int(total), 1), label, width
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.done = 0
        self.t0 = time.perf_counter()

    def update(self, n: int = 1) -> None:
        self.done = min(self.total, self.done + n)
        if self.enabled:
            f = self.done / self.total
            bar = "#" * int(f * self.width)
            el = time.perf_counter() - self.t0
            sys.stderr.write(
                f"\r{self.label} [{bar:<{self.width}}] {self.done}/{self.total} {el:5.1f}s"
            )
            sys.stderr.flush()

    def __call__(self, *_):
        self.update(1)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()
