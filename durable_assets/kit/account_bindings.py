"""Which provider account each batch is bound to: set by its first run, checked by every later one.

A batch's ledger entries and the provider IDs in its step outputs (customers, refunds) exist only at
the account that made them. A resume pointed at another account would find none of its keys settled
there and start over, or trust IDs that do not exist: so the first run binds the batch to its
account, and a run against another account is refused by name (:class:`ProviderAccountMismatchError`).
"""

from __future__ import annotations

import logging

import sqlalchemy as sa

from durable_assets.errors import ProviderAccountMismatchError
from durable_assets.kit.accounts import UNBOUND_NAMESPACE, ProviderAccount
from durable_assets.kit.db import DurableDatabase, batch_accounts, effect_subjects, idempotency, now

log = logging.getLogger(__name__)


def mismatch_message(batch_id: str, bound: ProviderAccount, configured: ProviderAccount) -> str:
    """Why a batch cannot continue against another provider account, and what to set to continue it."""
    return (
        f"batch {batch_id} was started against {bound.describe()}, but the configured provider is "
        f"{configured.describe()}; its idempotency keys and provider IDs belong to the first account. "
        "Point DURABLE_PAYMENTS_URL and STRIPE_API_KEY at that account to continue it, or start a new batch"
    )


class AccountBindings:
    """The ``durable_batch_accounts`` table: batch ID -> the provider account it talks to."""

    def __init__(self, db: DurableDatabase) -> None:
        self.db = db

    def get(self, batch_id: str) -> ProviderAccount | None:
        c = batch_accounts.c
        with self.db.read() as conn:
            row = conn.execute(sa.select(batch_accounts).where(c.batch_id == batch_id)).first()
        return None if row is None else ProviderAccount(row.kind, row.account, bool(row.livemode))

    def bind(self, batch_id: str, account: ProviderAccount) -> ProviderAccount:
        """Bind the batch to ``account`` unless it is bound already; raise if it is bound to another.

        The first binding of an upgraded instance also adopts the ledger entries written before
        accounts were recorded (migration 0004): they were made at the account the instance was then
        talking to, and a batch resumed across the upgrade must find its settled keys.
        """
        with self.db.transaction() as conn:
            conn.execute(
                self.db.insert_ignore(batch_accounts),
                [
                    {
                        "batch_id": batch_id,
                        "kind": account.kind,
                        "account": account.account,
                        "livemode": account.livemode,
                        "bound_at": now(),
                    }
                ],
            )
            row = conn.execute(sa.select(batch_accounts).where(batch_accounts.c.batch_id == batch_id)).one()
            bound = ProviderAccount(row.kind, row.account, bool(row.livemode))
            if bound != account:
                raise ProviderAccountMismatchError(mismatch_message(batch_id, bound, account))
            self._adopt_unbound(conn, account)
        return bound

    @staticmethod
    def _adopt_unbound(conn: sa.Connection, account: ProviderAccount) -> None:
        adopted = 0
        for table in (idempotency, effect_subjects):
            unbound = table.c.account == UNBOUND_NAMESPACE
            if conn.execute(sa.select(sa.literal(1)).where(unbound).limit(1)).first() is None:
                continue
            result = conn.execute(table.update().where(unbound).values(account=account.namespace))
            adopted += int(result.rowcount)
        if adopted:
            log.warning(
                "%d ledger rows written before provider accounts were recorded now belong to %s",
                adopted,
                account.describe(),
            )
