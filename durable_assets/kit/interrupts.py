"""Stop at the next safe point: what a Ctrl-C or SIGTERM of the process running a batch means.

Dagster's own interrupt handling does not stop a durable batch: inside a step it raises
``DagsterExecutionInterruptedError``, which a step with a ``RetryPolicy`` (every durable step has
one) turns into a *retry*, so the batch ran on to ``succeeded``. So the command that runs a batch
handles the signal itself (``durable_assets/ops/interrupts.py``) and only sets this process-wide
flag; the worker reads it where it is safe to stop: at every step boundary and before every
provider request (:meth:`BatchRuntime.check_may_continue`, the effect runner's guard). Requests
already in flight finish and their answers are still recorded by the group commit, so nothing is
sent after the signal and nothing answered is forgotten.

The flag is a plain module attribute, not a database row: it must be readable from the signal
handler's process at the cost of one attribute read per request. It means nothing to any other
process, so a distributed run's tasks learn of the signal from a row the same handler commits
(``durable_stop_requests``), read with the cancel and the lease before each request
(:mod:`durable_assets.kit.standing`).
"""

from __future__ import annotations

import signal
import threading

from durable_assets.errors import BatchInterruptedError

__all__ = ["clear_stop", "interrupted_error", "raise_if_stop_requested", "request_stop", "stop_requested"]

_lock = threading.Lock()
_signal: signal.Signals | None = None


def request_stop(signum: int) -> bool:
    """Record that the process was asked to stop; True the first time (a later call changes nothing)."""
    global _signal
    with _lock:
        if _signal is not None:
            return False
        _signal = signal.Signals(signum)
        return True


def stop_requested() -> signal.Signals | None:
    """The signal that asked this process to stop, or None."""
    return _signal


def clear_stop() -> None:
    """Forget a request (tests; a process that runs several batches in turn)."""
    global _signal
    with _lock:
        _signal = None


def raise_if_stop_requested(batch_id: str) -> None:
    """Called where stopping is safe: raise :class:`BatchInterruptedError` once a stop was requested."""
    received = _signal
    if received is not None:
        raise interrupted_error(batch_id, received)


def interrupted_error(batch_id: str, received: int) -> BatchInterruptedError:
    """What a worker raises when the process running its batch was signalled, here or elsewhere."""
    name = signal.Signals(received).name
    return BatchInterruptedError(
        f"batch {batch_id!r} was interrupted ({name}); stopped before the next side effect. "
        f"`job resume --id {batch_id}` continues it.",
        signum=int(received),
    )
