"""Progress of a long command (``produce``) on stderr.

On a terminal a one-line bar is redrawn in place; otherwise (CI logs, pipes, files) a plain line
is written every ``interval_s``, so logs stay readable. Use it as::

    with Progress("produce", total=600, unit="frames") as progress:
        for frame in frames:
            publish(frame)
            progress.advance()

``total`` may be None when the end is unknown (a bar then shows the count and rate only).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

BAR_WIDTH = 30
# A terminal bar is redrawn at most this often: cheap even at thousands of items per second.
REDRAW_INTERVAL_S = 0.1
LOG_INTERVAL_S = 10.0


class Progress:
    def __init__(self, label: str, total: int | None = None, *, unit: str = "items",
                 stream: TextIO | None = None, interval_s: float = LOG_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.label = label
        self.total = total
        self.unit = unit
        self.stream = stream or sys.stderr
        self.done = 0
        self._clock = clock
        self._started = clock()
        self._terminal = self.stream.isatty()
        self._interval_s = REDRAW_INTERVAL_S if self._terminal else interval_s
        self._last_report = self._started

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def advance(self, count: int = 1) -> None:
        self.done += count
        now = self._clock()
        if now - self._last_report >= self._interval_s:
            self._last_report = now
            self._report(now)

    def close(self) -> None:
        """The final state: the bar completed with a newline, or a last line with the totals."""
        now = self._clock()
        if self._terminal:
            self._report(now)
            self.stream.write("\n")
        else:
            self.stream.write(f"{self.label}: {self._count()} in {now - self._started:.1f} s "
                              f"({self._rate(now):.1f} {self.unit}/s)\n")
        self.stream.flush()

    def _report(self, now: float) -> None:
        if self._terminal:
            self.stream.write(f"\r{self.label} {self._bar()}{self._count()} {self._rate(now):.1f} {self.unit}/s"
                              f"{self._eta(now)}\x1b[K")
        else:
            self.stream.write(f"{self.label}: {self._count()}{self._percent()}, {self._rate(now):.1f} {self.unit}/s"
                              f"{self._eta(now)}\n")
        self.stream.flush()

    def _count(self) -> str:
        return f"{self.done}/{self.total} {self.unit}" if self.total else f"{self.done} {self.unit}"

    def _fraction(self) -> float:
        return min(1.0, self.done / self.total) if self.total else 0.0

    def _bar(self) -> str:
        if not self.total:
            return ""
        filled = round(BAR_WIDTH * self._fraction())
        return f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {self._fraction():4.0%} "

    def _percent(self) -> str:
        return f" ({self._fraction():.0%})" if self.total else ""

    def _rate(self, now: float) -> float:
        elapsed = now - self._started
        return self.done / elapsed if elapsed > 0 else 0.0

    def _eta(self, now: float) -> str:
        rate = self._rate(now)
        if not self.total or not rate or self.done >= self.total:
            return ""
        return f", {(self.total - self.done) / rate:.0f} s left"
