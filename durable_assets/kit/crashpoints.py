"""Named crash points: SIGKILL this process at an exact durable boundary, for the crash tests.

A kill at a random moment lands in a narrow window (between a provider's answer and the commit
that records it, between a step's last write and Dagster's record of its output) only by luck. So
every durable boundary of the kit and the operations layer calls :func:`crash_point` with its
name, and a test arms one of them through the environment::

    DURABLE_CRASH_AT=after_intent_commit:37   # SIGKILL at the 37th pass of that point

The process then kills itself (``SIGKILL``: no cleanup, no atexit, no lease release, exactly what
a lost host looks like) the 37th time it passes that point; ``:N`` may be omitted for the first
pass. A trailing ``:stop`` (``after_intent_commit:37:stop``) freezes it there with ``SIGSTOP``
instead: a hung host or a paused VM, which keeps every lock its threads hold (issue #23: a frozen
SQLite writer must not hang the resume that takes over). ``DURABLE_CRASH_COUNTS=/path/file``
makes the process append, at its exit, one JSON line with how often it passed each point, so a
suite learns from an uncrashed run which hits exist (first, middle, last) instead of guessing.

Unarmed (the normal case) a call costs one module-level ``None`` check: the environment is read
once, on the first call, after which ``_armed`` is None for good.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import threading
from collections import Counter
from enum import StrEnum
from pathlib import Path

from durable_assets.errors import UsageError
from durable_assets.kit.settings import CrashHooks

__all__ = ["CrashPoint", "CrashSpec", "arm", "crash_point", "disarm", "parse_spec"]

CRASH_AT_VARIABLE = "DURABLE_CRASH_AT"


class CrashPoint(StrEnum):
    """Every durable boundary, in the order a batch passes them. The value is the name tests arm."""

    # the ledger (kit/ledger.py, kit/effects.py)
    AFTER_INTENT_COMMIT = "after_intent_commit"
    BEFORE_PROVIDER_REQUEST = "before_provider_request"
    AFTER_PROVIDER_ANSWER = "after_provider_answer"  # answered, its result not recorded yet
    AFTER_RESULT_COMMIT = "after_result_commit"
    AFTER_REVIEW_RECORD = "after_review_record"
    # the run's lease, progress and cancel (kit/leases.py, kit/progress.py, kit/cancel.py)
    AFTER_LEASE_TAKEOVER = "after_lease_takeover"
    AFTER_LEASE_RENEWAL = "after_lease_renewal"
    AFTER_PROGRESS_WRITE = "after_progress_write"
    AFTER_CANCEL_CHECK = "after_cancel_check"
    # steps and runs (kit/steps.py, kit/resources.py, ops/runner.py)
    STEP_START = "step_start"
    STEP_BODY_DONE = "step_body_done"  # the body returned; Dagster has not recorded the output
    ALL_STEPS_DONE = "all_steps_done"  # the run's steps are over; Dagster has not recorded its end
    RUN_END = "run_end"  # the run's end is recorded; the CLI's bookkeeping (webhooks, lease) is not
    # the webhook outbox (ops/webhooks/outbox.py)
    WEBHOOK_CLAIMED = "webhook_claimed"
    WEBHOOK_SENT = "webhook_sent"  # the receiver answered; the answer is not recorded yet
    WEBHOOK_RECORDED = "webhook_recorded"
    # retention (ops/retention/pruning.py)
    ARCHIVE_WRITTEN = "archive_written"  # fsynced under its temporary name
    ARCHIVE_RENAMED = "archive_renamed"
    ARCHIVE_STORED = "archive_stored"  # PUT to the object store; not read back and checked yet
    BATCH_DATA_DELETED = "batch_data_deleted"  # a chunk's stored outputs and files; not its rows
    BATCH_DELETED = "batch_deleted"  # a chunk of lineages is gone from storage


class CrashSpec:
    """Which point to kill at, at which pass (1-based), and whether to freeze instead of dying."""

    __slots__ = ("freeze", "hit", "point")

    def __init__(self, point: CrashPoint, hit: int = 1, *, freeze: bool = False) -> None:
        self.point = point
        self.hit = hit
        self.freeze = freeze

    def __repr__(self) -> str:
        return f"{self.point.value}:{self.hit}" + (":stop" if self.freeze else "")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CrashSpec) and (self.point, self.hit, self.freeze) == (
            other.point,
            other.hit,
            other.freeze,
        )

    def __hash__(self) -> int:
        return hash((self.point, self.hit, self.freeze))

    @property
    def signal(self) -> signal.Signals:
        return signal.SIGSTOP if self.freeze else signal.SIGKILL


def parse_spec(text: str) -> CrashSpec:
    """``name[:N][:stop]`` as a :class:`CrashSpec`; anything else is a :class:`UsageError` (exit 2)
    that lists the points, so a typo in a test's spec fails loudly instead of never crashing."""
    body = text.strip()
    freeze = body.lower().endswith(":stop")
    if freeze:
        body = body[: -len(":stop")]
    name, sep, count = body.partition(":")
    try:
        point = CrashPoint(name.strip().lower())
    except ValueError:
        names = ", ".join(p.value for p in CrashPoint)
        raise UsageError(
            f"{CRASH_AT_VARIABLE}={text!r} names no crash point; use NAME[:N] with NAME one of: {names}"
        ) from None
    if not sep:
        return CrashSpec(point, freeze=freeze)
    if not count.strip().isdigit() or int(count) < 1:
        raise UsageError(f"{CRASH_AT_VARIABLE}={text!r}: the hit count after ':' must be a whole number >= 1")
    return CrashSpec(point, int(count), freeze=freeze)


class _Armed:
    """Counts passes (all points when counts are wanted, else only the armed one) and kills."""

    def __init__(self, spec: CrashSpec | None, counts_path: Path | None) -> None:
        self.spec = spec
        self.counts_path = counts_path
        self.counts: Counter[CrashPoint] = Counter()
        self._lock = threading.Lock()
        if counts_path is not None:
            atexit.register(self.write_counts)

    def passed(self, point: CrashPoint) -> None:
        spec = self.spec
        if self.counts_path is None and (spec is None or point is not spec.point):
            return
        with self._lock:
            self.counts[point] += 1
            n = self.counts[point]
        if spec is not None and point is spec.point and n == spec.hit:
            self.write_counts()
            # At this thread, not the process: a process-directed SIGSTOP is taken by the main
            # thread first, and the batch runs in a thread of its own (ops/interrupts.py), which
            # went on working until the main thread was scheduled (tens of ms on a busy machine:
            # a step read the provider after its "frozen" start). Taken here, the group stop
            # begins in this thread before it returns to Python; SIGKILL ends every thread either way.
            signal.pthread_kill(threading.get_ident(), spec.signal)

    def write_counts(self) -> None:
        """Append this process's passes as one JSON line (several processes may share the file)."""
        if self.counts_path is None:
            return
        with self._lock:
            line = json.dumps({"pid": os.getpid(), "counts": {p.value: n for p, n in self.counts.items()}})
        with open(self.counts_path, "a") as out:
            out.write(line + "\n")
            out.flush()
            os.fsync(out.fileno())


class _Unread:
    """The state before the first pass: read the environment once, then get out of the way."""

    def passed(self, point: CrashPoint) -> None:
        with _arming:  # two threads passing their first point at once must not arm twice
            if isinstance(_armed, _Unread):
                arm()
        if _armed is not None:
            _armed.passed(point)


_arming = threading.Lock()


_armed: _Armed | _Unread | None = _Unread()


def crash_point(point: CrashPoint) -> None:
    """Pass a named durable boundary: nothing at all unless this process was armed for it."""
    if _armed is None:
        return
    _armed.passed(point)


def arm(spec: CrashSpec | str | None = None, counts_path: str | Path | None = None) -> None:
    """Arm from the arguments, or (both None) from ``DURABLE_CRASH_AT`` / ``DURABLE_CRASH_COUNTS``.

    Called on the first :func:`crash_point` of a process; the CLI calls it up front so a malformed
    spec is exit 2 before any batch exists. Re-arming resets the counts.
    """
    global _armed
    if spec is None and counts_path is None:
        current = CrashHooks.current()
        spec, counts_path = current.crash_at, current.crash_counts
    parsed = parse_spec(spec) if isinstance(spec, str) else spec
    counts = Path(counts_path) if counts_path else None
    _armed = _Armed(parsed, counts) if parsed is not None or counts is not None else None


def disarm() -> None:
    """Back to inert (tests); the next :func:`crash_point` does not re-read the environment."""
    global _armed
    _armed = None
