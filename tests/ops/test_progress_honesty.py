"""Honest progress (issue #15, item 3), each symptom against real `job` processes.

- while step 3 ran, status said `step 2/7 Validating invoices 0/0`;
- `resume` first printed progress of a step it did not re-run, and did not say what it skipped;
- a finished batch said `Writing the batch report`, `done 0 of 0`;
- a cancel must leave later steps `pending` or `skipped`, never `failed`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterEventType

from durable_assets.kit.db import DurableDatabase
from durable_assets.kit.progress import Progress, ProgressStore
from durable_assets.kit.tags import CANCELED_KEY
from durable_assets.ops.progress_lines import progress_line
from durable_assets.ops.runner import cancel_batch
from durable_assets.ops.status_model import ProgressModel
from tests.conftest import job_cli
from tests.crash.helpers import JobProcess, instance_reader, job_env
from tests.support.homes import make_home
from tests.support.polling import wait_until


def _running_step(st: dict[str, Any]) -> int | None:
    running = [s["step"] for s in st["steps"] if s["status"] == "in_progress"]
    return running[-1] if running else None


@pytest.mark.slow
def test_progress_names_the_running_step_and_a_finished_batch_its_end(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    env = job_env(home, DURABLE_STEP_DELAY_S=0.8)
    worker = JobProcess(["run", "--id", "p1", "--size", "60"], env, tmp_path)
    seen: list[tuple[int, dict[str, Any]]] = []
    with instance_reader(home) as reader:
        while worker.proc.poll() is None:
            st = reader.status("p1")
            step = _running_step(st) if st and st["status"] == "running" else None
            # Read once more: a step that finished between the two reads is not a disagreement.
            again = _running_step(reader.status("p1") or st) if step is not None else None
            if step is not None and st and st["progress"] and again == step:
                seen.append((step, st["progress"]))
            time.sleep(0.1)
        assert worker.wait(60) == 0, worker.tail()
        final = reader.status("p1")
    assert {step for step, _ in seen} >= {2, 3, 4}, seen  # sampled while several steps ran
    wrong = [(step, p) for step, p in seen if p["step"] != step]
    assert not wrong, f"progress named another step than the running one: {wrong[:3]}"
    uncounted = [progress_line(ProgressModel(**p), tty=False) for _, p in seen if not p["of"]]
    assert uncounted and not any("0/0" in line for line in uncounted), uncounted
    assert final is not None and final["status"] == "succeeded"
    assert final["progress"] == {"step": 7, "total": 7, "label": "Succeeded", "done": 0, "of": 0}
    human = job_cli("status", "--id", "p1", env=job_env(home)).stdout
    assert "ended: step 7/7 Succeeded" in human and "Writing the batch report" not in human
    assert "0/0" not in human and "0/0" not in worker.stderr


@pytest.mark.slow
def test_cancel_leaves_later_steps_pending_and_resume_says_what_it_skips(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    slow = job_env(home, DURABLE_STEP_DELAY_S=2.0)
    worker = JobProcess(["run", "--id", "c1", "--size", "60"], slow, tmp_path)
    with instance_reader(home) as reader:
        wait_until(
            lambda: (st := reader.status("c1")) is not None and _running_step(st) == 3,
            timeout=120,
            what="step 3 to start",
        )
        assert cancel_batch(reader.instance, "c1") == "cancel requested"  # during step 3's pause
        assert worker.wait(120) == 1, worker.tail()
        st = reader.status("c1")
        assert st is not None and st["status"] == "canceled"
        statuses = [s["status"] for s in st["steps"]]
        assert "failed" not in statuses, statuses
        assert statuses[:2] == ["completed", "completed"] and statuses[2] == "skipped", statuses
        assert all(s in ("pending", "skipped") for s in statuses[3:]), statuses
        assert st["progress"]["label"] == "Canceled: Computing refund candidates", st["progress"]
        assert "canceled at step 3 (refund_candidates)" in worker.stderr, worker.tail()
        # The stop is marked by the kit's typed metadata, which is what the status reads.
        failures = reader.instance.all_logs(st["run_ids"][-1], of_type=DagsterEventType.STEP_FAILURE)
        markers = [
            (r.step_key, r.dagster_event.step_failure_data.user_failure_data.metadata.get(CANCELED_KEY))
            for r in failures
            if r.dagster_event is not None
        ]
        assert [(step, getattr(m, "value", None)) for step, m in markers] == [("refund_candidates", True)], (
            markers
        )

        # The last report left behind belongs to a step that resume will not run again (as when a
        # worker dies right after a step's last report): resume must not show it as its own.
        old_run = st["run_ids"][-1]
        ProgressStore(DurableDatabase.for_instance(reader.instance)).write(
            "c1", old_run, Progress(2, 7, "Validating invoices", 55, 55)
        )
    # Each step of the resume lasts at least a second, so the watcher sees step 3 before step 4
    # however loaded the machine is (without it, step 3 can finish between two polls).
    resumed = JobProcess(["resume", "--id", "c1"], job_env(home, DURABLE_STEP_DELAY_S=1.0), tmp_path)
    assert resumed.wait(180) == 0, resumed.tail()
    err = resumed.stderr
    assert "resume: skipping 2 committed step(s): invoices, validated_invoices" in err, err
    progress_lines = [line for line in err.splitlines() if line.startswith("step ")]
    assert progress_lines and progress_lines[0].startswith("step 3/7"), progress_lines
    assert not any(line.startswith(("step 1/7", "step 2/7")) for line in progress_lines), progress_lines


def _progress_steps(stderr: str) -> list[int]:
    return [int(line.split()[1].split("/")[0]) for line in stderr.splitlines() if line.startswith("step ")]


@pytest.mark.slow
def test_every_step_is_shown_by_the_cli_and_the_stream_however_short(tmp_path: Path) -> None:
    """Issue #23, item 6: a step shorter than the watcher's poll was never printed (2 -> 4)."""
    from durable_assets.ops.events import BatchEventFeed

    home = make_home(tmp_path)
    worker = JobProcess(["run", "--id", "e1", "--size", "200"], job_env(home), tmp_path)
    assert worker.wait(120) == 0, worker.tail()
    shown = _progress_steps(worker.stderr)
    assert shown == sorted(shown), shown  # in order
    assert set(shown) == set(range(1, 8)), shown  # none skipped, however fast it passed

    with instance_reader(home) as reader:
        feed = BatchEventFeed(reader.instance, "e1")
        events: list[Any] = []

        def drained() -> bool:
            got, ended = feed.poll()
            events.extend(got)
            return ended

        wait_until(drained, timeout=30, what="the stream of a finished batch to end")
    streamed = [e.data["step"] for e in events if e.event == "progress"]
    assert streamed == sorted(streamed) and set(streamed) == set(range(1, 8)), streamed
    # Each step's first progress event follows its start and precedes its end.
    for n in range(1, 8):
        kinds = [(e.event, e.data.get("status")) for e in events if e.data.get("step") == n]
        assert kinds[0] == ("step", "in_progress") and kinds[1][0] == "progress", kinds
        assert kinds[-1] == ("step", "completed"), kinds


def test_percent_is_100_only_once_the_batch_succeeded(tmp_path: Path) -> None:
    """Issue #23, item 6: every step committed but the run's end not recorded (the worker SIGKILLed
    itself between the last step's success and the run's) is not 100 %: the batch has not succeeded."""
    from tests.crash.helpers import job_killed_in_teardown

    home = make_home(tmp_path)
    env = job_env(home, lease_ttl_s=60.0)
    worker = job_killed_in_teardown(["run", "--id", "t1", "--size", "60"], env, tmp_path)
    assert worker.wait(120) != 0, worker.tail()
    with instance_reader(home) as reader:
        st = reader.status("t1")
    # Its process is gone from this host, so the worker is known lost before its lease lapses.
    assert st is not None and st["status"] == "failed", st
    assert [s["status"] for s in st["steps"]] == ["completed"] * 7
    assert st["percent_complete"] < 100.0, st["percent_complete"]
