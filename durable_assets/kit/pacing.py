"""Pacing the requests of one process to one provider: an adaptive shared rate, and a down budget.

Nobody should have to know a provider's request limit to get past it. Every thread and call site
of a process that talks to one provider shares one :class:`RateLimiter` (:func:`shared_limiter`):
a token bucket whose rate it learns from the provider's 429s (multiplicative decrease to what the
provider actually let through, additive increase while it lets everything through), so the process
backs off as one instead of sixteen threads retrying on their own.

"What the provider let through" is measured from one 429 to the next: a 429 means the provider's
bucket is empty, so what it admitted between two of them is its refill rate, whatever burst it
allows. (Measured over the last second alone, it counted that burst as rate: the process learned
~1.4x the limit and sent in bursts of ~150/s, each ended by a 429.) ``Retry-After`` is honoured
by the request it answers, which is not sent again before it; a longer one than the header's
least (1 s: RFC 9110 allows only whole seconds, so a provider whose token is back in 10 ms says
1) pauses everyone. Pausing everyone on every such 1 s let the provider's bucket fill whole, to
be spent in the next burst: the bursts and pauses issue #37 measured (144, 123, 32, 151, ...).
What the provider refills while we pause (a step boundary) is spent at once by the next step, up
to the burst the first 429s showed; paced at the learned rate instead, it was left unspent.

A 429 is the provider pacing us, never a fault: it is not an attempt and never makes a request give
up. Faults (5xx, connection errors, timeouts) are retried with backoff until the provider has given
no successful answer for the down budget; then :class:`~durable_assets.errors.ProviderUnavailableError`
names the setting that controls it. A budget in seconds, unlike a count of attempts, bounds how long
a batch waits for a dead provider whatever the concurrency, the chunking or the request timeout.
"""

from __future__ import annotations

import json
import math
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import sqlalchemy as sa

from durable_assets.errors import (
    IdempotencyKeyInFlightError,
    ProviderUnavailableError,
    TransientProviderError,
)
from durable_assets.kit.db import DurableDatabase, list_cursors, now, rate_limits
from durable_assets.kit.settings import KitSettings

if TYPE_CHECKING:
    from durable_assets.kit.accounts import ProviderAccount

Result = Mapping[str, Any]
T = TypeVar("T")

#: After a 429 the rate becomes this fraction of what the provider let through over the last
#: window. Just under 1: the provider's bucket refills a little while we climb back, and those
#: tokens are spent when we next go over, so the average stays at the provider's limit.
DECREASE = 0.9
#: Without 429s the rate grows by this fraction of the last learned rate per second (additive):
#: back over the limit about 2 s after a decrease, slow enough that the overshoot stays small.
INCREASE_PER_S = 0.05
#: What "let through lately" is measured over, and the least time between two decreases: one
#: measurement per decrease, so a burst of 429s from many threads counts once.
WINDOW_S = 1.0
#: What the provider let through is measured from the last decrease when that was at most this
#: long ago (two empty buckets: the refill rate); after a longer quiet, over the last window.
SINCE_DECREASE_MAX_S = 10.0
#: A ``Retry-After`` longer than this pauses every caller; up to it, only the request it answered
#: waits it. 1 s is the least the header can say (whole seconds), i.e. "a token is back soon".
PAUSE_EVERYONE_ABOVE_S = 1.0
#: Never slower than this (requests/s): a provider that let nothing through in the last window
#: (another client used its quota) must not pin us near zero.
MIN_RATE = 1.0
#: A process that saw the provider down for its whole budget fails further calls without sending
#: them for this long (each would cost a timeout against a black hole); later calls probe again.
FAIL_FAST_S = 5.0
#: A pause in our sending at least this long (a step boundary) lets the provider's bucket refill:
#: the next requests may spend that refill at once (:meth:`RateLimiter.wait_s`).
IDLE_CREDIT_AFTER_S = 0.2
#: The share of the provider's burst, as learned, that a refill after a pause may spend at once:
#: a margin for the estimate, so the credit ends before the provider's bucket does.
IDLE_CREDIT_SHARE = 0.8
#: When what is left to send would take less than this at the current rate (a step's last
#: second), the rate holds at the provider's measured refill instead of growing past it. A 429 there
#: makes its request wait ``Retry-After`` (1 s at least) after the others are done, and the step
#: ends that much later: in half the provider-bound batches, step 5 took 2.0-2.3 s instead of 1.6 s
#: that way. Probing past the refill over the last second could gain a few percent of it.
TAIL_S = 1.0
#: ... unless the provider's bucket holds enough to go past it, by our count, less this share of
#: its burst: answers not yet counted (in flight) and the refill's measurement error.
TAIL_MARGIN = 0.2


class RateLimiter:
    """The process's pace towards one provider; thread-safe; ``clock`` and ``sleep`` for tests.

    ``ceiling`` (``DURABLE_RATE_LIMIT``) is a hard cap the learned rate never exceeds; without it the
    limiter starts unlimited and only limits once the provider has said 429.
    """

    def __init__(
        self,
        ceiling: float | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.ceiling = ceiling if ceiling and ceiling > 0 else None
        self.clock, self.sleep = clock, sleep
        self._lock = threading.Lock()
        now = clock()
        self._learned: float | None = None  # rate set at the last decrease
        self._decreased_at = now - WINDOW_S
        self._decreased_once = False
        self._since_decrease = 0  # successes since the last decrease
        self._tokens, self._refilled = 1.0, now
        self._paused_until = now
        self._successes: deque[float] = deque()
        self._down_since: float | None = None  # first failure after the last success
        self._last_failure = now - FAIL_FAST_S
        # The provider's burst, learned from the first 429 of an unlimited start (see _learn_burst).
        self._first_success: float | None = None
        self._first_run: tuple[int, float] | None = None  # successes and seconds before the first 429
        self._refill: float | None = None  # the provider's refill rate, as last measured
        self._burst = 0.0
        self._credit = 0.0  # requests that may go at once: the provider's refill during our pause
        self._granted_at = now

    @property
    def rate(self) -> float | None:
        """Requests/s allowed now; ``None`` = unlimited."""
        with self._lock:
            return self._rate(self.clock())

    def _rate(self, now: float, left: int | None = None) -> float | None:
        if self._learned is None:
            return self.ceiling
        grown = self._learned * (1.0 + INCREASE_PER_S * (now - self._decreased_at))
        if left is not None and self._refill and grown > self._refill and left < grown * TAIL_S:
            grown = self._tail_rate(now, grown, self._refill, left)
        return min(grown, self.ceiling) if self.ceiling else grown

    def _tail_rate(self, now: float, grown: float, refill: float, left: int) -> float:
        """The rate for a caller's last second (:data:`TAIL_S`): ``grown`` only if the provider's
        bucket holds what sending the ``left`` requests at it would take beyond the refill, by our
        count (empty at the last 429, refilled since, less what it admitted), with a margin; else
        the refill, at which the bucket never empties."""
        held = min(self._burst, refill * (now - self._decreased_at) - self._since_decrease)
        needed = left * (1.0 - refill / grown)
        return grown if held - TAIL_MARGIN * self._burst >= needed else refill

    def wait_s(self, left: int | None = None) -> float:
        """Take a slot now (returns 0) or say how long to wait before asking again. ``left``: the
        caller's requests still to be sent after this one (None: unknown), see :data:`TAIL_S`."""
        with self._lock:
            now = self.clock()
            if now < self._paused_until:
                return self._paused_until - now
            rate = self._rate(now, left)
            if rate is None:
                return 0.0
            capacity = max(1.0, rate / 20)  # bursts of at most 50 ms of requests
            self._tokens = min(capacity, self._tokens + (now - self._refilled) * rate)
            self._refilled = now
            self._credit_pause(now)
            if self._tokens >= 1.0:
                self._tokens -= 1.0
            elif self._credit >= 1.0:  # on top of the rate: the provider refills as we spend it
                self._credit -= 1.0
            else:
                return (1.0 - self._tokens) / rate
            self._granted_at = now
            return 0.0

    def _credit_pause(self, now: float) -> None:
        """After a pause in our sending (a step's end and the next one's start: ~0.3-0.6 s), the
        provider's bucket holds what it refilled meanwhile, up to its burst. Paced at the learned rate
        the next step left it unspent: a 180-request step after a 0.57 s pause took 1.68 s where
        1.23 s would do. So the next requests may go at once, up to that refill (at the learned
        refill rate, within :data:`IDLE_CREDIT_SHARE` of the learned burst). Not with a ceiling: the
        user's cap is a rate never exceeded, and :meth:`_learn_burst` learns no burst under one. A
        429 ends the credit (the estimate was wrong)."""
        idle = now - self._granted_at
        if idle < IDLE_CREDIT_AFTER_S or not self._burst or not self._refill:
            return
        self._credit = max(self._credit, min(IDLE_CREDIT_SHARE * self._burst, idle * self._refill))

    def acquire(self, left: Callable[[], int] | None = None) -> None:
        while (wait := self.wait_s(left() if left is not None else None)) > 0:
            self.sleep(wait)

    def succeeded(self) -> None:
        with self._lock:
            now = self.clock()
            if self._first_success is None:
                self._first_success = now
            self._successes.append(now)
            self._since_decrease += 1
            while self._successes and self._successes[0] < now - WINDOW_S:
                self._successes.popleft()
            self._down_since = None

    def throttled(self, retry_after: float | None) -> float:
        """A 429: the rate drops to what the provider let through; returns how long the request it
        answered waits before it is sent again (``Retry-After``; 0 when everyone is paused for it)."""
        with self._lock:
            now = self.clock()
            self._failed(now)
            own_wait = retry_after or 0.0
            self._credit = 0.0
            if own_wait > PAUSE_EVERYONE_ABOVE_S:
                self._paused_until = max(self._paused_until, now + own_wait)
                own_wait = 0.0  # acquire() waits it out, for this caller as for everyone
            if now - self._decreased_at < WINDOW_S:
                return own_wait  # this window's 429s were already answered by one decrease
            let_through = self._let_through(now)
            self._learn_burst(now, let_through)
            current = self._rate(now)
            floor = current / 2 if current else MIN_RATE  # at most halve on an empty window
            self._learned = max(MIN_RATE, floor, DECREASE * min(let_through, current or let_through))
            self._decreased_at, self._decreased_once, self._since_decrease = now, True, 0
            return own_wait

    def _learn_burst(self, now: float, let_through: float) -> None:
        """The provider's burst: what an unlimited start got through before its first 429, less what
        the provider refills in that time (its rate, known from the second 429 on)."""
        if self.ceiling or self._first_success is None:
            return
        if not self._decreased_once:
            self._first_run = (self._since_decrease, now - self._first_success)
            return
        self._refill = let_through
        if self._first_run is not None and not self._burst:
            successes, seconds = self._first_run
            self._burst = max(0.0, successes - let_through * seconds)

    def _let_through(self, now: float) -> float:
        """Requests/s the provider admitted lately. Since the last decrease (its bucket was empty
        then and is now: what it admitted in between is its refill rate, its burst excluded) when
        that is recent; else over the last window (the first 429, or one after a long quiet)."""
        since = now - self._decreased_at
        if self._decreased_once and since <= SINCE_DECREASE_MAX_S:
            return self._since_decrease / since
        return sum(1 for t in self._successes if t >= now - WINDOW_S) / WINDOW_S

    def faulted(self) -> None:
        with self._lock:
            self._failed(self.clock())

    def _failed(self, now: float) -> None:
        self._last_failure = now
        if self._down_since is None:
            self._down_since = now

    def down_s(self, since: float | None = None) -> float:
        """How long the provider has let nothing through: process-wide, or since ``since`` (a call's
        own first fault), whichever is longer."""
        with self._lock:
            now = self.clock()
            starts = [t for t in (self._down_since, since) if t is not None]
            return now - min(starts) if starts else 0.0

    def known_down(self, budget_s: float) -> bool:
        """Down for the whole budget, and seen failing just now: do not send, fail."""
        with self._lock:
            now = self.clock()
            down = self._down_since is not None and now - self._down_since >= budget_s
            return down and now - self._last_failure < FAIL_FAST_S


_shared: dict[tuple[str, float | None], RateLimiter] = {}
_shared_lock = threading.Lock()


def shared_limiter(provider: str, ceiling: float | None) -> RateLimiter:
    """The one limiter of this process for ``provider``: steps, checks and their threads pace as one."""
    with _shared_lock:
        return _shared.setdefault((provider, ceiling), RateLimiter(ceiling))


#: A process draws this much of the account's rate from the shared bucket per transaction (and the
#: bucket holds at most this much): one short transaction per ~50 ms of requests, not one per request.
SHARED_DRAW_S = 0.05


class SharedBucket:
    """A token bucket in a ``durable_rate_limits`` row: one rate for the account, however many processes.

    Tokens accrue in the row at ``rate`` per second of the database server's clock (one clock for
    every process, whatever its host's says) up to ``rate * SHARED_DRAW_S``; a process takes what it
    may in one short transaction (``SELECT ... FOR UPDATE`` on Postgres, a write lock on SQLite) and
    spends it locally. Tokens exist only at the account's rate, so the
    processes together never exceed it; each draws up to 50 ms of it, so together they reach it.
    """

    def __init__(self, db: DurableDatabase, name: str, rate: float) -> None:
        self.db, self.name, self.rate = db, name, rate
        self.capacity = max(1.0, rate * SHARED_DRAW_S)
        self._lock = threading.Lock()
        self._held = 0.0

    def take(self) -> float:
        """0 when this process may send one request now, else seconds to wait before asking again."""
        with self._lock:
            if self._held >= 1.0:
                self._held -= 1.0
                return 0.0
            got, tokens = self._draw()
            if got >= 1.0:
                self._held += got - 1.0
                return 0.0
            return max((1.0 - tokens) / self.rate, 0.001)

    def _draw(self) -> tuple[float, float]:
        c = rate_limits.c
        with self.db.transaction() as conn:
            # A new bucket is full: as if last drawn from long ago (no clock read before the lock).
            first = {"name": self.name, "tokens": self.capacity, "updated_at": 0.0}
            conn.execute(self.db.insert_ignore(rate_limits).values(**first))
            # The row's lock on Postgres; SQLite renders no FOR UPDATE (its BEGIN IMMEDIATE holds the file).
            query = sa.select(c.tokens, c.updated_at).where(c.name == self.name).with_for_update()
            row = conn.execute(query).one()
            # The clock is read under the row's lock and never moves the row back: a time read
            # before waiting for the lock would count an interval another process drew again.
            t = max(self.db.clock(conn), row.updated_at)
            tokens = min(self.capacity, row.tokens + (t - row.updated_at) * self.rate)
            got = float(math.floor(min(tokens, self.capacity)))
            conn.execute(
                rate_limits.update().where(c.name == self.name).values(tokens=tokens - got, updated_at=t)
            )
        return got, tokens - got


class SharedRateLimiter(RateLimiter):
    """:class:`RateLimiter` whose ceiling is one account-wide bucket instead of this process's own.

    Used by distributed runs: N workers each with ``DURABLE_RATE_LIMIT`` would send N times it.
    What a process learns from 429s and ``Retry-After`` still paces it on top.
    """

    def __init__(self, bucket: SharedBucket, **kwargs: Any) -> None:
        super().__init__(None, **kwargs)
        self.bucket = bucket
        self.ceiling = bucket.rate  # reported as the cap; enforced by the bucket, not the local one

    def _rate(self, now: float, left: int | None = None) -> float | None:
        if self._learned is None:
            return None  # the account's ceiling is the bucket's business
        return super()._rate(now, left)

    def wait_s(self, left: int | None = None) -> float:
        local = super().wait_s(left)
        return local if local > 0 else self.bucket.take()


def account_limiter(db: DurableDatabase, account: str, rate: float) -> RateLimiter:
    """This process's limiter for ``account`` drawing on the shared bucket (one per process)."""
    with _shared_lock:
        key = (f"shared:{db.url}:{account}", rate)
        limiter = _shared.get(key)
        if limiter is None:
            limiter = _shared[key] = SharedRateLimiter(SharedBucket(db, account, rate))
        return limiter


class ListCursors:
    """Where each page of a provider's list began at its last full reading, per account and list,
    in the instance's database: a reader that knows them asks for every page at once instead of
    one after another, in this process or any other (the next night's `job run`, a distributed
    task). Only how many requests run at once depends on it, never what a list holds."""

    def __init__(self, db: DurableDatabase) -> None:
        self.db = db

    def get(self, name: str) -> tuple[str, ...]:
        with self.db.read() as conn:
            found = conn.execute(
                sa.select(list_cursors.c.cursors).where(list_cursors.c.name == name)
            ).scalar()
        return tuple(json.loads(found)) if found else ()

    def put(self, name: str, cursors: Sequence[str]) -> None:
        values = {"name": name, "cursors": json.dumps(list(cursors)), "updated_at": now()}
        with self.db.transaction() as conn:
            conn.execute(self.db.upsert(list_cursors, ["name"], values))


@dataclass(frozen=True)
class Backoff:
    """Retry timing for faults, and the budget after which a provider counts as down."""

    base_s: float = 0.05
    cap_s: float = 5.0
    down_budget_s: float = KitSettings().provider_down_budget_s
    #: What the user changes to wait longer; named in the error.
    budget_setting: str = "DURABLE_PROVIDER_DOWN_BUDGET_S"

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Full jitter (AWS architecture blog), never shorter than the provider asked for."""
        jittered = random.uniform(0, min(self.cap_s, self.base_s * 2**attempt))
        return max(jittered, retry_after or 0.0)

    def unavailable(self, down_s: float, last: BaseException | None) -> ProviderUnavailableError:
        cause = f" Last answer: {' '.join(str(last).split())[:300]}" if last else ""
        return ProviderUnavailableError(
            f"Payment provider unavailable: no successful answer for {down_s:.0f} s, giving up after "
            f"{self.budget_setting}={self.down_budget_s:g} s. Raise {self.budget_setting} to wait longer, "
            f"or `job resume` once the provider is back (effects it confirmed are not sent again).{cause}"
        )


class UnsentCount:
    """How many of a caller's calls (a step's effects or reads) are still to be sent, for the
    limiter's :data:`TAIL_S`. A call leaves the count when it is first attempted, or when it is
    answered without a request (the ledger had its answer)."""

    def __init__(self, count: int) -> None:
        self._count = count
        self._lock = threading.Lock()

    def left(self) -> int:
        return self._count

    def take(self, n: int = 1) -> None:
        with self._lock:
            self._count -= n


class PacedProvider(Protocol):
    """A provider resource that knows its own pace: what a step needs to send effects to it.

    Why a protocol: every step that talks to a provider passes the same four things (its
    concurrency, its shared limiter, its down budget and its account) to the kit, and the kit may
    not import a provider adapter. A resource with these members (``PaymentGateway``) is passed
    whole instead: ``effect_runner(..., provider=payments)``.
    """

    @property
    def concurrency(self) -> int: ...

    @property
    def account(self) -> ProviderAccount: ...

    def limiter(self) -> RateLimiter: ...

    def backoff(self) -> Backoff: ...


def call_with_retries(
    call: Callable[[], Result],
    limiter: RateLimiter,
    backoff: Backoff,
    *,
    left: Callable[[], int] | None = None,
) -> Result:
    """One provider call (safe to repeat: reads, or writes with the same idempotency key), paced.

    429: the whole process slows down and waits ``Retry-After``; not an attempt. Faults: backoff,
    until the provider has let nothing through for ``backoff.down_budget_s`` (this call's own faults
    count from its first one, so one request failing forever is bounded too). ``left``: how many of
    the caller's calls are still to be sent after this one (the limiter's :data:`TAIL_S`).
    """
    first_fault: float | None = None
    last: BaseException | None = None
    attempt = 0
    while True:
        if limiter.known_down(backoff.down_budget_s):
            raise backoff.unavailable(limiter.down_s(first_fault), last)
        limiter.acquire(left)
        try:
            result = call()
        except (TransientProviderError, IdempotencyKeyInFlightError) as exc:
            last = exc
            retry_after = getattr(exc, "retry_after", None)
            paced = getattr(exc, "http_status", None) == 429
            if paced:
                # Not sent again before Retry-After; the others go on at the decreased rate.
                limiter.sleep(limiter.throttled(retry_after))
            else:
                limiter.faulted()
                first_fault = limiter.clock() if first_fault is None else first_fault
                attempt += 1
            down = limiter.down_s(first_fault)
            if down >= backoff.down_budget_s:
                raise backoff.unavailable(down, exc) from exc
            if not paced:
                limiter.sleep(min(backoff.delay(attempt, retry_after), backoff.down_budget_s - down))
            continue
        limiter.succeeded()
        return result


def paced_map(
    call: Callable[[T], Result],
    items: Sequence[T],
    provider: PacedProvider,
    *,
    on_done: Callable[[int], None] = lambda _n: None,
) -> list[Result]:
    """``call`` on every item (reads: safe to repeat), the provider's ``concurrency`` at a time, each
    paced by its limiter and retried by its backoff (:func:`call_with_retries`); results in the
    items' order. ``on_done(n)`` hears the running count, for progress.

    Why the provider whole: every read of a provider is paced by that provider's own limiter,
    backoff and concurrency, so a caller names the provider once, as ``effect_runner(provider=)``
    does, and cannot pair one provider's limiter with another's concurrency.
    """
    if not items:
        return []
    limiter, backoff, concurrency = provider.limiter(), provider.backoff(), provider.concurrency
    done = 0
    lock = threading.Lock()
    unsent = UnsentCount(len(items))

    def one(item: T) -> Result:
        nonlocal done
        unsent.take()
        result = call_with_retries(lambda: call(item), limiter, backoff, left=unsent.left)
        with lock:
            done += 1
            count = done
        on_done(count)
        return result

    with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(items)))) as pool:
        return list(pool.map(one, items))
