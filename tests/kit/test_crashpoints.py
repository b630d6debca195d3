"""Named crash points: the spec is parsed strictly, an unarmed point does nothing (and costs next to
nothing), and an armed one SIGKILLs a real process at exactly the Nth pass, not before, not after."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_assets.errors import UsageError
from durable_assets.kit import crashpoints
from durable_assets.kit.crashpoints import CrashPoint, CrashSpec, arm, crash_point, disarm, parse_spec
from durable_assets.kit.settings import CrashHooks
from tests.support.machine import scaled
from tests.support.polling import wait_until
from tests.support.processes import REPO


@pytest.fixture(autouse=True)
def _inert() -> Iterator[None]:
    disarm()
    yield
    disarm()


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("after_intent_commit:37", CrashSpec(CrashPoint.AFTER_INTENT_COMMIT, 37)),
        (" WEBHOOK_SENT:1 ", CrashSpec(CrashPoint.WEBHOOK_SENT, 1)),
        ("run_end", CrashSpec(CrashPoint.RUN_END, 1)),  # no count: the first pass
        ("after_intent_commit:3:stop", CrashSpec(CrashPoint.AFTER_INTENT_COMMIT, 3, freeze=True)),
        ("step_start:STOP", CrashSpec(CrashPoint.STEP_START, 1, freeze=True)),
    ],
)
def test_a_spec_names_a_point_and_a_pass(text: str, spec: CrashSpec) -> None:
    assert parse_spec(text) == spec


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("after_intent_comit:3", "names no crash point; use NAME[:N] with NAME one of: after_intent_commit"),
        ("run_end:0", "must be a whole number >= 1"),
        ("run_end:x", "must be a whole number >= 1"),
        ("run_end:", "must be a whole number >= 1"),
        ("", "names no crash point"),
    ],
)
def test_a_bad_spec_is_a_usage_error_naming_the_variable(text: str, says: str) -> None:
    with pytest.raises(UsageError) as raised:
        parse_spec(text)
    assert says in str(raised.value) and str(raised.value).startswith("DURABLE_CRASH_AT=")
    assert raised.value.exit_code == 2


def test_every_point_has_a_distinct_lowercase_name() -> None:
    names = [p.value for p in CrashPoint]
    assert len(set(names)) == len(names) == 21
    assert all(n == n.lower() and parse_spec(n).point.value == n for n in names)


def test_settings_carry_the_two_test_variables() -> None:
    s = CrashHooks.from_env({"DURABLE_CRASH_AT": "run_end:2", "DURABLE_CRASH_COUNTS": "/tmp/c"})
    assert (s.crash_at, s.crash_counts) == ("run_end:2", "/tmp/c")


def test_unarmed_is_a_no_op_and_cheap() -> None:
    assert crashpoints._armed is None
    n = 200_000
    t0 = time.perf_counter()
    for _ in range(n):
        crash_point(CrashPoint.AFTER_RESULT_COMMIT)
    per_call_ns = (time.perf_counter() - t0) / n * 1e9
    # ~50-200 ns on a loaded 2-core box; the bound only catches an accidental environment read per call.
    assert per_call_ns < 2_000, per_call_ns


def test_the_first_pass_reads_the_environment_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DURABLE_CRASH_AT", raising=False)
    monkeypatch.delenv("DURABLE_CRASH_COUNTS", raising=False)
    crashpoints._armed = crashpoints._Unread()
    crash_point(CrashPoint.STEP_START)
    assert crashpoints._armed is None  # nothing armed: inert from now on


def test_counts_are_written_per_point(tmp_path: Path) -> None:
    counts = tmp_path / "counts.jsonl"
    arm(counts_path=counts)
    for _ in range(3):
        crash_point(CrashPoint.STEP_START)
    crash_point(CrashPoint.RUN_END)
    armed = crashpoints._armed
    assert isinstance(armed, crashpoints._Armed)
    armed.write_counts()
    (line,) = counts.read_text().splitlines()
    assert json.loads(line)["counts"] == {"step_start": 3, "run_end": 1}


_CHILD = textwrap.dedent(
    """
    import sys
    from durable_assets.kit.crashpoints import CrashPoint, crash_point

    for i in range(1, 11):
        print(i, flush=True)
        crash_point(CrashPoint.AFTER_INTENT_COMMIT)
        crash_point(CrashPoint.STEP_START)  # another point: never counts toward the armed one
    print("finished", flush=True)
    """
)


def _child(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _CHILD],
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=scaled(120),
        check=False,
    )


@pytest.mark.parametrize("hit", [1, 4, 10])
def test_armed_kills_a_real_process_at_exactly_the_nth_pass(hit: int, tmp_path: Path) -> None:
    counts = tmp_path / "counts.jsonl"
    done = _child({"DURABLE_CRASH_AT": f"after_intent_commit:{hit}", "DURABLE_CRASH_COUNTS": str(counts)})
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert done.stdout.split() == [str(i) for i in range(1, hit + 1)]  # died at pass `hit`, not later
    (line,) = counts.read_text().splitlines()  # written just before the kill
    assert json.loads(line)["counts"]["after_intent_commit"] == hit


def test_a_pass_never_reached_lets_the_process_finish_and_count(tmp_path: Path) -> None:
    counts = tmp_path / "counts.jsonl"
    done = _child({"DURABLE_CRASH_AT": "after_intent_commit:11", "DURABLE_CRASH_COUNTS": str(counts)})
    assert done.returncode == 0 and done.stdout.split()[-1] == "finished", done.stderr
    (line,) = counts.read_text().splitlines()  # at exit
    assert json.loads(line)["counts"] == {"after_intent_commit": 10, "step_start": 10}


def test_a_bad_spec_in_the_environment_stops_the_cli_with_exit_2(tmp_path: Path) -> None:
    from tests.support.homes import clean_env, make_home
    from tests.support.processes import JOB

    home = make_home(tmp_path)
    env = clean_env(home, DURABLE_CRASH_AT="nowhere:1")
    done = subprocess.run(
        [str(JOB), "run", "--id", "b1", "--size", "5"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr
    assert "DURABLE_CRASH_AT='nowhere:1' names no crash point" in done.stderr
    assert not (home / "storage").exists()  # nothing ran


_THREAD_FREEZES = textwrap.dedent(
    """
    import mmap, os, struct, sys, threading, time
    from durable_assets.kit.crashpoints import CrashPoint, crash_point

    with open(sys.argv[1], "r+b") as f:
        counter = mmap.mmap(f.fileno(), 8)

    def batch():  # as `job run` runs a batch: in a thread of its own (ops/interrupts.py)
        crash_point(CrashPoint.AFTER_INTENT_COMMIT)
        n = 0
        while True:  # what the step would do next, counted where the test can read it frozen
            n += 1
            struct.pack_into("<Q", counter, 0, n)

    # The main thread, busy elsewhere, gets the CPU late: both threads on one CPU, the main one at
    # idle priority (what a loaded machine does by chance, made certain).
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    threading.Thread(target=batch, daemon=True).start()
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    while True:
        time.sleep(60)
    """
)


def _stopped(pid: int) -> bool:
    """Every thread of ``pid`` in the stopped state."""
    states = [
        (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        for task in Path(f"/proc/{pid}/task").iterdir()
    ]
    return all(state == "T" for state in states)


def test_a_freeze_stops_the_thread_that_passed_the_point_before_it_runs_on(tmp_path: Path) -> None:
    """`:stop` passed in a thread that is not the main one (every `job run` batch) stops that thread
    at the point. Sent to the process, SIGSTOP was taken by the main thread first and the batch
    thread ran on until the main thread got a CPU: on a busy machine a step read the provider after
    its "frozen" start, and a test's change at the provider was missed (CI, 2026-12-06)."""
    counter = tmp_path / "counter"
    counter.write_bytes(bytes(8))
    child = subprocess.Popen(
        [sys.executable, "-c", _THREAD_FREEZES, str(counter)],
        env={
            "PYTHONPATH": str(REPO),
            "PATH": "/usr/bin:/bin",
            "DURABLE_CRASH_AT": "after_intent_commit:1:stop",
        },
    )
    try:
        wait_until(
            lambda: child.poll() is not None or _stopped(child.pid), scaled(60), what="the child to stop"
        )
        assert child.poll() is None
        assert int.from_bytes(counter.read_bytes(), "little") == 0  # not one step past the point
    finally:
        child.kill()
        child.wait()
