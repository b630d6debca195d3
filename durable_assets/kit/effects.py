"""Apply many keyed side effects exactly once, fast: the engine behind every mutating step.

Per chunk: check the guard (cancel, fence), claim the chunk's keys in the ledger (intents commit
before any call), reuse recorded results, send the rest concurrently under the process's shared
rate limit with retries that always reuse the key (:mod:`durable_assets.kit.pacing`).
Answers are recorded by a *group commit*: one ledger transaction every ``commit_window_s`` (50 ms)
or ``commit_max_keys`` (200) answers, whichever comes first, not once per chunk
(:mod:`durable_assets.kit.group_commit`).
A crash anywhere leaves intents without results, which the next attempt re-sends with the same
key, and the provider's own idempotency answers with the original result. Why by time as well as
by count: what a resume re-sends is what was unconfirmed at the kill, and with per-chunk commits
that was up to two chunks (400 keys, most of them long answered). With the group commit it is at
most the requests in flight plus the answers of one window: ``concurrency + rate x window``.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from durable_assets.errors import (
    KeyDriftError,
    LeaseHeldError,
    ProviderRejectedError,
    ProviderResponseMismatchError,
)
from durable_assets.kit.crashpoints import CrashPoint, crash_point
from durable_assets.kit.group_commit import (
    COMMIT_MAX_KEYS,
    COMMIT_WINDOW_S,
    GroupCommit,
    How,
    Outcome,
    Settled,
)
from durable_assets.kit.ledger import (
    REVIEW,
    STARTED,
    Intent,
    Ledger,
    LedgerEntry,
    unambiguous_items,
)
from durable_assets.kit.pacing import Backoff, RateLimiter, Result, UnsentCount, call_with_retries
from durable_assets.kit.settings import KitSettings

#: The declared defaults; a step's runner gets the wired values (kit.steps.effect_runner).
_KIT = KitSettings()

__all__ = ["Backoff", "EffectReport", "EffectRunner", "RateLimiter", "Result", "call_with_retries"]


@dataclass
class EffectReport:
    results: dict[str, Result] = field(default_factory=dict)
    review: dict[str, Result] = field(default_factory=dict)
    sent: int = 0
    replayed: int = 0
    looked_up: int = 0
    #: Intents never sent because another key had already claimed their subject (held for review).
    subject_taken: int = 0
    #: Keys whose outcome the ledger already held before this run (settled by an earlier run).
    reused: set[str] = field(default_factory=set)


class _Counter:
    """A thread-safe running count (progress from pool threads)."""

    def __init__(self) -> None:
        self._n = 0
        self._lock = threading.Lock()

    def add(self, n: int) -> int:
        with self._lock:
            self._n += n
            return self._n


@dataclass
class _Chunk:
    futures: dict[str, Future[Settled]]


@dataclass
class EffectRunner:
    """Runs ``perform`` once per intent across crashes, retries and concurrent workers."""

    ledger: Ledger
    scope: str
    owner: str
    perform: Callable[[Intent], Result]
    verify: Callable[[Intent, Result], str | None] = lambda _i, _r: None
    lookup: Callable[[LedgerEntry], Result | None] | None = None
    #: Look every unsettled key up before sending it, not only keys older than the provider's key
    #: retention: for effects that may exist already without our key (a customer made by hand, an
    #: earlier migration's), which the provider's idempotency cannot know about. The found answer
    #: goes through ``verify`` like a sent one.
    lookup_first: bool = False
    key_retention_s: float = _KIT.key_retention_hours * 3600.0
    fence: int = 0
    guard: Callable[[], None] = lambda: None
    concurrency: int = _KIT.concurrency
    chunk_size: int = 200
    limiter: RateLimiter = field(default_factory=lambda: RateLimiter(None))
    backoff: Backoff = field(default_factory=Backoff)
    held_wait_s: float = 180.0
    commit_window_s: float = COMMIT_WINDOW_S
    commit_max_keys: int = COMMIT_MAX_KEYS
    #: The batch the effects belong to: its items' keys are recorded, and a resume that derives
    #: another key or subject for one of them stops before sending (None: an ad-hoc run).
    batch_id: str | None = None
    #: Ledger transactions that recorded answers in the last :meth:`run` (bench scenario 2).
    commits: int = 0
    on_progress: Callable[[int, int], None] = lambda _done, _of: None
    _items: dict[str, Intent] = field(default_factory=dict, init=False, repr=False)
    _unsent: UnsentCount = field(default_factory=lambda: UnsentCount(0), init=False, repr=False)

    def run(self, intents: Sequence[Intent]) -> EffectReport:
        """Claim and send chunk by chunk, with the next chunk queued while one finishes; answers are
        recorded by the group commit as they arrive.

        Two chunks are in flight at a time, so the pool never drains at a chunk boundary (at a
        provider's rate limit that barrier cost ~5% of throughput). Keys another worker holds are
        retried at the end.
        """
        report = EffectReport()
        total = len(intents)
        done = _Counter()
        self._items = self._check_items(intents)
        self._unsent = UnsentCount(total)
        self.on_progress(0, total)

        def settled(n: int = 1) -> None:
            self.on_progress(done.add(n), total)

        held: list[Intent] = []
        commits = GroupCommit(self.ledger, self.scope, self.commit_window_s, self.commit_max_keys)
        failed = True
        try:
            with ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix=self.scope) as pool:
                in_flight: list[_Chunk] = []
                try:
                    for start in range(0, total, self.chunk_size):
                        chunk = intents[start : start + self.chunk_size]
                        in_flight.append(self._start_chunk(pool, chunk, report, held, settled, commits))
                        if len(in_flight) > 1:
                            self._finish_chunk(in_flight.pop(0))
                    while in_flight:
                        self._finish_chunk(in_flight.pop(0))
                finally:
                    # On an error (cancel, takeover, a provider fault) let what is in flight settle:
                    # its answers reach the group commit, which records them before we stop.
                    for chunk_in_flight in in_flight:
                        self._finish_chunk(chunk_in_flight, reraise=False)
                if held:
                    self._run_held(pool, held, report, settled, commits)
            failed = False
        finally:
            error = commits.close()
            self.commits = commits.commits
            report.results.update(commits.finished)
            report.review.update(commits.review)
            report.sent += commits.sent
            report.looked_up += commits.looked_up
            if error is not None and not failed:
                raise error
        return report

    def _check_items(self, intents: Sequence[Intent]) -> dict[str, Intent]:
        """The intents by item; raises :class:`KeyDriftError` before anything is sent when the batch
        recorded another key or subject for one of them (the code that derives keys changed)."""
        if self.batch_id is None:
            return {}
        items = unambiguous_items(intents)
        drift = self.ledger.item_drift(self.batch_id, self.scope, items)
        if drift:
            raise KeyDriftError(
                f"{len(drift)} of this batch's {self.scope} items would go out under another key or "
                f"subject than the batch recorded for them (e.g. {drift[0].describe()}): the code that "
                "derives keys changed since the batch started, and a new key could act twice on an item. "
                "Nothing was sent. Deploy the code the batch started with and resume it"
            )
        return items

    def _start_chunk(
        self,
        pool: ThreadPoolExecutor,
        chunk: Sequence[Intent],
        report: EffectReport,
        held: list[Intent],
        settled: Callable[[int], None],
        commits: GroupCommit,
    ) -> _Chunk:
        commits.raise_if_failed()
        self.guard()
        claim = self.ledger.claim(
            self.scope,
            chunk,
            owner=self.owner,
            fence=self.fence,
            batch_id=self.batch_id,
            items=self._items if self.batch_id is not None else None,
        )
        report.results.update(claim.finished)
        report.review.update(claim.review)
        report.replayed += len(claim.finished) + len(claim.review)
        report.reused.update(claim.finished)
        report.reused.update(claim.review)
        for key, taken in claim.taken.items():
            report.review[key] = {
                "subject_taken": taken.subject,
                "holder_key": taken.holder_key,
                "holder_params": dict(taken.holder_params),
                "holder_state": taken.holder_state,
                "holder_result_id": taken.holder_result_id,
            }
        report.subject_taken += len(claim.taken)
        if claim.finished or claim.review or claim.taken:
            settled(len(claim.finished) + len(claim.review) + len(claim.taken))
            self._unsent.take(len(claim.finished) + len(claim.review) + len(claim.taken))
        held_keys = set(claim.held_elsewhere)
        held.extend(i for i in chunk if i.key in held_keys)
        by_key = {i.key: i for i in chunk}
        stale_before = time.time() - self.key_retention_s
        futures: dict[str, Future[Settled]] = {}
        for e in claim.owned:
            future = pool.submit(self._settle, by_key[e.key], e.created_at < stale_before, e)
            future.add_done_callback(functools.partial(self._answered, commits, settled, e.key))
            futures[e.key] = future
        return _Chunk(futures)

    @staticmethod
    def _answered(
        commits: GroupCommit, settled: Callable[[int], None], key: str, future: Future[Settled]
    ) -> None:
        """A key's future is done: hand its answer to the group commit (an error is raised by
        :meth:`_finish_chunk`, and its key stays an intent)."""
        if not future.cancelled() and future.exception() is None:
            commits.add(key, future.result())
        settled(1)

    @staticmethod
    def _finish_chunk(chunk: _Chunk, *, reraise: bool = True) -> None:
        """Wait until every key of the chunk has settled; then raise the first error, if any."""
        first_error: BaseException | None = None
        for future in chunk.futures.values():
            try:
                future.result()
            except BaseException as exc:  # keep waiting: the others' answers must still be recorded
                first_error = first_error or exc
        if first_error is not None and reraise:
            raise first_error

    def _run_held(
        self,
        pool: ThreadPoolExecutor,
        pending: list[Intent],
        report: EffectReport,
        settled: Callable[[int], None],
        commits: GroupCommit,
    ) -> None:
        """Keys claimed by another live worker: re-check until it finishes them or its claims lapse."""
        deadline = time.monotonic() + self.held_wait_s
        while pending:
            if time.monotonic() > deadline:
                raise LeaseHeldError(
                    f"{len(pending)} {self.scope} keys are claimed by another live worker "
                    f"(e.g. {pending[0].key}); not sending them twice. Retry when it has finished."
                )
            time.sleep(0.2)  # another worker holds these keys; re-check its progress shortly
            still_held: list[Intent] = []
            for start in range(0, len(pending), self.chunk_size):
                chunk = self._start_chunk(
                    pool, pending[start : start + self.chunk_size], report, still_held, settled, commits
                )
                self._finish_chunk(chunk)
            pending = still_held

    def _settle(self, intent: Intent, stale: bool, entry: LedgerEntry) -> Settled:
        """Reach a final answer for one key (its outcome, the result, and where it came from)."""
        self._unsent.take()
        left = self._unsent.left
        if (stale or self.lookup_first) and self.lookup is not None:
            # The provider may have forgotten this key (a resend would not be deduplicated), or the
            # effect may exist without our key at all.
            lookup = self.lookup
            found = call_with_retries(
                lambda: {"found": lookup(entry)}, self.limiter, self.backoff, left=left
            )["found"]
            if found is not None:
                crash_point(CrashPoint.AFTER_PROVIDER_ANSWER)
                return self._judge(intent, found, How.LOOKUP)

        def send() -> Result:
            self.guard()  # cancel and takeover are checked before every attempt, retries included
            crash_point(CrashPoint.BEFORE_PROVIDER_REQUEST)
            return self.perform(intent)

        try:
            answer = call_with_retries(send, self.limiter, self.backoff, left=left)
        except ProviderRejectedError as exc:
            crash_point(CrashPoint.AFTER_PROVIDER_ANSWER)
            return (
                Outcome.REVIEW,
                {"error": str(exc), "code": exc.code, "http_status": exc.http_status},
                How.SENT,
            )
        crash_point(CrashPoint.AFTER_PROVIDER_ANSWER)
        return self._judge(intent, answer, How.SENT)

    def _judge(self, intent: Intent, result: Result, how: How) -> Settled:
        try:
            problem = self.verify(intent, result)
        except ProviderResponseMismatchError as exc:
            problem = str(exc)
        if problem:
            return Outcome.REVIEW, {"mismatch": problem, "provider_answer": dict(result)}, how
        return Outcome.OK, result, how


def review_note(
    review: Mapping[str, Any] | None,
    *,
    subject_taken: Callable[[str, Mapping[str, Any]], str] | None = None,
) -> str:
    """Why an effect is held for review, as a person reads it in a report's ``review_note`` column
    (never a Python dict): the provider's mismatch or refusal in words, else ``key=value; ...``.

    ``subject_taken(holder_key, holder_params)`` words the one case only the job can: its subject
    (a charge and reason, a balance version) was already acted on through another key, whose params
    say which business record that was. It is asked only when the ledger holds that key's answer: a
    holder whose answer is not recorded (it may never have been sent) is worded here, as what the
    ledger knows, never as done.
    """
    if review and "subject_taken" in review and review.get("holder_state") in _HOLDER_STATES:
        return _unsettled_holder(review)
    if review and subject_taken is not None and "subject_taken" in review:
        return subject_taken(str(review["holder_key"]), review.get("holder_params") or {})
    if not review:
        return "held for review (no reason recorded)"
    answer = review.get("provider_answer")
    answer_id = answer.get("id") if isinstance(answer, Mapping) else None
    if "mismatch" in review:
        return f"provider answer does not match the request: {review['mismatch']}" + (
            f" (provider object {answer_id})" if answer_id else ""
        )
    if "error" in review:
        error = str(review["error"])
        details = ", ".join(
            f"{k} {review[k]}"
            for k in ("code", "http_status")
            if review.get(k) and str(review[k]) not in error
        )
        return f"the provider refused the request: {error}" + (f" ({details})" if details else "")
    if "subject_taken" in review:
        return (
            f"{review['subject_taken']} was already claimed by key {review.get('holder_key', '?')}; "
            "each subject gets one effect"
        )
    return "; ".join(f"{k}={_plain(v)}" for k, v in review.items())


#: What the ledger knows of a subject's holder key that has no recorded answer, by its state (a
#: holder claimed in the same call is sent by this very run: the job words it as done).
_HOLDER_STATES = {
    STARTED: "whose answer is not recorded (its request may or may not have reached the provider; "
    "resuming the batch that claimed it settles it)",
    REVIEW: "which is itself held for review",
}


def _unsettled_holder(review: Mapping[str, Any]) -> str:
    state = str(review.get("holder_state"))
    return (
        f"{review['subject_taken']} is claimed by key {review.get('holder_key', '?')}, "
        f"{_HOLDER_STATES.get(state, state)}; each subject gets one effect, so this one waits for a person"
    )


def _plain(value: Any) -> str:
    if isinstance(value, Mapping):
        return ", ".join(f"{k}: {_plain(v)}" for k, v in value.items())
    return str(value)


def answer_mismatches(
    asked: Mapping[str, Any], answer: Mapping[str, Any], fields: Iterable[tuple[str, str]]
) -> list[str]:
    """What of a provider's ``answer`` differs from what was ``asked``, one phrase per field.

    ``fields`` pairs the answer's field with the intent's param it must equal (``("charge",
    "charge_id")``). For an effect's ``verify``: an answer that is not exactly what was asked for
    is held for review, never recorded as done.
    """
    return [
        f"{field} {answer.get(field)!r} != requested {asked[ours]!r}"
        for field, ours in fields
        if answer.get(field) != asked[ours]
    ]
