"""Live progress on the user's stream while `job run` / `job resume` work.

On a terminal one line redraws in place with a bar. Into a log (CI, systemd, `| tee`) every line
stays forever, so there it is thinned: each step's first line, then at most one every
``DURABLE_PROGRESS_LOG_INTERVAL_S``, and the last one seen, so a 20,000-invoice batch leaves a
dozen lines rather than hundreds.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Protocol, TextIO

from durable_assets.kit.runtime import Progress
from durable_assets.ops.status_model import ProgressModel


class ProgressFeed(Protocol):
    def poll(self) -> list[Progress]: ...


def progress_line(p: Progress | ProgressModel, tty: bool) -> str:
    """``step 4/7 Issuing refunds 450/1000`` (a bar on a terminal); a step without a count shows none."""
    line = f"step {p.step}/{p.total} {p.label}"
    if p.of:
        bar = "#" * int(p.done / p.of * 30)
        line += f" [{bar:<30}] {p.done}/{p.of}" if tty else f" {p.done}/{p.of}"
    return line


@dataclass
class LogThrottle:
    """Which lines a log gets: a step's first line at once, then at most one per ``interval_s``;
    the newest line held back is handed out by :meth:`last` at the end."""

    interval_s: float
    _step: int | None = None
    _printed_at: float = -math.inf
    _held: str | None = field(default=None, repr=False)

    def offer(self, step: int, line: str, at: float) -> str | None:
        """The line to print now, or None when it is held back."""
        if step != self._step or at - self._printed_at >= self.interval_s:
            self._step, self._printed_at, self._held = step, at, None
            return line
        self._held = line
        return None

    def last(self) -> str | None:
        line, self._held = self._held, None
        return line


def watch(feed: ProgressFeed, stop: threading.Event, out: TextIO, log_interval_s: float) -> None:
    """Print the feed's reports until ``stop``, then drain it once more so the last steps show too."""
    import time

    tty = out.isatty()
    # A terminal's line is redrawn four times a second; a log gets at most a line per step and one
    # per interval, so polling it once a second misses nothing (every report is read from the
    # event log) and leaves the batch three quarters of the reads.
    poll_s = 0.25 if tty else 1.0
    throttle = LogThrottle(log_interval_s)
    last = ""
    draining = 2  # the feed hands a record out one poll after it first sees it
    while draining:
        if stop.wait(poll_s):
            draining -= 1
        try:
            reports = feed.poll()
        except Exception:  # progress display must never break the batch
            continue
        for p in reports:
            line = progress_line(p, tty)
            if line == last:
                continue
            last = line
            if tty:
                out.write("\r" + line.ljust(100))
            elif (shown := throttle.offer(p.step, line, time.monotonic())) is not None:
                out.write(shown + "\n")
            out.flush()
    if tty and last:
        out.write("\n")
    elif (final := throttle.last()) is not None:
        out.write(final + "\n")
        out.flush()
