"""What progress reports into the Dagster event log cost the refund step (issue 5: "must not slow it").

Runs the same synthetic batch size with and without the event-log sink (alternating, fresh
instance each time, the embedded provider at 0 ms so the step is as short as it gets and any
overhead as visible as it gets), and reports the refund step's duration from its STEP_START and
STEP_SUCCESS events, and how long the step's own thread spent inside ``report()`` (the writes
happen on the reporter's background thread; only forced reports wait for them).

    .venv/bin/python scripts/measure_progress_overhead.py [--size 3000] [--reps 6]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

REFUND_STEP = 4


def _refund_step_seconds(instance: Any, run_id: str) -> float:
    from dagster import DagsterEventType

    stamps = {}
    for record in instance.get_records_for_run(
        run_id, of_type={DagsterEventType.STEP_START, DagsterEventType.STEP_SUCCESS}
    ).records:
        entry = record.event_log_entry
        if entry.step_key == "issued_refunds":
            stamps[entry.dagster_event.event_type_value] = entry.timestamp  # type: ignore[union-attr]
    return float(stamps["STEP_SUCCESS"] - stamps["STEP_START"])


def _one(size: int, with_sink: bool, blocked: list[float]) -> float:
    """One batch on a fresh instance; appends the refund step's time spent inside report()."""
    from dagster import DagsterInstance

    import durable_assets.kit.resources as resources
    from durable_assets.kit import progress
    from durable_assets.ops import runner

    original_sink, original_report = progress.event_log_sink, progress.ProgressReporter.report
    spent = [0.0]

    def timed_report(self: Any, p: Any, *, force: bool = False) -> None:
        t = time.perf_counter()
        original_report(self, p, force=force)
        if p.step == REFUND_STEP:
            spent[0] += time.perf_counter() - t

    if not with_sink:
        resources.event_log_sink = lambda _i, _r: None  # type: ignore[assignment]
    progress.ProgressReporter.report = timed_report  # type: ignore[method-assign]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            home = Path(tmp)
            (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
            os.environ["DAGSTER_HOME"] = str(home)
            instance = DagsterInstance.get()
            run = runner.start_batch(instance, f"overhead-{int(with_sink)}", size=size)
            seconds = _refund_step_seconds(instance, run.run_id)
            instance.dispose()
            blocked.append(spent[0])
            return seconds
    finally:
        resources.event_log_sink = original_sink
        progress.ProgressReporter.report = original_report  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", type=int, default=3000)
    parser.add_argument("--reps", type=int, default=6)
    args = parser.parse_args()
    results: dict[bool, list[float]] = {True: [], False: []}
    blocked: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(args.reps):
        for with_sink in (False, True):
            results[with_sink].append(_one(args.size, with_sink, blocked[with_sink]))
    for with_sink, label in ((False, "without event-log progress"), (True, "with event-log progress")):
        xs, ms = results[with_sink], 1000 * statistics.median(blocked[with_sink])
        print(
            f"{label:27} refund step median {statistics.median(xs):.3f} s, of which {ms:.1f} ms inside "
            f"report(); runs: {[round(x, 3) for x in xs]}"
        )


if __name__ == "__main__":
    main()
