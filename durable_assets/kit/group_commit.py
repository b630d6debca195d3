"""Group commit: record many keys' answers in one ledger transaction, by time as well as by count.

Why a module of its own: it is the one piece of the effects runner with a thread and a clock.
The runner hands every provider answer over as it arrives (from the futures' done-callbacks, in
pool threads); one flusher thread writes them, results and review together
(:meth:`~durable_assets.kit.ledger.Ledger.record`), ``window_s`` after its last write or as soon
as ``max_keys`` are waiting. So what a kill can leave answered but unrecorded is at most one window
of answers (plus a write in progress), and requests never wait for the database.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from enum import StrEnum

from durable_assets.kit.ledger import Ledger
from durable_assets.kit.pacing import Result

__all__ = ["COMMIT_MAX_KEYS", "COMMIT_WINDOW_S", "GroupCommit", "How", "Outcome", "Settled"]

#: Group commit: answers wait at most this long (s) to be recorded. 50 ms keeps a resume's replays to
#: ``rate x 0.05`` beyond the requests in flight, while one commit still carries tens of answers at
#: the rates providers allow (Stripe: 100 writes/s), so the ledger's cost stays a few percent.
COMMIT_WINDOW_S = 0.05
#: ... or until this many are waiting (a fast provider): bounds one commit's size, as the chunk did.
COMMIT_MAX_KEYS = 200


class Outcome(StrEnum):
    """How a key settled: confirmed (recorded ``finished``) or held for a person (``review``)."""

    OK = "ok"
    REVIEW = "review"


class How(StrEnum):
    """Where the answer came from: a request (first or replayed by the provider), or a lookup."""

    SENT = "sent"
    LOOKUP = "lookup"


Settled = tuple[Outcome, Result, How]


class GroupCommit:
    """Records answers as they arrive, one ledger transaction per ``window_s`` or ``max_keys``.

    Fed by the futures' done-callbacks (pool threads); one flusher thread writes, so requests never
    wait for the database and commits never overlap. A key is added only once the provider has
    answered, so nothing unanswered is ever recorded. :meth:`close` writes whatever is left (also
    when an error stops the step: finished results must still be recorded) and reports a failed
    write, which also stops the runner at its next chunk (:meth:`raise_if_failed`).

    Why no lock per answer: at a fast provider every answer of every pool thread went through one
    condition, whose handoffs under the GIL showed in py-spy as pool threads parked on it (bench
    scenario 2). An answer is now a ``deque.append`` (atomic), and the flusher drains the deque on
    a clock: every ``window_s`` after its last drain, or at once when a pool thread sees
    ``max_keys`` waiting. An answer still waits at most one window (plus a write in progress).
    """

    def __init__(self, ledger: Ledger, scope: str, window_s: float, max_keys: int) -> None:
        self.ledger = ledger
        self.scope = scope
        self.window_s = window_s
        self.max_keys = max_keys
        self.finished: dict[str, Result] = {}  # recorded, for the report
        self.review: dict[str, Result] = {}
        self.sent = 0  # counted by the flusher as it drains, read after close()
        self.looked_up = 0
        self.commits = 0
        self._answers: deque[tuple[str, Settled]] = deque()
        self._wake = threading.Event()  # set by a full group or by close()
        self._closed = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"{scope}-commit", daemon=True)
        self._thread.start()

    def add(self, key: str, settled: Settled) -> None:
        self._answers.append((key, settled))
        if len(self._answers) >= self.max_keys and not self._wake.is_set():
            self._wake.set()

    def _run(self) -> None:
        while True:
            drained_at = time.monotonic()
            # Cleared before the drain: a group filled after this point sets it again, and one
            # filled before it is in this drain.
            self._wake.clear()
            closing = self._closed
            finished: dict[str, Result] = {}
            review: dict[str, Result] = {}
            for _ in range(len(self._answers)):
                key, (outcome, result, how) = self._answers.popleft()
                (finished if outcome is Outcome.OK else review)[key] = result
                self.sent += how is How.SENT
                self.looked_up += how is How.LOOKUP
            if finished or review:
                self._write(finished, review)
            if closing:
                return
            if len(self._answers) < self.max_keys:
                self._wake.wait(max(0.0, drained_at + self.window_s - time.monotonic()))

    def _write(self, finished: dict[str, Result], review: dict[str, Result]) -> None:
        try:
            self.ledger.record(self.scope, finished=finished, review=review)
        except BaseException as exc:  # unrecorded keys stay intents: the next attempt re-sends them
            self._error = self._error or exc
            return
        self.commits += 1
        self.finished.update(finished)
        self.review.update(review)

    def raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def close(self) -> BaseException | None:
        """Record everything added so far and stop; the first failed write, if any."""
        self._closed = True
        self._wake.set()
        self._thread.join()
        return self._error
