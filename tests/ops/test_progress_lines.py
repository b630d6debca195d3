"""Progress into a log is thinned (issue #25 item 4): a line per step, at most one more per
interval, and the last; a terminal still redraws every change in place."""

from __future__ import annotations

import io
import threading

from durable_assets.kit.progress import Progress
from durable_assets.ops.progress_lines import LogThrottle, watch


def test_a_step_prints_its_first_line_then_one_per_interval_and_the_last_at_the_end() -> None:
    throttle = LogThrottle(interval_s=10)
    shown = [
        throttle.offer(step, f"step {step} {n}", at)
        for step, n, at in [(1, 0, 0.0), (1, 5, 3.0), (1, 9, 9.9), (1, 12, 10.0), (2, 0, 11.0), (2, 3, 12.0)]
    ]
    assert shown == ["step 1 0", None, None, "step 1 12", "step 2 0", None]
    assert throttle.last() == "step 2 3"
    assert throttle.last() is None


def test_interval_zero_prints_every_line() -> None:
    throttle = LogThrottle(interval_s=0)
    assert [throttle.offer(1, str(n), float(n) / 100) for n in range(3)] == ["0", "1", "2"]
    assert throttle.last() is None


class _Feed:
    """What ProgressFollower hands out: here, 2,000 reports of one counted step, then one of the next."""

    def __init__(self) -> None:
        self.batches = [[Progress(4, 7, "Issuing refunds", done, 2000) for done in range(1, 2001)]]
        self.batches.append([Progress(5, 7, "Sending notices", 0, 0)])

    def poll(self) -> list[Progress]:
        return self.batches.pop(0) if self.batches else []


def test_a_long_step_into_a_log_leaves_a_few_lines_not_thousands() -> None:
    out, stop = io.StringIO(), threading.Event()
    stop.set()  # drain what the feed has, then end
    feed = _Feed()
    watch(feed, stop, out, log_interval_s=10)
    watch(feed, stop, out, log_interval_s=10)
    lines = out.getvalue().splitlines()
    assert lines[0] == "step 4/7 Issuing refunds 1/2000"
    assert lines[-1] == "step 5/7 Sending notices"
    assert len(lines) <= 4, lines
