"""The idempotency ledger: atomic phases for any side effect that must happen exactly once.

The design follows Stripe's idempotency keys and Brandur Leach's "atomic phases":

1. *intent* — a row with the key, a fingerprint of the parameters and the recovery point
   ``started`` is committed before any foreign call is made;
2. the foreign call carries the same key, so the provider deduplicates a repeat;
3. *result* — recorded after the provider confirmed it (recovery point ``finished``), or
   ``review`` when the answer could not be trusted. Both are one-way: never reopened.

A key whose result is recorded is never sent again; one with only an intent is retried with the
same key. The same key with other parameters stops the step (:class:`IdempotencyKeyMismatchError`).
Claims (owner run, fence, expiry) make sure two live workers never both believe they own a key.

An intent may also name its *subject*, the thing the effect acts on when that differs from what the
key is derived from (a refund's key comes from the invoice, but the money comes off the charge).
The first key to claim a subject keeps it for good; another key naming the same subject is never
sent and comes back in :attr:`Claim.taken`, in the same transaction that commits the intents.

Within a batch, each intent also stands for an *item* (an invoice, an account): the same
transaction records the item's key and subject for the batch (``durable_batch_items``), and a
resumed step compares what it derives now with that record before it sends anything
(:meth:`Ledger.item_drift`). Code deployed between a crash and a resume that spells a key another
way would otherwise send under a key the provider has never seen, for an item already acted on.
"""

from __future__ import annotations

import functools
import hashlib
import json
import json.encoder
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

import sqlalchemy as sa

from durable_assets.errors import IdempotencyKeyMismatchError
from durable_assets.kit.accounts import DEFAULT_NAMESPACE
from durable_assets.kit.crashpoints import CrashPoint, crash_point
from durable_assets.kit.db import (
    DurableDatabase,
    batch_items,
    compiled_for,
    effect_subjects,
    idempotency,
    now,
)

STARTED = "started"
FINISHED = "finished"
REVIEW = "review"
#: A subject's holder that is being claimed in the same call (not a recovery point: never stored).
CLAIMED = "claimed"


def _result_id(result: str | None) -> str | None:
    """The provider object a recorded answer names (its ``id``), if it names one."""
    if not result:
        return None
    found = json.loads(result)
    return str(found["id"]) if isinstance(found, dict) and found.get("id") else None


def fingerprint(params: Mapping[str, Any]) -> str:
    """A stable hash of canonical parameters: same params → same fingerprint, across processes."""
    return _hash(_canonical(params))


def _json_encoder(**options: Any) -> Callable[[Any], str]:
    """``json.dumps(value, **options)``, with its encoder built once instead of on every call.

    ``json.dumps`` makes a new :class:`json.JSONEncoder` and a new C encoder per call, which cost
    twice what encoding a refund's params does (bench scenario 2: ~5.4 us a call against ~1.7 us).
    The C encoder built here is the one ``json.dumps`` builds, with the same options, so the text
    is the same byte for byte; it is made without the circular-reference check's shared ``markers``
    dict (a dict shared by threads could report a cycle that is not there): a self-containing value
    fails with RecursionError instead of ValueError. Without the C extension, the plain encoder.
    """
    plain = json.JSONEncoder(**options)
    make: Callable[..., Any] | None = vars(json.encoder).get("c_make_encoder")  # not in typeshed
    if make is None or plain.indent is not None:
        return plain.encode
    encode = make(
        None,
        plain.default,
        json.encoder.encode_basestring_ascii if plain.ensure_ascii else json.encoder.encode_basestring,
        plain.indent,
        plain.key_separator,
        plain.item_separator,
        plain.sort_keys,
        plain.skipkeys,
        plain.allow_nan,
    )
    return lambda value: "".join(encode(value, 0))


#: How params are stored and fingerprinted (canonical: sorted keys, no spaces).
_canonical: Callable[[Mapping[str, Any]], str] = _json_encoder(
    sort_keys=True, separators=(",", ":"), default=str
)
#: How a provider's answer is stored (as it always was: sorted keys, ``json.dumps``'s separators).
_result_json: Callable[[Mapping[str, Any]], str] = _json_encoder(sort_keys=True, default=str)


def _hash(canonical: str) -> str:
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class Intent:
    """One side effect we mean to cause, named by a key derived from business identity."""

    key: str
    params: Mapping[str, Any]
    #: What the effect acts on, when at most one key may ever act on it (see the module docstring).
    subject: str | None = None
    #: The business item the effect is for (an invoice and reason, an account), stable across code
    #: changes. Default: the params' fingerprint, which catches a key or subject re-spelled while
    #: the params stay the same; name the item to catch a change of the params too.
    item: str | None = None

    @functools.cached_property
    def params_json(self) -> str:
        """The params as stored in the ledger: canonical JSON, serialised once per intent (a claim
        needs it twice, for the row and its fingerprint; it is the ledger's largest CPU cost)."""
        return _canonical(self.params)

    @functools.cached_property
    def fingerprint(self) -> str:
        return _hash(self.params_json)

    @property
    def item_id(self) -> str:
        """The item as the batch's record names it (a long name by its digest: the column is 255)."""
        if self.item is None:
            return "params:" + self.fingerprint
        return self.item if len(self.item) <= _ITEM_WIDTH else "digest:" + _hash(self.item)


#: ``durable_batch_items.item``'s width.
_ITEM_WIDTH = 255


@dataclass(frozen=True)
class ItemDrift:
    """An item whose key or subject, as derived now, differs from what the batch recorded for it."""

    item: str
    recorded_key: str
    recorded_subject: str | None
    key: str
    subject: str | None
    #: The item as a person reads it: its name, or (an item named by the params' digest) its params.
    label: str = ""

    def describe(self) -> str:
        what = self.label or self.item
        changed = []
        if self.recorded_key != self.key:
            changed.append(f"key {self.recorded_key} then, {self.key} now")
        if self.recorded_subject != self.subject:
            changed.append(f"subject {self.recorded_subject} then, {self.subject} now")
        return f"item {what}: {'; '.join(changed)}"


def unambiguous_items(intents: Sequence[Intent]) -> dict[str, Intent]:
    """Intents by item, leaving out an item that two different keys stand for in one list: a
    defaulted item (equal params under two keys) says nothing about either. Two keys for one named
    item are the author's error, refused before anything is sent."""
    by_item: dict[str, Intent] = {}
    ambiguous: set[str] = set()
    for intent in intents:
        item = intent.item_id
        other = by_item.setdefault(item, intent)
        if other.key != intent.key:
            if intent.item is not None:
                raise IdempotencyKeyMismatchError(
                    f"item {intent.item!r} stands for two keys in one step ({other.key}, {intent.key}): "
                    "an item names one effect; make the item (or the key) unique"
                )
            ambiguous.add(item)
    for item in ambiguous:
        del by_item[item]
    return by_item


@dataclass(frozen=True)
class LedgerEntry:
    key: str
    params: Mapping[str, Any]
    recovery_point: str
    result: Mapping[str, Any] | None
    created_at: float


@dataclass(frozen=True)
class SubjectTaken:
    """An intent whose subject another key claimed first; it is never sent."""

    subject: str
    holder_key: str
    holder_params: Mapping[str, Any]
    #: Where the holder key stands in the ledger: ``finished`` (its answer is recorded), ``review``,
    #: ``started`` (an intent: sent or not, its answer is not recorded) or ``claimed`` (in this very
    #: claim). A note for a person must not say "already done" of a key that never got an answer.
    holder_state: str = STARTED
    #: The provider object the holder's recorded answer names, if any.
    holder_result_id: str | None = None


@dataclass
class Claim:
    """What :meth:`Ledger.claim` found: results to reuse, keys this worker now owns, keys others hold."""

    finished: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    review: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    owned: list[LedgerEntry] = field(default_factory=list)
    held_elsewhere: list[str] = field(default_factory=list)
    taken: dict[str, SubjectTaken] = field(default_factory=dict)


_c = idempotency.c
_OF_KEYS = sa.and_(
    _c.account == sa.bindparam("b_account"),
    _c.scope == sa.bindparam("b_scope"),
    _c.key.in_(sa.bindparam("b_keys", expanding=True)),
)
# The hot statements, built once: building SQLAlchemy expressions per chunk cost more CPU than
# executing them (bench scenario 2). Compiled forms are cached by the engine.
#: Claim a chunk's unfinished keys that are free, ours, held under an older fence, or expired.
_CLAIM_KEYS = (
    idempotency.update()
    .where(_OF_KEYS, _c.recovery_point == STARTED)
    .where(
        sa.or_(
            _c.claimed_by.is_(None),
            _c.claimed_by == sa.bindparam("b_owner"),
            _c.claim_fence < sa.bindparam("b_fence"),
            _c.claim_expires_at < sa.bindparam("b_t"),
        )
    )
    .values(
        claimed_by=sa.bindparam("b_owner"),
        claim_fence=sa.bindparam("b_fence"),
        claim_expires_at=sa.bindparam("b_expires"),
    )
)
_READ_CLAIMED = sa.select(
    _c.key, _c.fingerprint, _c.params, _c.recovery_point, _c.result, _c.claimed_by, _c.created_at
).where(_OF_KEYS)
_LOCK_KEYS = sa.select(_c.key).where(_OF_KEYS).order_by(_c.key).with_for_update()
#: Close one key (executed for many): only an intent is closed, never a recorded result.
_RECORD = (
    idempotency.update()
    .where(
        _c.account == sa.bindparam("a"),
        _c.scope == sa.bindparam("s"),
        _c.key == sa.bindparam("k"),
        _c.recovery_point == STARTED,
    )
    .values(
        recovery_point=sa.bindparam("p"),
        result=sa.bindparam("r"),
        updated_at=sa.bindparam("b_t"),
        claimed_by=None,
    )
)


def _execute_many(conn: sa.Connection, stmt: sa.ClauseElement, rows: Sequence[Mapping[str, Any]]) -> None:
    """``stmt`` once per row, straight through the driver's ``executemany``.

    SQLAlchemy's own executemany builds every row's parameters through the compiled statement
    (~30 us a row); the ledger writes a row per intent and per result, every value already a plain
    str, int, float or None, so the rows go to the driver as they are, in its parameter style.
    """
    sql, names, fixed = compiled_for(conn.dialect, stmt)
    full = [{**fixed, **row} for row in rows] if fixed else rows
    params: Any = full
    if names is not None:  # one C call per row builds its tuple in the statement's order
        pick = itemgetter(*names)
        params = [pick(row) for row in full] if len(names) > 1 else [(pick(row),) for row in full]
    conn.exec_driver_sql(sql, params)


class Ledger:
    """Plain-Python ledger over :class:`DurableDatabase`; the Dagster resource wraps it.

    Every key and subject lives in one provider account's namespace (``account``, see
    :mod:`durable_assets.kit.accounts`): the same key at two accounts is two entries, as at Stripe.
    """

    def __init__(
        self, db: DurableDatabase, *, claim_ttl_s: float = 120.0, account: str = DEFAULT_NAMESPACE
    ) -> None:
        self.db = db
        self.claim_ttl_s = claim_ttl_s
        self.account = account

    def for_account(self, namespace: str) -> Ledger:
        """The same ledger, reading and writing the keys of another provider account."""
        return Ledger(self.db, claim_ttl_s=self.claim_ttl_s, account=namespace)

    def claim(
        self,
        scope: str,
        intents: Sequence[Intent],
        *,
        owner: str,
        fence: int = 0,
        batch_id: str | None = None,
        items: Mapping[str, Intent] | None = None,
    ) -> Claim:
        """Commit intents for new keys and claim the unfinished ones, in one transaction.

        A claim is taken when the key is free, already ours, held under an older fence (its
        holder was superseded by a resume) or expired. Raises before committing anything when a
        key already stands for other parameters. With ``batch_id``, the intents' ``items`` (by
        item, from :func:`unambiguous_items`; default: all of them) are recorded for the batch.
        """
        if not intents:
            return Claim()
        if len({i.key for i in intents}) != len(intents):
            raise IdempotencyKeyMismatchError(f"duplicate idempotency keys in one {scope!r} chunk")
        with self.db.transaction() as conn:
            # Claims expire on the database's clock: a worker whose own clock runs ahead must not
            # see another's live claim as expired. Read before the keys' locks, it errs toward live.
            t = self.db.clock(conn)
            taken = self._claim_subjects(conn, scope, intents, t)
            claim = self._claim_keys(conn, scope, [i for i in intents if i.key not in taken], owner, fence, t)
            if batch_id is not None:
                self._record_items(conn, batch_id, scope, intents, items, t)
        crash_point(CrashPoint.AFTER_INTENT_COMMIT)
        claim.taken = taken
        return claim

    def _record_items(
        self,
        conn: sa.Connection,
        batch_id: str,
        scope: str,
        intents: Sequence[Intent],
        items: Mapping[str, Intent] | None,
        t: float,
    ) -> None:
        """Each item's key and subject for the batch, the first time the batch claims it."""
        chosen = unambiguous_items(intents) if items is None else items
        rows = [
            {
                "batch_id": batch_id,
                "scope": scope,
                "item": intent.item_id,
                "key": intent.key,
                "subject": intent.subject,
                "created_at": t,
            }
            for intent in intents
            if chosen.get(intent.item_id) is intent
        ]
        if rows:
            # an item recorded before keeps what it first recorded
            _execute_many(conn, self.db.insert_ignore(batch_items), rows)

    def item_drift(self, batch_id: str, scope: str, items: Mapping[str, Intent]) -> list[ItemDrift]:
        """Items (by :attr:`Intent.item_id`) whose key or subject differs from what the batch recorded
        for them: one read of the batch's record for the scope, before a resumed step sends anything."""
        if not items:
            return []
        bc = batch_items.c
        with self.db.read() as conn:
            rows = conn.execute(
                sa.select(bc.item, bc.key, bc.subject).where(bc.batch_id == batch_id, bc.scope == scope)
            ).all()
        drift = []
        for row in rows:
            intent = items.get(row.item)
            if intent is not None and (intent.key != row.key or intent.subject != row.subject):
                label = intent.item if intent.item is not None else intent.params_json
                drift.append(ItemDrift(row.item, row.key, row.subject, intent.key, intent.subject, label))
        return sorted(drift, key=lambda d: d.recorded_key)

    def _claim_subjects(
        self, conn: sa.Connection, scope: str, intents: Sequence[Intent], t: float
    ) -> dict[str, SubjectTaken]:
        """Claim every free subject for its intent's key; report intents whose subject is another key's.

        Within one call the smallest key wins a shared subject, so the outcome does not depend on
        the order rows arrived in.
        """
        wanted: dict[str, str] = {}
        for i in sorted(intents, key=lambda i: i.key):
            if i.subject is not None:
                wanted.setdefault(i.subject, i.key)
        if not wanted:
            return {}
        sc = effect_subjects.c
        rows = [
            {"account": self.account, "scope": scope, "subject": subject, "key": key, "created_at": t}
            for subject, key in sorted(wanted.items())
        ]
        conn.execute(self.db.insert_ignore(effect_subjects), rows)
        found = conn.execute(
            sa.select(sc.subject, sc.key).where(
                sc.account == self.account, sc.scope == scope, sc.subject.in_(sorted(wanted))
            )
        )
        holders: dict[str, str] = {row.subject: row.key for row in found}
        losers = {
            i.key: (i.subject, holders[i.subject])
            for i in intents
            if i.subject is not None and holders[i.subject] != i.key
        }
        if not losers:
            return {}
        c = idempotency.c
        holder_keys = sorted({holder for _sub, holder in losers.values()})
        stored = conn.execute(
            sa.select(c.key, c.params, c.recovery_point, c.result).where(
                c.account == self.account, c.scope == scope, c.key.in_(holder_keys)
            )
        ).all()
        params: dict[str, Mapping[str, Any]] = {row.key: json.loads(row.params) for row in stored}
        states = {row.key: (row.recovery_point, _result_id(row.result)) for row in stored}
        in_this_call = {i.key: i.params for i in intents if i.key in holder_keys}
        params.update(in_this_call)
        states.update({key: (CLAIMED, None) for key in in_this_call})
        return {
            key: SubjectTaken(sub, holder, params.get(holder, {}), *states.get(holder, (STARTED, None)))
            for key, (sub, holder) in losers.items()
        }

    def _claim_keys(
        self, conn: sa.Connection, scope: str, intents: Sequence[Intent], owner: str, fence: int, t: float
    ) -> Claim:
        if not intents:
            return Claim()
        by_key = {i.key: i for i in intents}
        keys = sorted(by_key)
        rows = [
            {
                "account": self.account,
                "scope": scope,
                "key": key,
                "fingerprint": by_key[key].fingerprint,
                "recovery_point": STARTED,
                "params": by_key[key].params_json,
                "owner_run": owner,
                "claimed_by": None,
                "claim_fence": 0,
                "claim_expires_at": 0.0,
                "created_at": t,
                "updated_at": t,
            }
            for key in keys
        ]
        where = {"b_account": self.account, "b_scope": scope, "b_keys": keys}
        _execute_many(conn, self.db.insert_ignore(idempotency), rows)  # a key already there keeps its row
        self.db.lock_rows_in_order(conn, _LOCK_KEYS, where)  # two workers' overlapping chunks
        conn.execute(
            _CLAIM_KEYS,
            {**where, "b_owner": owner, "b_fence": fence, "b_t": t, "b_expires": t + self.claim_ttl_s},
        )
        # Rows unpacked by position (the columns of _READ_CLAIMED), fetched at once: attribute
        # lookups and a fetch per row were most of this loop's cost, run for every key of a chunk.
        found = conn.execute(_READ_CLAIMED, where).all()
        for key, fp, params, _point, _result, _by, _at in found:
            if fp != by_key[key].fingerprint:
                raise IdempotencyKeyMismatchError(
                    f"idempotency key {key!r} ({scope}) was first used with other parameters "
                    f"({params}); refusing to send "
                    f"{json.dumps(by_key[key].params, default=str)}. "
                    "Fix the input so the business identity is unique, or review the earlier request."
                )
        claim = Claim()
        for key, _fp, _params, point, result, claimed_by, created_at in found:
            if point == FINISHED:
                claim.finished[key] = json.loads(result)
            elif point == REVIEW:
                claim.review[key] = json.loads(result or "{}")
            elif claimed_by == owner:
                # The same fingerprint: the intent's own params are the stored ones (not parsed again).
                claim.owned.append(LedgerEntry(key, by_key[key].params, point, None, created_at))
            else:
                claim.held_elsewhere.append(key)
        return claim

    def record(
        self,
        scope: str,
        *,
        finished: Mapping[str, Mapping[str, Any]] | None = None,
        review: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        """Close keys in ONE transaction: ``finished`` with the provider's confirmed result, ``review``
        parked for a person (never retried automatically). One commit for a whole group of answers
        is what lets the effects runner record often (every few tens of milliseconds) and cheaply."""
        finished, review = finished or {}, review or {}
        if not finished and not review:
            return
        t = now()
        rows = [
            {
                "a": self.account,
                "s": scope,
                "k": k,
                "p": point,
                "r": _result_json(v),
                "b_t": t,
            }
            for point, results in ((FINISHED, finished), (REVIEW, review))
            for k, v in results.items()
        ]
        with self.db.transaction() as conn:
            _execute_many(conn, _RECORD, rows)
        if finished:
            crash_point(CrashPoint.AFTER_RESULT_COMMIT)
        if review:
            crash_point(CrashPoint.AFTER_REVIEW_RECORD)

    def record_results(self, scope: str, results: Mapping[str, Mapping[str, Any]]) -> None:
        """Move keys to ``finished`` with the provider's confirmed result (one commit for many)."""
        self.record(scope, finished=results)

    def record_review(self, scope: str, results: Mapping[str, Mapping[str, Any]]) -> None:
        """Park keys whose provider answer could not be trusted; they are never retried automatically."""
        self.record(scope, review=results)

    def entries(self, scope: str, keys: Iterable[str] | None = None) -> list[LedgerEntry]:
        c = idempotency.c
        query = sa.select(idempotency).where(c.account == self.account, c.scope == scope)
        if keys is not None:
            query = query.where(c.key.in_(list(keys)))
        with self.db.read() as conn:
            rows = conn.execute(query).all()
        return [
            LedgerEntry(
                key=r.key,
                params=json.loads(r.params),
                recovery_point=r.recovery_point,
                result=json.loads(r.result) if r.result else None,
                created_at=r.created_at,
            )
            for r in rows
        ]

    def finished_by_runs(self, run_ids: Sequence[str]) -> dict[str, int]:
        """Side effects confirmed by these runs, per scope: what a batch that stopped short did (its
        unfinished step recorded no metadata, but every effect it confirmed is here)."""
        c = idempotency.c
        query = (
            sa.select(c.scope, sa.func.count())
            .where(c.owner_run.in_(list(run_ids)), c.recovery_point == FINISHED)
            .group_by(c.scope)
        )
        with self.db.read() as conn:
            return {str(scope): int(n) for scope, n in conn.execute(query).all()}
