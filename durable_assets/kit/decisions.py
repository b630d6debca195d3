"""What a person decided for one item of a job: the way out of a review that would come back every night.

A batch holds an item it cannot settle alone (a customer deleted at the provider, a balance changed
there by hand) and the next night's batch, reading the same provider, holds it again. Some of those
are settled at the provider (a replacement customer is adopted), but some are settled only by a
person's word: "this account gets no customer", "keep the provider's balance". That word is kept
here, beside the ledger and in the same account namespace as its keys (a decision about an account
at one provider account says nothing about another), so every later batch of the job reads it.

A job declares the decisions it honours (``DurableJob(decisions=...)``, each a word and what it
does); a person records one with ``job decide`` and withdraws it with ``job decide --withdraw``; a
step reads the decisions in force with :func:`decisions_for` and says in its output which it
applied. A decision is kept until it is withdrawn: it is a standing instruction, not a one-off.
"""

from __future__ import annotations

import getpass
import socket
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import sqlalchemy as sa

from durable_assets.kit.accounts import DEFAULT_NAMESPACE, ProviderAccount
from durable_assets.kit.db import DurableDatabase, item_decisions, now

if TYPE_CHECKING:
    from dagster import AssetExecutionContext

    from durable_assets.kit.pacing import PacedProvider


@dataclass(frozen=True)
class ItemDecision:
    """One person's standing decision for one item of a job at one provider account."""

    account: str  # the ledger namespace (ProviderAccount.namespace) the decision applies to
    job: str
    item: str
    decision: str
    note: str
    decided_at: float
    decided_by: str

    @property
    def decided_on(self) -> str:
        return datetime.fromtimestamp(self.decided_at, UTC).strftime("%Y-%m-%d %H:%M UTC")

    def describe(self) -> str:
        """``a person (ann@host) decided no-customer on 2026-12-05 10:00 UTC: closed in 2019``:
        what a report's note says of an item the decision settled."""
        return f"{self.decided_by} decided {self.decision} on {self.decided_on}: {self.note}"

    def as_json(self) -> dict[str, str]:
        return {
            "item": self.item,
            "job": self.job,
            "account": self.account,
            "decision": self.decision,
            "note": self.note,
            "decided_at": datetime.fromtimestamp(self.decided_at, UTC).isoformat(),
            "decided_by": self.decided_by,
        }


def who_decides() -> str:
    """The person behind a decision as the machine knows them: ``user@host``."""
    try:
        user = getpass.getuser()
    except Exception:  # no login name (a container's numeric user): the host still says where
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


class ItemDecisions:
    """The ``durable_item_decisions`` table, seen from one provider account's namespace."""

    def __init__(self, db: DurableDatabase, account: str = DEFAULT_NAMESPACE) -> None:
        self.db = db
        self.account = account

    def record(self, job: str, item: str, decision: str, note: str, by: str) -> ItemDecision:
        """Record (or replace) the decision for ``item``; the newest word is the one in force."""
        made = ItemDecision(self.account, job, item, decision, note, now(), by)
        with self.db.transaction() as conn:
            conn.execute(self.db.upsert(item_decisions, ["account", "job", "item"], asdict(made)))
        return made

    def withdraw(self, job: str, item: str) -> ItemDecision | None:
        """Withdraw the decision for ``item``; the one withdrawn, or None when there was none."""
        c = item_decisions.c
        where = (c.account == self.account, c.job == job, c.item == item)
        with self.db.transaction() as conn:
            row = conn.execute(sa.select(item_decisions).where(*where)).first()
            if row is None:
                return None
            conn.execute(sa.delete(item_decisions).where(*where))
        return ItemDecision(**row._asdict())

    def of_job(self, job: str) -> dict[str, ItemDecision]:
        """The decisions in force for ``job`` at this account, by item."""
        c = item_decisions.c
        with self.db.read() as conn:
            rows = conn.execute(
                sa.select(item_decisions).where(c.account == self.account, c.job == job)
            ).all()
        return {row.item: ItemDecision(**row._asdict()) for row in rows}


def all_decisions(db: DurableDatabase, job: str | None = None) -> list[ItemDecision]:
    """Every decision in force (of ``job`` alone, if named), at every account: what ``job decisions``
    lists, oldest first."""
    query = sa.select(item_decisions).order_by(item_decisions.c.decided_at)
    if job is not None:
        query = query.where(item_decisions.c.job == job)
    with db.read() as conn:
        return [ItemDecision(**row._asdict()) for row in conn.execute(query).all()]


def decisions_for(
    context: AssetExecutionContext,
    *,
    provider: PacedProvider | None = None,
    account: ProviderAccount | None = None,
) -> Mapping[str, ItemDecision]:
    """The decisions a person recorded for this step's job at the account its effects go to
    (``provider``'s, or ``account``), by item: a step consults them before it holds, creates or
    moves anything for an item, and names the decision it applied in that item's row."""
    from durable_assets.kit.resources import IdempotencyLedger
    from durable_assets.kit.steps import kit_resource

    ledger = kit_resource(context, "ledger", IdempotencyLedger).ledger
    bound = account or (provider.account if provider is not None else None)
    namespace = bound.namespace if bound is not None else DEFAULT_NAMESPACE
    return ItemDecisions(ledger.db, namespace).of_job(context.job_name)
