"""Ctrl-C and SIGTERM while `job run` / `job resume` runs a batch: stop at the next safe point.

Left to Dagster, neither signal stops a batch: its in-process executor turns an interrupt inside a
step into a retry of the step (every durable step has a ``RetryPolicy``), and the batch ran on to
``succeeded``. So the batch runs in a thread of its own, where Dagster never installs signal
handlers (it only does on the main thread), and the main thread keeps ours:

- first signal: the kit's stop flag (:mod:`durable_assets.kit.interrupts`) is set, and committed
  for the run this process leads (``durable_stop_requests``), so a distributed run's tasks on
  workers read it too (:mod:`durable_assets.kit.standing`); the worker sends no provider request
  after it, lets the ones in flight finish and records their answers, and the step ends failed,
  so the run ends, the CLI releases the lease, and `job resume` can continue at once. The command exits
  128 + the signal (130 for Ctrl-C, 143 for SIGTERM) with one line.
- second signal: stop now. The run is marked failed and the lease released (each bounded, so a
  stuck database cannot keep the process alive), then the process exits. Still exactly once: an
  answer that was not recorded leaves its key an intent, which the resume re-sends with the same
  idempotency key and the provider answers from its record.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar

from durable_assets.errors import BatchInterruptedError
from durable_assets.kit.runtime import clear_stop, request_stop, stop_requested

logger = logging.getLogger(__name__)

if TYPE_CHECKING:  # the CLI imports this module before it knows it will need a database
    from durable_assets.kit.runtime import DurableDatabase

T = TypeVar("T")

#: How long a second signal may spend marking the run failed and releasing the lease before the
#: process exits anyway: a person pressing Ctrl-C twice wants it gone now, and whatever is not
#: recorded here is recovered by `job resume` once the lease lapses (DURABLE_LEASE_TTL_S).
STOP_NOW_BUDGET_S = 3.0
#: How often the main thread looks up from waiting (a signal is handled at once regardless).
_POLL_S = 0.1
_SIGNALS = (signal.SIGINT, signal.SIGTERM)
STOPPING_NOTICE = (
    "\nstopping at the next safe point (requests in flight finish); Ctrl-C again stops at once\n"
)


def run_interruptible(instance: Any, batch_id: str, fn: Callable[[], T]) -> T:
    """Run ``fn`` (which runs batch ``batch_id``) so that SIGINT/SIGTERM stop it at a safe point.

    Returns what ``fn`` returned, or raises :class:`BatchInterruptedError` when a signal stopped
    the batch before it succeeded (a signal after its last safe point changes nothing: the batch
    succeeded and says so). Off the main thread signals cannot be handled; ``fn`` just runs.
    """
    if threading.current_thread() is not threading.main_thread():
        return fn()
    clear_stop()
    err_fd = os.dup(2)  # the terminal's stderr: while the batch runs, descriptor 2 is its log file
    second = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        if not request_stop(signum):
            second.set()

    previous = {
        sig: signal.signal(sig, on_signal)
        for sig in _SIGNALS
        # Started with SIGINT ignored (`cmd &` in a script): the shell meant it not to be stopped by it.
        if signal.getsignal(sig) is not signal.SIG_IGN
    }
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # handed to the main thread, which raises it
            outcome["error"] = exc

    worker = threading.Thread(target=work, name=f"batch-{batch_id}", daemon=True)
    told = False
    handing_on: threading.Thread | None = None
    try:
        worker.start()
        while worker.is_alive():
            worker.join(_POLL_S)
            received = stop_requested()
            if received is not None and handing_on is None:
                handing_on = threading.Thread(
                    target=_hand_on_to_tasks,
                    args=(instance, batch_id, received, worker),
                    name="stop-tasks",
                    daemon=True,
                )
                handing_on.start()
            if received is not None and not told and os.isatty(err_fd):
                # A person at a terminal learns that the first Ctrl-C was heard and what a second does
                # (a script, reading stderr from a pipe or file, gets only the final line).
                os.write(err_fd, STOPPING_NOTICE.encode())
                told = True
            if second.is_set() and received is not None:
                _stop_now(instance, batch_id, received, err_fd)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        os.close(err_fd)
    received = stop_requested()
    if "error" in outcome:
        raise outcome["error"]
    if received is not None:
        step = _stopped_at(instance, batch_id)
        if step is not None:
            raise BatchInterruptedError(_line(batch_id, step), signum=int(received))
    return outcome["value"]  # type: ignore[no-any-return]


def _hand_on_to_tasks(
    instance: Any, batch_id: str, received: signal.Signals, batch: threading.Thread
) -> None:
    """Commit the signal for the run this process leads, so its tasks on workers stop too.

    In a thread of its own: a database that does not answer must not keep the main thread from a
    second signal. The run may not exist yet when the signal comes (its lease still says
    ``pending``): then it is retried until it does, or until the batch has ended.
    """
    from durable_assets.kit.runtime import PENDING_RUN, DurableDatabase, LeaseStore, process_owner
    from durable_assets.ops.settings import lease_ttl_s

    db = DurableDatabase.for_instance(instance)
    leases = LeaseStore(db, ttl_s=lease_ttl_s())
    while batch.is_alive():
        try:
            lease = leases.get(batch_id)
            if lease is not None and lease.owner == process_owner() and lease.run_id != PENDING_RUN:
                request_stop_of_run(db, batch_id, lease.run_id, received)
                return
        except Exception:  # the database busy or away for a moment: the next poll asks again
            logger.debug("stop of batch %s not committed yet; retrying", batch_id, exc_info=True)
        batch.join(_POLL_S)


def request_stop_of_run(db: DurableDatabase, batch_id: str, run_id: str, signum: int) -> None:
    """Commit that ``run_id``'s tasks stop at their next safe point; a repeat changes nothing.

    The row names the run, not only the batch, so the resume's run never sees it; retention deletes
    it with the batch's other rows.
    """
    from durable_assets.kit.runtime import now, stop_requests

    with db.transaction() as conn:
        conn.execute(
            db.insert_ignore(stop_requests),
            [{"batch_id": batch_id, "run_id": run_id, "signal": int(signum), "requested_at": now()}],
        )


def _line(batch_id: str, step: int | None) -> str:
    """The one line docs/contract.md promises (the step unknown only when the database did not answer)."""
    where = f" at step {step}" if step is not None else ""
    return f"interrupted{where}; job resume --id {batch_id} continues it"


def _stopped_at(instance: Any, batch_id: str) -> int | None:
    """The step the batch stopped at (its first step not completed); None when all completed."""
    from durable_assets.errors import UnknownBatchError
    from durable_assets.ops.status import batch_status
    from durable_assets.ops.status_model import StepStatus

    try:
        steps = batch_status(instance, batch_id).steps or []
    except UnknownBatchError:
        return 1  # interrupted before the run existed: nothing ran, step 1 is next
    return next((s.step for s in steps if s.status != StepStatus.COMPLETED), None)


def _stop_now(instance: Any, batch_id: str, received: signal.Signals, err_fd: int) -> None:
    """The second signal: record what can be recorded within :data:`STOP_NOW_BUDGET_S`, then exit."""
    found: dict[str, int | None] = {}

    def settle() -> None:
        try:
            _fail_own_run(instance, batch_id, received)
        finally:
            found["step"] = _stopped_at(instance, batch_id)

    settler = threading.Thread(target=settle, name="stop-now", daemon=True)
    settler.start()
    settler.join(STOP_NOW_BUDGET_S)
    os.write(err_fd, (_line(batch_id, found.get("step")) + "\n").encode())
    sys.stdout.flush()
    os._exit(128 + int(received))


def _fail_own_run(instance: Any, batch_id: str, received: signal.Signals) -> None:
    """Mark this process's live run of the batch failed and release its lease, as `job resume` would
    for a dead worker, so the resume need not wait for the lease to lapse. Only ours: a run or
    lease another process holds is left alone."""
    from durable_assets.kit.runtime import MAX_RETRIES_TAG, DurableDatabase, LeaseStore, process_owner
    from durable_assets.ops.reexecution import LIVE
    from durable_assets.ops.settings import lease_ttl_s
    from durable_assets.ops.status import batch_runs

    leases = LeaseStore(DurableDatabase.for_instance(instance), ttl_s=lease_ttl_s())
    lease = leases.get(batch_id)
    if lease is None or lease.owner != process_owner():
        return
    runs = batch_runs(instance, batch_id)
    newest = runs[-1] if runs else None
    if newest is not None and newest.run_id == lease.run_id and newest.status in LIVE:
        # A person stopped it: the daemon's run retries must not start it again behind their back.
        instance.add_run_tags(newest.run_id, {MAX_RETRIES_TAG: "0"})
        instance.report_run_failed(
            newest,
            message=f"durable-assets: stopped at once by a second {received.name}; "
            f"`job resume --id {batch_id}` continues it",
        )
    leases.release(lease)
