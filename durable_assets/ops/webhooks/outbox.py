"""Signed webhooks (Standard Webhooks v1) delivered at least once through a durable outbox.

Why an outbox: the event must survive the process that noticed it. A row per (message, endpoint)
commits before any request; a deliverer *claims* a row (so two deliverers never send it at the same
time), POSTs, then records the answer. A crash between the POST and the record leaves the row
pending with a claim that lapses; the next flush re-sends it with the *same* ``webhook-id``, which
is what Standard Webhooks receivers deduplicate on. Nothing is lost, and a duplicate is recognisable.

Why the message id is derived, not random: two enqueuers (the CLI and a Dagster sensor) that see
the same event must agree on its id, so the insert-ignore makes the second enqueue a no-op.

Retries: exponential backoff with full jitter on connection failures, 408, 429 and 5xx, never
sooner than ``Retry-After``; 410 Gone stops for good, and other answers (3xx, 4xx) are given up at
once with the reason recorded, since repeating the same bytes cannot change them.

Nothing here knows about refunds or batches' meaning; ``batch_id`` and ``run_id`` are opaque labels
that let retention delete our rows with the runs they belong to.
"""

from __future__ import annotations

import base64
import binascii
import email.utils
import hashlib
import hmac
import json
import random
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import sqlalchemy as sa

from durable_assets.errors import UsageError, WebhookConfigError, WebhookVerificationError
from durable_assets.kit.runtime import CrashPoint, DurableDatabase, crash_point, from_row, now, webhook_outbox
from durable_assets.ops.settings import WebhookVariables

SECRET_PREFIX = "whsec_"
#: Standard Webhooks' recommended replay window for receivers.
TOLERANCE_S = 300
PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"


# --- signing and verification -------------------------------------------------------------------


def decode_secret(secret: str | bytes) -> bytes:
    """The HMAC key: ``whsec_<base64>`` decoded (raw bytes are taken as they are)."""
    if isinstance(secret, bytes):
        key = secret
    else:
        text = secret.strip()
        text = text[len(SECRET_PREFIX) :] if text.startswith(SECRET_PREFIX) else text
        try:
            key = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise WebhookConfigError(
                "DURABLE_WEBHOOK_SECRET must be 'whsec_' followed by base64, e.g. "
                "whsec_$(openssl rand -base64 32)"
            ) from exc
    if len(key) < 16:
        raise WebhookConfigError(
            "DURABLE_WEBHOOK_SECRET is too short: use at least 16 random bytes (24+ is usual)"
        )
    return key


def sign(key: bytes, webhook_id: str, timestamp: int, body: bytes) -> str:
    """``v1,<base64 HMAC-SHA256 of "id.timestamp.body">`` (the ``webhook-signature`` header)."""
    digest = hmac.new(key, f"{webhook_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def verify(
    secret: str | bytes,
    headers: Mapping[str, str],
    body: bytes,
    *,
    tolerance_s: float = TOLERANCE_S,
    at: float | None = None,
) -> Any:
    """For receivers: check a delivery and return its parsed JSON body, or raise.

    Raises :class:`WebhookVerificationError` on missing headers, a timestamp outside the replay
    window, or no matching ``v1`` signature (compared in constant time). Deduplicate on
    ``webhook-id`` after this succeeds: the same event is re-sent with the same id after a crash.
    """
    lower = {k.lower(): v for k, v in headers.items()}
    msg_id, stamp, signatures = (
        lower.get(h) for h in ("webhook-id", "webhook-timestamp", "webhook-signature")
    )
    if not (msg_id and stamp and signatures):
        raise WebhookVerificationError("missing webhook-id, webhook-timestamp or webhook-signature header")
    try:
        ts = int(stamp)
    except ValueError as exc:
        raise WebhookVerificationError(f"webhook-timestamp {stamp!r} is not an integer") from exc
    if abs((time.time() if at is None else at) - ts) > tolerance_s:
        raise WebhookVerificationError(
            "webhook-timestamp outside the tolerance window (replayed or clock skew)"
        )
    expected = sign(decode_secret(secret), msg_id, ts, body).split(",", 1)[1].encode()
    for candidate in signatures.split():
        version, _, value = candidate.partition(",")
        if version == "v1" and hmac.compare_digest(value.encode(), expected):
            return json.loads(body)
    raise WebhookVerificationError("no webhook-signature matches the body")


def message_id(*parts: str) -> str:
    """A deterministic ``webhook-id`` from the event's identity (same event → same id everywhere)."""
    return "msg_" + hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:40]


# --- configuration ------------------------------------------------------------------------------


@dataclass(frozen=True)
class WebhookSettings:
    """The webhook configuration checked as a whole: URLs, the decoded key, timing. Its defaults
    are :class:`~durable_assets.ops.settings.WebhookVariables`' (declared once, there)."""

    urls: tuple[str, ...]
    key: bytes = field(repr=False)
    timeout_s: float
    backoff_base_s: float
    backoff_cap_s: float
    #: Attempts per (message, endpoint) before giving up: with the defaults, about 6 h of retries.
    max_attempts: int

    @property
    def claim_ttl_s(self) -> float:
        """Long enough to cover one POST and its record; a crashed deliverer's claim lapses after it."""
        return 2 * self.timeout_s + 1

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WebhookSettings | None:
        """None when ``DURABLE_WEBHOOK_URLS`` is unset; raises when set but unusable."""
        try:
            s = WebhookVariables.current() if env is None else WebhookVariables.from_env(env)
        except UsageError as exc:  # a malformed DURABLE_WEBHOOK_* number is a webhook configuration error
            raise WebhookConfigError(str(exc)) from None
        if not s.urls:
            return None
        for url in s.urls:
            if not url.startswith(("http://", "https://")) or len(url) > 2000:
                raise WebhookConfigError(f"DURABLE_WEBHOOK_URLS: {url!r} is not an http(s) URL")
        if not s.secret:
            raise WebhookConfigError(
                "DURABLE_WEBHOOK_URLS is set but DURABLE_WEBHOOK_SECRET is not; nothing is sent unsigned"
            )
        return cls(
            urls=tuple(dict.fromkeys(s.urls)),
            key=decode_secret(s.secret),
            timeout_s=s.timeout_s,
            backoff_base_s=s.backoff_base_s,
            backoff_cap_s=s.backoff_cap_s,
            max_attempts=s.max_attempts,
        )

    def retry_delay(self, attempts: int, retry_after: float | None) -> float:
        """Full jitter after ``attempts`` failures, never shorter than the receiver's Retry-After."""
        jittered = random.uniform(0, min(self.backoff_cap_s, self.backoff_base_s * 2**attempts))
        return max(jittered, min(retry_after or 0.0, self.backoff_cap_s))


# --- the outbox ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class OutboxRow:
    webhook_id: str
    url: str
    batch_id: str
    run_id: str | None
    event_type: str
    body: str
    state: str
    attempts: int
    next_attempt_at: float
    claimed_by: str | None
    claim_expires_at: float
    last_status: int | None
    last_error: str | None

    def due_at(self) -> float:
        """When this row may next be attempted: its backoff, and any other deliverer's claim."""
        return max(self.next_attempt_at, self.claim_expires_at if self.claimed_by else 0.0)


class Outbox:
    """The durable queue of deliveries: idempotent enqueue, claims, one-way outcomes."""

    def __init__(self, db: DurableDatabase) -> None:
        self.db = db

    def enqueue(
        self,
        *,
        batch_id: str,
        run_id: str | None,
        event_type: str,
        webhook_id: str,
        body: str,
        urls: Iterable[str],
    ) -> int:
        """One row per URL, skipped when (webhook_id, url) exists. Returns how many were new."""
        t = now()
        rows = [
            {
                "webhook_id": webhook_id,
                "url": url,
                "batch_id": batch_id,
                "run_id": run_id,
                "event_type": event_type,
                "body": body,
                "state": PENDING,
                "attempts": 0,
                "next_attempt_at": t,
                "claimed_by": None,
                "claim_expires_at": 0.0,
                "created_at": t,
                "updated_at": t,
            }
            for url in urls
        ]
        if not rows:
            return 0
        with self.db.transaction() as conn:
            return int(conn.execute(self.db.insert_ignore(webhook_outbox), rows).rowcount or 0)

    def rows(
        self, *, batch_id: str | None = None, state: str | None = None, limit: int = 1000
    ) -> list[OutboxRow]:
        c = webhook_outbox.c
        query = sa.select(webhook_outbox).order_by(c.created_at, c.webhook_id, c.url).limit(limit)
        if batch_id is not None:
            query = query.where(c.batch_id == batch_id)
        if state is not None:
            query = query.where(c.state == state)
        with self.db.read() as conn:
            return [_to_row(r) for r in conn.execute(query).all()]

    def claim(self, row: OutboxRow, ttl_s: float) -> str | None:
        """Compare-and-set claim: a token when this deliverer may send the row now, else None."""
        t = now()
        token = uuid.uuid4().hex
        c = webhook_outbox.c
        with self.db.transaction() as conn:
            updated = conn.execute(
                webhook_outbox.update()
                .where(c.webhook_id == row.webhook_id, c.url == row.url, c.state == PENDING)
                .where(c.next_attempt_at <= t)
                .where(sa.or_(c.claimed_by.is_(None), c.claim_expires_at <= t))
                .values(claimed_by=token, claim_expires_at=t + ttl_s, updated_at=t)
            ).rowcount
        return token if updated == 1 else None

    def record(
        self,
        row: OutboxRow,
        token: str,
        *,
        state: str,
        status: int | None,
        error: str | None,
        next_attempt_at: float | None = None,
    ) -> bool:
        """Record one attempt under our claim; False when the claim was lost to another deliverer.

        A success is recorded even then (good news only ever moves a row forward); a failure
        under a lost claim is left to the deliverer that holds it.
        """
        t = now()
        c = webhook_outbox.c
        values: dict[str, Any] = {
            "state": state,
            "attempts": c.attempts + 1,
            "claimed_by": None,
            "claim_expires_at": 0.0,
            "last_status": status,
            "last_error": error,
            "updated_at": t,
        }
        if state == DELIVERED:
            values["delivered_at"] = t
        if next_attempt_at is not None:
            values["next_attempt_at"] = next_attempt_at
        mine = sa.and_(c.webhook_id == row.webhook_id, c.url == row.url, c.state == PENDING)
        with self.db.transaction() as conn:
            updated = conn.execute(
                webhook_outbox.update().where(mine, c.claimed_by == token).values(**values)
            )
            if updated.rowcount == 0 and state == DELIVERED:
                conn.execute(webhook_outbox.update().where(mine).values(**values))
        return updated.rowcount == 1

    def stats(self) -> dict[str, int]:
        """Rows by state plus the total attempts made (for metrics)."""
        c = webhook_outbox.c
        with self.db.read() as conn:
            found = conn.execute(
                sa.select(c.state, sa.func.count(), sa.func.coalesce(sa.func.sum(c.attempts), 0)).group_by(
                    c.state
                )
            ).all()
        out = {PENDING: 0, DELIVERED: 0, FAILED: 0, "attempts": 0}
        for state, count, attempts in found:
            out[str(state)] = int(count)
            out["attempts"] += int(attempts)
        return out


def _to_row(r: sa.Row[Any]) -> OutboxRow:
    return from_row(OutboxRow, r, attempts=int, next_attempt_at=float, claim_expires_at=float)


# --- delivery -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """What one POST got: an HTTP status, or None with the connection error."""

    status: int | None
    error: str | None = None
    retry_after: float | None = None


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect would turn our POST into a GET (or re-send it elsewhere): treat it as an answer."""

    def redirect_request(self, *_args: Any, **_kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


def post(url: str, body: bytes, headers: Mapping[str, str], timeout_s: float) -> Answer:
    request = urllib.request.Request(url, data=body, headers=dict(headers), method="POST")
    try:
        with _OPENER.open(request, timeout=timeout_s) as response:
            response.read(65536)
            return Answer(int(response.status))
    except urllib.error.HTTPError as exc:
        with exc:
            return Answer(
                int(exc.code), f"HTTP {exc.code}", parse_retry_after(exc.headers.get("Retry-After"))
            )
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return Answer(None, f"connection failed: {reason}")


def parse_retry_after(value: str | None) -> float | None:
    """``Retry-After`` as seconds from now: delta-seconds or an HTTP-date (RFC 9110)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


@dataclass
class FlushReport:
    """What a flush did, and what it left for later (with why)."""

    attempts: int = 0
    delivered: list[OutboxRow] = field(default_factory=list)
    failed: list[tuple[OutboxRow, str]] = field(default_factory=list)
    pending: list[OutboxRow] = field(default_factory=list)

    def summary(self) -> str:
        parts = [f"{len(self.delivered)} delivered"]
        if self.failed:
            parts.append(f"{len(self.failed)} given up")
        if self.pending:
            parts.append(f"{len(self.pending)} left pending")
        return ", ".join(parts) + f" ({self.attempts} attempts)"


#: Decides, just before sending, whether a row still describes the truth; a reason not to send, or None.
Check = Callable[[OutboxRow], str | None]
Sender = Callable[[str, bytes, Mapping[str, str], float], Answer]


@dataclass(eq=False)
class Deliverer:
    """Sends due outbox rows; any number of deliverers may run at once (claims keep them apart)."""

    outbox: Outbox
    settings: WebhookSettings
    _: KW_ONLY
    check: Check | None = None
    send: Sender = post
    concurrency: int = 8

    def flush(self, *, batch_id: str | None = None, budget_s: float = 0.0) -> FlushReport:
        """Deliver pending rows (of one batch, or all) until none is left or ``budget_s`` runs out.

        ``budget_s=0`` makes one pass over the rows due now and never waits; a positive budget
        also waits for backoffs and other deliverers' lapsed claims that fall inside it. Whatever
        is still pending at the end stays in the outbox for a later flush.
        """
        report = FlushReport()
        deadline = time.monotonic() + budget_s
        while True:
            rows = self.outbox.rows(batch_id=batch_id, state=PENDING)
            t = now()
            ready = [r for r in rows if r.due_at() <= t]
            out_of_time = budget_s <= 0 or time.monotonic() >= deadline
            if ready and not (out_of_time and report.attempts):
                workers = max(1, min(self.concurrency, len(ready)))
                with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="webhook") as pool:
                    for outcome in pool.map(self._attempt, ready):
                        self._tally(report, *outcome)
                if budget_s > 0:
                    continue
                rows = self.outbox.rows(batch_id=batch_id, state=PENDING)
            if not rows:
                break
            wait = min(r.due_at() for r in rows) - now()
            if budget_s <= 0 or time.monotonic() + max(wait, 0.0) > deadline:
                report.pending = rows
                break
            # The next backoff or claim expiry falls inside our budget. Re-read at least twice a
            # second: another deliverer holding a claim usually records its answer long before then.
            time.sleep(min(max(wait, 0.0), 0.5))
        return report

    @staticmethod
    def _tally(report: FlushReport, row: OutboxRow, state: str | None, why: str | None) -> None:
        if state is None:
            return
        report.attempts += 1
        if state == DELIVERED:
            report.delivered.append(row)
        elif state == FAILED:
            report.failed.append((row, why or ""))

    def _attempt(self, row: OutboxRow) -> tuple[OutboxRow, str | None, str | None]:
        """Claim, (re-)check, POST, record. Returns the row's new state, or None if not attempted."""
        token = self.outbox.claim(row, self.settings.claim_ttl_s)
        if token is None:
            return row, None, None  # another deliverer has it, or it is not due after all
        crash_point(CrashPoint.WEBHOOK_CLAIMED)
        reason = self.check(row) if self.check else None
        if reason:
            self.outbox.record(row, token, state=FAILED, status=None, error=f"not sent: {reason}")
            return row, FAILED, reason
        body = row.body.encode()
        stamp = int(time.time())
        headers = {
            "content-type": "application/json",
            "user-agent": "durable-assets-webhooks/1",
            "webhook-id": row.webhook_id,
            "webhook-timestamp": str(stamp),
            "webhook-signature": sign(self.settings.key, row.webhook_id, stamp, body),
        }
        answer = self.send(row.url, body, headers, self.settings.timeout_s)
        crash_point(CrashPoint.WEBHOOK_SENT)
        state, why, next_at = self._judge(row, answer)
        self.outbox.record(row, token, state=state, status=answer.status, error=why, next_attempt_at=next_at)
        crash_point(CrashPoint.WEBHOOK_RECORDED)
        return row, state, why

    def _judge(self, row: OutboxRow, answer: Answer) -> tuple[str, str | None, float | None]:
        status = answer.status
        if status is not None and 200 <= status < 300:
            return DELIVERED, None, None
        if status == 410:
            return FAILED, "410 Gone: the endpoint asked not to receive more; not retried", None
        retryable = status is None or status in (408, 429) or status >= 500
        what = answer.error or f"HTTP {status}"
        if not retryable:
            return FAILED, f"{what}: not retried (only connection failures, 408, 429 and 5xx are)", None
        attempts = row.attempts + 1
        if attempts >= self.settings.max_attempts:
            return FAILED, f"gave up after {attempts} attempts; last: {what}", None
        return PENDING, what, now() + self.settings.retry_delay(attempts, answer.retry_after)


def describe_pending(rows: Sequence[OutboxRow]) -> str:
    """One line per row left pending: where, how often tried, why, and when next."""
    t = now()
    return "; ".join(
        f"{r.url} ({r.attempts} attempts, last: {r.last_error or 'not yet sent'}, next in "
        f"{max(r.due_at() - t, 0):.0f} s)"
        for r in rows
    )
