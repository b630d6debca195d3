"""Stripe's charge, refund, customer and idempotency semantics, durable in one SQLite file.

This is the single source of truth for both provider fronts: the embedded provider
(:class:`~durable_assets.payments.gateway.EmbeddedGateway`) and the HTTP simulator
(``job provider serve``, in :mod:`durable_assets_testing.simulator`, which imports this module;
nothing here imports it). Keeping one implementation means a
pipeline behaves identically whichever front it talks to, and a test against one front is
evidence about the other.

Concurrency model: every mutation runs in one ``BEGIN IMMEDIATE`` transaction, which takes
SQLite's write lock up front. The idempotency check, the refund cap check and the insert
therefore happen atomically even when several *processes* share the file, so the same key
can never create two refunds and a charge can never be refunded past its amount. Within a
process a lock serialises the single connection, which avoids busy-waiting between threads.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import sqlite3
import string
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

from durable_assets.errors import UsageError
from durable_assets.kit import enable_wal
from durable_assets.payments.group_write import GroupWriter, locked_transaction
from durable_assets.payments.migrations import STORE_SCHEMA
from durable_assets.payments.params import (
    MAX_AMOUNT,
    MAX_BALANCE_DESCRIPTION_LENGTH,
    MAX_CUSTOMER_DESCRIPTION_LENGTH,
    MAX_NAME_LENGTH,
    METADATA_MAX_KEYS,
    JsonObject,
    StripeApiError,
    check_amount,
    check_balance_amount,
    check_currency,
    check_email,
    check_id,
    check_idempotency_key,
    check_metadata,
    check_metadata_changes,
    check_optional_str,
    check_reason,
    check_text,
    invalid_request,
)

_T = TypeVar("_T")

MAX_LIST_LIMIT = 100
#: How many refunds a charge object embeds in its ``refunds`` list (Stripe's default page size).
EMBEDDED_REFUNDS = 10

_CHARGES = "charges"
_REFUNDS = "refunds"
_CUSTOMERS = "customers"
_CUSTOMER_UPDATES = "customer_updates"
_BALANCE_TRANSACTIONS = "customer_balance_transactions"
#: Each endpoint's path, for a key stored before paths were (revision 0004 could not recover them all).
_ENDPOINT_PATHS = {
    _CHARGES: "/v1/charges",
    _REFUNDS: "/v1/refunds",
    _CUSTOMERS: "/v1/customers",
    _CUSTOMER_UPDATES: "/v1/customers/{customer}",
    _BALANCE_TRANSACTIONS: "/v1/customers/{customer}/balance_transactions",
}
#: Endpoints whose replays count in ``idempotent_replays``: the effects a pipeline applies once.
#: Charges are left out because the synthetic input creates them, and counting them would make
#: the counter mean "any replay" instead of "an effect the caller tried to apply again".
_COUNTED_REPLAYS = frozenset({_REFUNDS, _CUSTOMERS, _BALANCE_TRANSACTIONS})
_BUSY_TIMEOUT_MS = 30_000
_ID_ALPHABET = string.ascii_letters + string.digits
#: Enough random bits for 24 base-62 digits, less biased than 2**-10 towards any.
_ID_BITS = 154

_STAT_NAMES = (
    "refund_requests",
    "refunds_created",
    "idempotent_replays",
    "customers_created",
    "balance_transactions_created",
    "customers_deleted",
)


class Unchanged(Enum):
    """A field an update leaves as it is (absent from the request), apart from ``None`` (unset it)."""

    UNCHANGED = "unchanged"


UNCHANGED = Unchanged.UNCHANGED


@dataclass(frozen=True)
class StoreResult:
    """A successful answer plus whether it came from a stored idempotency key: every creation
    answers one, so the embedded gateway reads ``.body`` and the HTTP front also the replay flag
    (Stripe's ``Idempotent-Replayed`` header) from the same method."""

    body: JsonObject
    replayed: bool = False


@dataclass(frozen=True)
class _Outcome:
    """What a keyed request produced; stored verbatim so a replay is byte-for-byte the same."""

    http_status: int
    body: JsonObject
    replayed: bool = False

    def unwrap(self) -> StoreResult:
        if self.http_status >= 400:
            raise StripeApiError.from_body(self.http_status, self.body, replayed=self.replayed)
        return StoreResult(self.body, self.replayed)


class PaymentStore:
    """Charges, refunds, customers, balance transactions, idempotency keys and counters in one
    SQLite file (WAL), which is one provider account (:attr:`account_id`).

    Safe to share between threads of a process and between processes opening the same path.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._conn = _connect(path)
        self._writer = GroupWriter(self._transaction)
        self._migrate()

    # --- lifecycle -------------------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> PaymentStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- charges ---------------------------------------------------------------------------------

    def create_charge(
        self,
        *,
        amount: int,
        currency: str,
        customer: str | None = None,
        description: str | None = None,
        metadata: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
    ) -> StoreResult:
        """Creates a succeeded charge; the simulator has no cards, so nothing can decline."""
        params = {
            "amount": check_amount(amount),
            "currency": check_currency(currency),
            "customer": check_optional_str(customer, "customer"),
            "description": check_optional_str(description, "description"),
            "metadata": check_metadata(metadata),
        }
        return self._idempotent(
            _CHARGES, "/v1/charges", idempotency_key, params, lambda conn: _insert_charge(conn, params)
        )

    # --- refunds ---------------------------------------------------------------------------------

    def record_refund_request(self) -> None:
        """Counts a received ``POST /v1/refunds`` before any fault or validation can answer it.

        Both fronts call this, so ``refund_requests`` means the same thing whichever is used.
        """
        self._write(lambda conn: _bump(conn, "refund_requests"))

    def create_refund(
        self,
        *,
        charge: str,
        amount: int | None = None,
        reason: str | None = None,
        metadata: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
    ) -> StoreResult:
        """Refunds ``amount`` (default: everything still refundable) of ``charge``."""
        params = {
            "charge": check_id(charge, "charge"),
            "amount": None if amount is None else check_amount(amount),
            "reason": check_reason(reason),
            "metadata": check_metadata(metadata),
        }
        return self._idempotent(
            _REFUNDS, "/v1/refunds", idempotency_key, params, lambda conn: _insert_refund(conn, params)
        )

    def retrieve_charge(self, charge_id: str) -> JsonObject:
        """The charge as it is now (refunded amounts and its newest refunds included)."""
        with self._read() as conn:
            row = conn.execute(f"{_CHARGE_SELECT} WHERE id = ?", (charge_id,)).fetchone()
            if row is None:
                raise StripeApiError(
                    404, "invalid_request_error", "resource_missing", f"No such charge: '{charge_id}'", "id"
                )
            return _charge_body(conn, row)

    def list_charges(
        self,
        *,
        limit: int = 10,
        starting_after: str | None = None,
        ending_before: str | None = None,
        customer: str | None = None,
    ) -> JsonObject:
        """Newest first, paginated like :meth:`list_refunds`; ``customer`` keeps that customer's
        charges (a charge's customer is any id here, so an unknown one is an empty list, not a 404)."""
        _check_page(limit, starting_after, ending_before)
        with self._read() as conn:
            rows, has_more = _paginate(
                conn,
                _CHARGE_SELECT,
                "(?1 IS NULL OR customer = ?1)",
                (customer,),
                _Cursor("charges", "charge", starting_after, ending_before),
                limit,
            )
            return _list_body([_charge_body(conn, row) for row in rows], has_more, "/v1/charges")

    def retrieve_refund(self, refund_id: str) -> JsonObject:
        with self._read() as conn:
            row = conn.execute(f"{_REFUND_SELECT} WHERE id = ?", (refund_id,)).fetchone()
        if row is None:
            raise StripeApiError(
                404, "invalid_request_error", "resource_missing", f"No such refund: '{refund_id}'", "id"
            )
        return _refund_body(row)

    def list_refunds(
        self,
        *,
        limit: int = 10,
        starting_after: str | None = None,
        ending_before: str | None = None,
        charge: str | None = None,
    ) -> JsonObject:
        """Newest first, cursor-paginated like Stripe.

        ``starting_after=X`` is the page of older refunds right after X; ``ending_before=X`` the
        page of newer ones right before it, still newest first, with ``has_more`` telling whether
        even newer ones exist (so a client pages backwards until it is false).
        """
        _check_page(limit, starting_after, ending_before)
        with self._read() as conn:
            if charge is not None:
                _require_charge(conn, charge, param="charge")
            rows, has_more = _paginate(
                conn,
                _REFUND_SELECT,
                "(?1 IS NULL OR charge = ?1)",
                (charge,),
                _Cursor("refunds", "refund", starting_after, ending_before),
                limit,
            )
        return _list_body([_refund_body(row) for row in rows], has_more, "/v1/refunds")

    # --- customers and their balances -------------------------------------------------------------

    def create_customer(
        self,
        *,
        email: str | None = None,
        name: str | None = None,
        metadata: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
    ) -> StoreResult:
        """A customer with a zero balance and no currency yet (the first balance transaction sets it)."""
        params = {
            "email": check_email(email),
            "name": check_text(name, "name", MAX_NAME_LENGTH),
            "metadata": check_metadata(metadata),
        }
        return self._idempotent(
            _CUSTOMERS, "/v1/customers", idempotency_key, params, lambda conn: _insert_customer(conn, params)
        )

    def retrieve_customer(self, customer_id: str) -> JsonObject:
        """The customer, or for a deleted one Stripe's ``{"id", "object", "deleted": true}``."""
        with self._read() as conn:
            row = conn.execute(f"{_CUSTOMER_SELECT} WHERE id = ?", (customer_id,)).fetchone()
        if row is not None and row[-1]:
            return _deleted_customer_body(customer_id)
        if row is None:
            raise _no_such_customer(customer_id, "id")
        return _customer_body(tuple(row))

    def update_customer(
        self,
        customer_id: str,
        *,
        email: str | Unchanged | None = UNCHANGED,
        name: str | Unchanged | None = UNCHANGED,
        description: str | Unchanged | None = UNCHANGED,
        metadata: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
    ) -> StoreResult:
        """Stripe's customer update: only the fields given change; ``None`` unsets one.

        ``metadata`` is merged into the customer's: a key with an empty value is removed, and an
        empty mapping removes every key (Stripe's ``metadata=``). The merged metadata must stay
        within Stripe's limits. A deleted customer is a 404, as at Stripe.
        """
        params: JsonObject = {"customer": check_id(customer_id, "id")}
        if email is not UNCHANGED:
            params["email"] = check_email(email)
        if name is not UNCHANGED:
            params["name"] = check_text(name, "name", MAX_NAME_LENGTH)
        if description is not UNCHANGED:
            params["description"] = check_text(description, "description", MAX_CUSTOMER_DESCRIPTION_LENGTH)
        if metadata is not None:
            params["metadata"] = check_metadata_changes(metadata)
        return self._idempotent(
            _CUSTOMER_UPDATES,
            f"/v1/customers/{customer_id}",
            idempotency_key,
            params,
            lambda conn: _update_customer(conn, params),
        )

    def list_customers(
        self,
        *,
        limit: int = 10,
        starting_after: str | None = None,
        ending_before: str | None = None,
        email: str | None = None,
    ) -> JsonObject:
        """Newest first, paginated like :meth:`list_refunds`; ``email`` is Stripe's exact,
        case-sensitive filter."""
        _check_page(limit, starting_after, ending_before)
        with self._read() as conn:
            rows, has_more = _paginate(
                conn,
                _CUSTOMER_SELECT,
                "deleted = 0 AND (?1 IS NULL OR email = ?1)",
                (email,),
                _Cursor("customers", "customer", starting_after, ending_before),
                limit,
            )
        return _list_body([_customer_body(row) for row in rows], has_more, "/v1/customers")

    def create_balance_transaction(
        self,
        customer: str,
        *,
        amount: int,
        currency: str,
        description: str | None = None,
        metadata: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
    ) -> StoreResult:
        """Moves the customer's ``balance`` by ``amount`` (negative: credit owed to the customer).

        The customer's balance has one currency: the first transaction sets it, another one is
        rejected with a 400, as at Stripe. The check and both writes share the idempotent write
        transaction, so concurrent transactions on one customer never lose an update.
        """
        params = {
            "customer": check_id(customer, "customer"),
            "amount": check_balance_amount(amount),
            "currency": check_currency(currency),
            "description": check_text(description, "description", MAX_BALANCE_DESCRIPTION_LENGTH),
            "metadata": check_metadata(metadata),
        }
        return self._idempotent(
            _BALANCE_TRANSACTIONS,
            f"/v1/customers/{params['customer']}/balance_transactions",
            idempotency_key,
            params,
            lambda conn: _insert_balance_transaction(conn, params),
        )

    def list_balance_transactions(
        self,
        customer: str,
        *,
        limit: int = 10,
        starting_after: str | None = None,
        ending_before: str | None = None,
    ) -> JsonObject:
        """The customer's balance transactions, newest first, paginated like :meth:`list_refunds`."""
        _check_page(limit, starting_after, ending_before)
        with self._read() as conn:
            _require_customer(conn, customer, param="customer")
            rows, has_more = _paginate(
                conn,
                _BALANCE_TRANSACTION_SELECT,
                "customer = ?1",
                (customer,),
                _Cursor(_BALANCE_TRANSACTIONS, "customer balance transaction", starting_after, ending_before),
                limit,
            )
        url = f"/v1/customers/{customer}/balance_transactions"
        return _list_body([_balance_transaction_body(row) for row in rows], has_more, url)

    def retrieve_balance_transaction(self, customer: str, transaction_id: str) -> JsonObject:
        """One of the customer's balance transactions; another customer's is missing here, as at Stripe."""
        with self._read() as conn:
            _require_customer(conn, customer, param="customer")
            row = conn.execute(
                f"{_BALANCE_TRANSACTION_SELECT} WHERE id = ? AND customer = ?", (transaction_id, customer)
            ).fetchone()
        if row is None:
            raise StripeApiError(
                404,
                "invalid_request_error",
                "resource_missing",
                f"No such customer balance transaction: '{transaction_id}'",
                "id",
            )
        return _balance_transaction_body(row)

    def delete_customer(self, customer_id: str) -> JsonObject:
        """Stripe's delete: the id keeps answering (``deleted: true``), lists and writes no longer
        see the customer, and deleting it again is a 404."""

        def delete(conn: sqlite3.Connection) -> None:
            _require_customer(conn, customer_id, param="id")
            conn.execute("UPDATE customers SET deleted = 1 WHERE id = ?", (customer_id,))
            _bump(conn, "customers_deleted")

        self._write(delete)
        return _deleted_customer_body(customer_id)

    # --- the account -----------------------------------------------------------------------------

    @property
    def account_id(self) -> str:
        """``acct_...``, made once with the file and never changed: the account this file *is*."""
        return self._account[0]

    def account(self) -> JsonObject:
        """Stripe's account object for this file, as ``GET /v1/account`` answers for one's own
        account: a test-mode standard account that can charge and pay out."""
        account_id, created = self._account
        return {
            "id": account_id,
            "object": "account",
            "business_profile": None,
            "business_type": None,
            "charges_enabled": True,
            "country": "US",
            "created": created,
            "default_currency": "usd",
            "details_submitted": True,
            "email": None,
            "metadata": {},
            "payouts_enabled": True,
            "settings": None,
            "type": "standard",
        }

    # --- operations ------------------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        with self._read() as conn:
            rows = dict(conn.execute("SELECT name, value FROM counters").fetchall())
        return {name: int(rows.get(name, 0)) for name in _STAT_NAMES}

    def forget_idempotency_keys(self, *, older_than_s: float = 0.0) -> int:
        """Drops stored keys, as Stripe does after 24 hours.

        Exists so callers can exercise their reconciliation path (finding a refund by the key in
        its metadata) against a provider that no longer remembers the key.
        """
        cutoff = time.time() - older_than_s
        return self._write(
            lambda conn: conn.execute("DELETE FROM idempotency_keys WHERE created <= ?", (cutoff,)).rowcount
        )

    # --- transactions ----------------------------------------------------------------------------

    def _idempotent(
        self,
        endpoint: str,
        path: str,
        key: str | None,
        params: JsonObject,
        action: Callable[[sqlite3.Connection], JsonObject],
    ) -> StoreResult:
        """Check-and-create in one write transaction: the heart of exactly-once.

        ``endpoint`` is the family of requests (the stored key's scope), ``path`` the request path
        the key is bound to: a key is one account's, whichever endpoint it was first used on.
        """
        if key is not None:
            check_idempotency_key(key)
        fingerprint = _fingerprint(params)

        def check_and_create(conn: sqlite3.Connection) -> _Outcome:
            stored = None if key is None else _load_key(conn, endpoint, path, key)
            if stored is not None:
                return _replay(conn, endpoint, key or "", stored, fingerprint)
            outcome = _execute(conn, action)
            if key is not None:
                _store_key(conn, endpoint, path, key, fingerprint, outcome)
            return outcome

        # ``BEGIN IMMEDIATE`` takes the write lock first, so no other process can interleave; the
        # group writer shares that transaction (and its fsync) among this process's threads.
        return self._write(check_and_create).unwrap()

    def _write(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        """``work`` in a write transaction, answered once committed (:mod:`.group_write`)."""
        self._reopen_after_fork()  # a child must not wait on a group its parent's threads led
        return self._writer.write(work)

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """A deferred transaction gives multi-statement reads one consistent snapshot."""
        with self._transaction("BEGIN") as conn:
            yield conn

    def _transaction(self, begin: str) -> AbstractContextManager[sqlite3.Connection]:
        self._reopen_after_fork()
        return locked_transaction(self._lock, self._conn, begin)

    def _reopen_after_fork(self) -> None:
        """A SQLite connection must never be used on both sides of a fork; the child gets its own."""
        if self._pid != os.getpid():
            self._lock = threading.Lock()
            self._pid = os.getpid()
            self._conn = _connect(self.path)
            self._writer = GroupWriter(self._transaction)

    def _migrate(self) -> None:
        """Brings the file to the newest schema (``payments/migrations``) before any query runs."""
        STORE_SCHEMA.upgrade(self.path)
        row = self._conn.execute("SELECT id, created FROM account").fetchone()
        self._account: tuple[str, int] = (str(row[0]), int(row[1]))


# --- connection ----------------------------------------------------------------------------------


def _connect(path: str) -> sqlite3.Connection:
    """WAL lets readers proceed during a write; FULL sync makes a returned refund survive power loss.

    ``isolation_level=None`` hands transaction control to us (explicit BEGIN IMMEDIATE).
    """
    conn = sqlite3.connect(
        path, timeout=_BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False
    )
    conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
    _enable_wal(conn, path)
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


def _enable_wal(conn: sqlite3.Connection, path: str) -> None:
    mode = enable_wal(conn, timeout_s=_BUSY_TIMEOUT_MS / 1000)
    if mode != "wal":
        raise UsageError(
            f"The payments database {path} cannot use SQLite's WAL mode (journal mode is {mode!r}); "
            "put it on a local filesystem."
        )


# --- idempotency ---------------------------------------------------------------------------------


def _fingerprint(params: JsonObject) -> str:
    """Canonical JSON, so dict order or ``None`` vs ``{}`` metadata never looks like a new request."""
    canonical = json.dumps(params, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _load_key(conn: sqlite3.Connection, endpoint: str, path: str, key: str) -> tuple[str, int, str] | None:
    """The key's stored answer on this endpoint, or ``None`` if it is new to the account.

    A key first used on another path is Stripe's 400, raised here (not stored: nothing ran). A row
    kept from before paths were recorded (null ``path``, revision 0004) is compared by endpoint.
    """
    rows = conn.execute(
        "SELECT endpoint, path, fingerprint, http_status, body FROM idempotency_keys WHERE key = ?", (key,)
    ).fetchall()
    for stored_endpoint, stored_path, fingerprint, http_status, body in rows:
        if stored_endpoint == endpoint and stored_path in (path, None):
            return str(fingerprint), int(http_status), str(body)
    if rows:
        first_path = rows[0][1] or _ENDPOINT_PATHS.get(rows[0][0], rows[0][0])
        raise StripeApiError(
            400,
            "idempotency_error",
            None,
            "Keys for idempotent requests can only be used for the same endpoint they were first used for "
            f"('{first_path}' vs '{path}'). Try using a key other than '{key}' if you meant to execute "
            "a different request.",
        )
    return None


def _replay(
    conn: sqlite3.Connection, endpoint: str, key: str, stored: tuple[str, int, str], fingerprint: str
) -> _Outcome:
    stored_fingerprint, http_status, body = stored
    if stored_fingerprint != fingerprint:
        raise StripeApiError(
            400,
            "idempotency_error",
            None,
            "Keys for idempotent requests can only be used with the same parameters they were first "
            f"used with. Try using a key other than '{key}' if you meant to execute a different request.",
        )
    if endpoint in _COUNTED_REPLAYS:
        _bump(conn, "idempotent_replays")
    return _Outcome(http_status, json.loads(body), replayed=True)


def _execute(conn: sqlite3.Connection, action: Callable[[sqlite3.Connection], JsonObject]) -> _Outcome:
    """Turns the client's-fault errors into an outcome so they are stored and replayed like Stripe.

    Anything else (5xx, SQLite failures) propagates and rolls the transaction back, so a retry with
    the same key runs the request afresh.
    """
    try:
        return _Outcome(200, action(conn))
    except StripeApiError as error:
        if error.http_status >= 500:
            raise
        return _Outcome(error.http_status, error.to_body())


def _store_key(
    conn: sqlite3.Connection, endpoint: str, path: str, key: str, fingerprint: str, outcome: _Outcome
) -> None:
    conn.execute(
        "INSERT INTO idempotency_keys (endpoint, path, key, fingerprint, http_status, body, created)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        (endpoint, path, key, fingerprint, outcome.http_status, json.dumps(outcome.body), time.time()),
    )


def _bump(conn: sqlite3.Connection, name: str) -> None:
    conn.execute(
        "INSERT INTO counters (name, value) VALUES (?, 1) ON CONFLICT (name) DO UPDATE SET value = value + 1",
        (name,),
    )


# --- charges and refunds -------------------------------------------------------------------------

_CHARGE_SELECT = (
    "SELECT id, amount, amount_refunded, currency, customer, description, metadata, created FROM charges"
)
_REFUND_SELECT = "SELECT id, amount, charge, currency, reason, metadata, status, created FROM refunds"


def _insert_charge(conn: sqlite3.Connection, params: JsonObject) -> JsonObject:
    charge_id = _new_id("ch")
    conn.execute(
        "INSERT INTO charges (id, amount, currency, customer, description, metadata, created)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        (
            charge_id,
            params["amount"],
            params["currency"],
            params["customer"],
            params["description"],
            json.dumps(params["metadata"]),
            int(time.time()),
        ),
    )
    return _charge_body(conn, conn.execute(f"{_CHARGE_SELECT} WHERE id = ?", (charge_id,)).fetchone())


def _insert_refund(conn: sqlite3.Connection, params: JsonObject) -> JsonObject:
    """Enforces the refund cap inside the caller's write transaction, so concurrent refunds
    of one charge can never sum past its amount."""
    charge_id = params["charge"]
    charge_amount, refunded, currency = _require_charge(conn, charge_id, param="charge")
    amount = _refund_amount(charge_id, params["amount"], charge_amount - refunded)
    refund_id = _new_id("re")
    conn.execute(
        "INSERT INTO refunds (id, amount, charge, currency, reason, metadata, status, created)"
        " VALUES (?, ?, ?, ?, ?, ?, 'succeeded', ?)",
        (
            refund_id,
            amount,
            charge_id,
            currency,
            params["reason"],
            json.dumps(params["metadata"]),
            int(time.time()),
        ),
    )
    conn.execute("UPDATE charges SET amount_refunded = amount_refunded + ? WHERE id = ?", (amount, charge_id))
    _bump(conn, "refunds_created")
    return _refund_body(conn.execute(f"{_REFUND_SELECT} WHERE id = ?", (refund_id,)).fetchone())


def _refund_amount(charge_id: str, requested: int | None, remaining: int) -> int:
    if remaining <= 0:
        raise invalid_request(
            f"Charge {charge_id} has already been refunded.", code="charge_already_refunded"
        )
    if requested is None:
        return remaining
    if requested > remaining:
        raise invalid_request(
            f"Refund amount ({requested}) is greater than the unrefunded amount on charge {charge_id} "
            f"({remaining}); amounts are in minor units.",
            code="amount_too_large",
            param="amount",
        )
    return requested


def _require_charge(conn: sqlite3.Connection, charge_id: str, *, param: str) -> tuple[int, int, str]:
    row = conn.execute(
        "SELECT amount, amount_refunded, currency FROM charges WHERE id = ?", (charge_id,)
    ).fetchone()
    if row is None:
        raise StripeApiError(
            404, "invalid_request_error", "resource_missing", f"No such charge: '{charge_id}'", param
        )
    return int(row[0]), int(row[1]), str(row[2])


# The bodies carry every field of Stripe's objects (checked against Stripe's published schema in
# tests/payments/test_stripe_schemas.py), so a client reading any of them works here as at Stripe.
# What the simulator has no notion of (balance transactions, payment methods, Connect, Radar) is
# null, as Stripe answers for a charge that never involved them.


def _charge_body(conn: sqlite3.Connection, row: tuple[Any, ...]) -> JsonObject:
    charge_id, amount, refunded, currency, customer, description, metadata, created = row
    refund_rows = conn.execute(
        f"{_REFUND_SELECT} WHERE charge = ? ORDER BY seq DESC LIMIT ?", (charge_id, EMBEDDED_REFUNDS + 1)
    ).fetchall()
    refunds = _list_body(
        [_refund_body(refund) for refund in refund_rows[:EMBEDDED_REFUNDS]],
        len(refund_rows) > EMBEDDED_REFUNDS,
        f"/v1/charges/{charge_id}/refunds",
    )
    return {
        "id": charge_id,
        "object": "charge",
        "amount": amount,
        "amount_captured": amount,
        "amount_refunded": refunded,
        "application": None,
        "application_fee": None,
        "application_fee_amount": None,
        "balance_transaction": None,
        "billing_details": {
            "address": {
                "city": None,
                "country": None,
                "line1": None,
                "line2": None,
                "postal_code": None,
                "state": None,
            },
            "email": None,
            "name": None,
            "phone": None,
            "tax_id": None,
        },
        "calculated_statement_descriptor": None,
        "captured": True,
        "created": created,
        "currency": currency,
        "customer": customer,
        "description": description,
        "disputed": False,
        "failure_balance_transaction": None,
        "failure_code": None,
        "failure_message": None,
        "fraud_details": {},
        "livemode": False,
        "metadata": json.loads(metadata),
        "on_behalf_of": None,
        "outcome": {
            "network_status": "approved_by_network",
            "reason": None,
            "risk_level": "normal",
            "seller_message": "Payment complete.",
            "type": "authorized",
        },
        "paid": True,
        "payment_intent": None,
        "payment_method": None,
        "payment_method_details": None,
        "receipt_email": None,
        "receipt_number": None,
        "receipt_url": None,
        "refunded": refunded == amount,
        "refunds": refunds,
        "review": None,
        "shipping": None,
        "source_transfer": None,
        "statement_descriptor": None,
        "statement_descriptor_suffix": None,
        "status": "succeeded",
        "transfer_data": None,
        "transfer_group": None,
    }


def _refund_body(row: tuple[Any, ...]) -> JsonObject:
    refund_id, amount, charge, currency, reason, metadata, status, created = row
    return {
        "id": refund_id,
        "object": "refund",
        "amount": amount,
        "balance_transaction": None,
        "charge": charge,
        "created": created,
        "currency": currency,
        "destination_details": None,
        "metadata": json.loads(metadata),
        "payment_intent": None,
        "reason": reason,
        "receipt_number": None,
        "source_transfer_reversal": None,
        "status": status,
        "transfer_reversal": None,
    }


# --- pagination ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Cursor:
    """Where a page starts: after ``starting_after`` (older) or before ``ending_before`` (newer)."""

    table: str
    noun: str
    starting_after: str | None
    ending_before: str | None

    def seq(self, conn: sqlite3.Connection, object_id: str, param: str) -> int:
        row = conn.execute(f"SELECT seq FROM {self.table} WHERE id = ?", (object_id,)).fetchone()
        if row is None:
            raise StripeApiError(
                404, "invalid_request_error", "resource_missing", f"No such {self.noun}: '{object_id}'", param
            )
        return int(row[0])


def _check_page(limit: object, starting_after: str | None, ending_before: str | None) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIST_LIMIT:
        raise invalid_request(
            f"Invalid limit: must be an integer between 1 and {MAX_LIST_LIMIT}.",
            code="parameter_invalid_integer",
            param="limit",
        )
    if starting_after is not None and ending_before is not None:
        raise invalid_request(
            "You may only specify one of these parameters: ending_before, starting_after.",
            param="ending_before",
        )


def _paginate(
    conn: sqlite3.Connection,
    select: str,
    where: str,
    args: tuple[object, ...],
    cursor: _Cursor,
    limit: int,
) -> tuple[list[tuple[Any, ...]], bool]:
    """One page, newest first, and whether more lie beyond it, as Stripe's lists answer.

    ``starting_after=X`` is the page of older objects right after X; ``ending_before=X`` the page
    of newer ones right before it, still newest first, with ``has_more`` telling whether even
    newer ones exist (so a client pages backwards until it is false). ``where`` uses numbered
    parameters ``?1..?n`` for ``args``; the cursor and limit follow them.
    """
    n = len(args)
    if cursor.ending_before is not None:
        newer_than = cursor.seq(conn, cursor.ending_before, "ending_before")
        rows = conn.execute(
            f"{select} WHERE {where} AND seq > ?{n + 1} ORDER BY seq ASC LIMIT ?{n + 2}",
            (*args, newer_than, limit + 1),
        ).fetchall()
        return list(reversed(rows[:limit])), len(rows) > limit
    older_than = (
        None if cursor.starting_after is None else cursor.seq(conn, cursor.starting_after, "starting_after")
    )
    rows = conn.execute(
        f"{select} WHERE {where} AND (?{n + 1} IS NULL OR seq < ?{n + 1}) ORDER BY seq DESC LIMIT ?{n + 2}",
        (*args, older_than, limit + 1),
    ).fetchall()
    return rows[:limit], len(rows) > limit


# --- customers and balance transactions ----------------------------------------------------------

_CUSTOMER_SELECT = (
    "SELECT id, email, name, metadata, currency, balance, invoice_prefix, created, description, deleted"
    " FROM customers"
)
_BALANCE_TRANSACTION_SELECT = (
    "SELECT id, customer, amount, currency, description, metadata, ending_balance, created"
    " FROM customer_balance_transactions"
)
#: Stripe's invoice prefixes: 3 to 12 uppercase letters or digits, unique per account.
_INVOICE_PREFIX_ALPHABET = string.ascii_uppercase + string.digits


def _insert_customer(conn: sqlite3.Connection, params: JsonObject) -> JsonObject:
    customer_id = _new_id("cus")
    prefix = "".join(secrets.choice(_INVOICE_PREFIX_ALPHABET) for _ in range(8))
    conn.execute(
        "INSERT INTO customers (id, email, name, metadata, invoice_prefix, created)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (
            customer_id,
            params["email"],
            params["name"],
            json.dumps(params["metadata"]),
            prefix,
            int(time.time()),
        ),
    )
    _bump(conn, "customers_created")
    return _customer_body(_require_customer(conn, customer_id, param="id"))


def _update_customer(conn: sqlite3.Connection, params: JsonObject) -> JsonObject:
    """Runs inside the idempotent write transaction: the merged metadata is checked against
    Stripe's limits before anything is written."""
    customer_id = params["customer"]
    row = _require_customer(conn, customer_id, param="id")
    fields: dict[str, object] = {n: params[n] for n in ("email", "name", "description") if n in params}
    if "metadata" in params:
        changes: dict[str, str] = params["metadata"]
        merged = {} if not changes else {**json.loads(row[3]), **changes}
        merged = {key: value for key, value in sorted(merged.items()) if value != ""}
        if len(merged) > METADATA_MAX_KEYS:
            raise invalid_request(f"Metadata can have at most {METADATA_MAX_KEYS} keys.", param="metadata")
        fields["metadata"] = json.dumps(merged)
    if fields:
        assignments = ", ".join(f"{name} = ?" for name in fields)  # names from the fixed tuple above
        conn.execute(f"UPDATE customers SET {assignments} WHERE id = ?", (*fields.values(), customer_id))
    return _customer_body(_require_customer(conn, customer_id, param="id"))


def _insert_balance_transaction(conn: sqlite3.Connection, params: JsonObject) -> JsonObject:
    """Runs inside the idempotent write transaction: the currency check, the balance update and
    the insert commit together or not at all."""
    customer_id, amount, currency = params["customer"], params["amount"], params["currency"]
    row = _require_customer(conn, customer_id, param="customer")
    customer_currency, balance = row[4], int(row[5])
    if customer_currency is not None and customer_currency != currency:
        raise invalid_request(
            f"Customer {customer_id}'s balance is in {customer_currency}; a balance transaction in "
            f"{currency} cannot be applied to it (a customer's balance has one currency).",
            param="currency",
        )
    ending_balance = balance + amount
    if abs(ending_balance) > MAX_AMOUNT:
        raise invalid_request(
            f"The customer's balance would be {ending_balance}; it must stay within +/-{MAX_AMOUNT}.",
            code="amount_too_large",
            param="amount",
        )
    transaction_id = _new_id("cbtxn")
    conn.execute(
        "INSERT INTO customer_balance_transactions"
        " (id, customer, amount, currency, description, metadata, ending_balance, created)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (
            transaction_id,
            customer_id,
            amount,
            currency,
            params["description"],
            json.dumps(params["metadata"]),
            ending_balance,
            int(time.time()),
        ),
    )
    conn.execute(
        "UPDATE customers SET balance = ?, currency = ? WHERE id = ?", (ending_balance, currency, customer_id)
    )
    _bump(conn, "balance_transactions_created")
    row = conn.execute(f"{_BALANCE_TRANSACTION_SELECT} WHERE id = ?", (transaction_id,)).fetchone()
    return _balance_transaction_body(row)


def _require_customer(conn: sqlite3.Connection, customer_id: str, *, param: str) -> tuple[Any, ...]:
    """A customer that exists and is not deleted: Stripe answers 404 to writes on a deleted one."""
    row = conn.execute(f"{_CUSTOMER_SELECT} WHERE id = ? AND deleted = 0", (customer_id,)).fetchone()
    if row is None:
        raise _no_such_customer(customer_id, param)
    return tuple(row)


def _no_such_customer(customer_id: str, param: str) -> StripeApiError:
    return StripeApiError(
        404, "invalid_request_error", "resource_missing", f"No such customer: '{customer_id}'", param
    )


def _deleted_customer_body(customer_id: str) -> JsonObject:
    return {"id": customer_id, "object": "customer", "deleted": True}


def _customer_body(row: tuple[Any, ...]) -> JsonObject:
    """Every field of Stripe's customer; what the simulator has no notion of (addresses, payment
    sources, discounts, tax, test clocks) is null or empty, as for a customer created with only
    an email, a name and metadata."""
    customer_id, email, name, metadata, currency, balance, invoice_prefix, created, description, _ = row
    return {
        "id": customer_id,
        "object": "customer",
        "address": None,
        "balance": balance,
        "created": created,
        "currency": currency,
        "default_source": None,
        "delinquent": False,
        "description": description,
        "discount": None,
        "email": email,
        "invoice_prefix": invoice_prefix,
        "invoice_settings": {
            "custom_fields": None,
            "default_payment_method": None,
            "footer": None,
            "rendering_options": None,
        },
        "livemode": False,
        "metadata": json.loads(metadata),
        "name": name,
        "next_invoice_sequence": 1,
        "phone": None,
        "preferred_locales": [],
        "shipping": None,
        "tax_exempt": "none",
        "test_clock": None,
    }


def _balance_transaction_body(row: tuple[Any, ...]) -> JsonObject:
    """``type`` is ``adjustment``: what Stripe records for a transaction created through the API."""
    transaction_id, customer, amount, currency, description, metadata, ending_balance, created = row
    return {
        "id": transaction_id,
        "object": "customer_balance_transaction",
        "amount": amount,
        "created": created,
        "credit_note": None,
        "currency": currency,
        "customer": customer,
        "description": description,
        "ending_balance": ending_balance,
        "invoice": None,
        "livemode": False,
        "metadata": json.loads(metadata),
        "type": "adjustment",
    }


def _list_body(data: list[JsonObject], has_more: bool, url: str) -> JsonObject:
    return {"object": "list", "data": data, "has_more": has_more, "url": url}


def _new_id(prefix: str) -> str:
    """24 random characters of 62, as Stripe's ids; from one draw of the OS's randomness, not 24
    (17 us each, in the writer's transaction that every concurrent request waits on)."""
    number, chars = secrets.randbits(_ID_BITS), []
    for _ in range(24):
        number, digit = divmod(number, 62)
        chars.append(_ID_ALPHABET[digit])
    return f"{prefix}_" + "".join(chars)


# --- parameter validation ------------------------------------------------------------------------
# Validation failures are raised before the idempotency check and are not stored, as at Stripe:
# nothing began executing, so a corrected retry with the same key must be allowed to run.
