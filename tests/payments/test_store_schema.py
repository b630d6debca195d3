"""The payments store's schema under Alembic: a file of every earlier release is adopted in place and
ends with the schema of a new file, and a file at head opens without Alembic."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

from durable_assets.kit.schema_migrations import SchemaTooNewError
from durable_assets.payments.migrations import STORE_SCHEMA
from durable_assets.payments.store import PaymentStore, StripeApiError
from tests.payments.old_files import (
    OLD_ACCOUNT,
    SHIPPED_STEPS,
    as_revision_0003,
    columns,
    old_store_file,
    rows,
    sha256,
    step_sql,
)
from tests.support.imports import libraries_loaded_by

#: The last ``PRAGMA user_version`` the hand-rolled migrations reached.
LAST_HAND_ROLLED = 3


def _versions(path: Path) -> tuple[list[tuple[str]], int]:
    conn = sqlite3.connect(path)
    try:
        stamped = conn.execute(f"SELECT version_num FROM {STORE_SCHEMA.version_table}").fetchall()
        return stamped, int(conn.execute("PRAGMA user_version").fetchone()[0])
    finally:
        conn.close()


def _schema(path: Path) -> set[tuple[str, str]]:
    conn = sqlite3.connect(path)
    try:
        found = conn.execute("SELECT name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'")
        return {(name, sql) for name, sql in found if not name.startswith(STORE_SCHEMA.version_table)}
    finally:
        conn.close()


@pytest.mark.parametrize("version", [1, 2, 3])
def test_a_file_of_every_earlier_release_is_upgraded_and_keeps_its_rows(tmp_path: Path, version: int) -> None:
    path = tmp_path / f"v{version}.db"
    old_store_file(path, version)
    before = columns(path)
    kept = rows(path, before)
    PaymentStore(str(tmp_path / "new.db")).close()

    PaymentStore(str(path)).close()

    assert rows(path, before) == kept
    assert _versions(path) == ([(STORE_SCHEMA.head,)], LAST_HAND_ROLLED)
    assert _schema(path) == _schema(tmp_path / "new.db")  # as if it had been made by this release
    with PaymentStore(str(path)) as store:
        assert store.retrieve_refund("re_old")["amount"] == 40
        assert store.create_refund(charge="ch_old").body["amount"] == 60  # what the old refund left
        assert store.create_customer(email="new@example.com").body["id"].startswith("cus_")
        if version >= 2:
            assert store.retrieve_customer("cus_old")["invoice_prefix"] == "ABC"
        if version == LAST_HAND_ROLLED:
            assert store.account_id == OLD_ACCOUNT  # the file stays the account it was
        else:
            assert re.fullmatch(r"acct_[A-Za-z0-9]{16}", store.account_id)  # made by 0003


def test_a_file_at_0003_learns_each_keys_path_and_binds_its_keys_to_it(tmp_path: Path) -> None:
    """Revision 0004 (issue #34): keys stored before it keep replaying where they were used, and are
    refused on any other endpoint, which before created a second, independent effect."""
    path = tmp_path / "r0003.db"
    with PaymentStore(str(path)) as store:
        charge = store.create_charge(amount=100, currency="usd", idempotency_key="k-charge").body
        store.create_refund(charge=charge["id"], amount=10, idempotency_key="k-refund")
        customer = store.create_customer(email="a@example.com", idempotency_key="k-customer").body["id"]
        store.create_balance_transaction(customer, amount=-5, currency="usd", idempotency_key="k-bt")
        with pytest.raises(StripeApiError):  # the balance is in usd: a stored 400, no customer in it
            store.create_balance_transaction(customer, amount=-5, currency="eur", idempotency_key="k-bt-err")
    as_revision_0003(path, STORE_SCHEMA.version_table)
    assert "path" not in columns(path)["idempotency_keys"]

    with PaymentStore(str(path)) as store:
        with sqlite3.connect(path) as conn:
            paths = dict(conn.execute("SELECT key, path FROM idempotency_keys"))
        conn.close()
        replays = [
            store.create_charge(amount=100, currency="usd", idempotency_key="k-charge"),
            store.create_refund(charge=charge["id"], amount=10, idempotency_key="k-refund"),
            store.create_customer(email="a@example.com", idempotency_key="k-customer"),
            store.create_balance_transaction(customer, amount=-5, currency="usd", idempotency_key="k-bt"),
        ]
        with pytest.raises(StripeApiError, match="balance is in usd") as stored_error:
            store.create_balance_transaction(customer, amount=-5, currency="eur", idempotency_key="k-bt-err")
        elsewhere = {}
        for key in ("k-charge", "k-bt", "k-bt-err"):
            with pytest.raises(StripeApiError) as refused:
                store.create_customer(email="b@example.com", idempotency_key=key)
            elsewhere[key] = refused.value
        balance = store.retrieve_customer(customer)["balance"]

    assert paths == {
        "k-charge": "/v1/charges",
        "k-refund": "/v1/refunds",
        "k-customer": "/v1/customers",
        "k-bt": f"/v1/customers/{customer}/balance_transactions",
        "k-bt-err": None,  # a stored error names no customer: compared by endpoint
    }
    assert all(result.replayed for result in replays)
    assert stored_error.value.replayed
    assert {key: (e.http_status, e.error_type) for key, e in elsewhere.items()} == dict.fromkeys(
        elsewhere, (400, "idempotency_error")
    )
    assert (
        "('/v1/customers/{customer}/balance_transactions' vs '/v1/customers')"
        in elsewhere["k-bt-err"].message
    )
    assert balance == -5
    assert _versions(path) == ([(STORE_SCHEMA.head,)], LAST_HAND_ROLLED)


def test_the_first_revisions_run_the_hand_rolled_steps_as_they_shipped() -> None:
    """Files of those releases hold exactly what these steps made: a changed step would make a new
    file differ from an upgraded one, and a file of those releases would not be what 0003 assumes."""
    assert {step: sha256(step_sql(step)) for step in SHIPPED_STEPS} == {
        step: shipped for step, (_module, shipped) in SHIPPED_STEPS.items()
    }


def test_a_file_a_newer_release_upgraded_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    PaymentStore(str(path)).close()
    with sqlite3.connect(path) as conn:
        conn.execute(f"UPDATE {STORE_SCHEMA.version_table} SET version_num = '9999'")
    conn.close()

    with pytest.raises(SchemaTooNewError, match="revision 9999, which this release does not know"):
        PaymentStore(str(path))


def test_head_is_the_newest_revision_of_one_line() -> None:
    script = STORE_SCHEMA.script
    assert script.get_heads() == [STORE_SCHEMA.head]
    assert [r.revision for r in script.walk_revisions()] == ["0005", "0004", "0003", "0002", "0001"]


_OPEN = "from durable_assets.payments.store import PaymentStore; PaymentStore({path!r}).close()"


def test_a_file_at_head_opens_without_alembic(tmp_path: Path) -> None:
    """Issue #25 counts process start: the simulator opens the store and needs nothing else."""
    at_head, old = tmp_path / "head.db", tmp_path / "old.db"
    PaymentStore(str(at_head)).close()
    old_store_file(old, 2)

    fast = libraries_loaded_by(_OPEN.format(path=str(at_head)))
    upgrading = libraries_loaded_by(_OPEN.format(path=str(old)))

    assert fast & {"alembic", "sqlalchemy", "dagster"} == set()
    assert "alembic" in upgrading  # the probe sees it when an upgrade runs
