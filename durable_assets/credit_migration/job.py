"""The credit migration as a durable job: the descriptor the operations layer reads."""

from __future__ import annotations

from durable_assets.credit_migration.assets import ALL_ASSETS, enforce_credit_limits
from durable_assets.credit_migration.checks import ALL_CHECKS
from durable_assets.credit_migration.schedules import NIGHTLY_CREDITS
from durable_assets.credit_migration.schema import AccountDecision, PlannedAction
from durable_assets.credit_migration.summary import CREDIT_SUMMARY
from durable_assets.credit_migration.validation import read_legacy_file
from durable_assets.kit import DurableJob

CREDIT_JOB = "credit_migration"

credit_migration = DurableJob(
    CREDIT_JOB,
    assets=ALL_ASSETS,
    checks=ALL_CHECKS,
    summary=CREDIT_SUMMARY,
    daily=NIGHTLY_CREDITS,
    check_input=read_legacy_file,
    # Distributed runs shard provider_customers and applied_adjustments; the ceilings see the whole batch.
    shard_guards={
        "applied_adjustments": lambda plan, resources: enforce_credit_limits(
            plan[plan["action"] == PlannedAction.ADJUST], resources["credit_limits"]
        )
    },
    decisions={
        AccountDecision.NO_CUSTOMER: (
            "the account gets no customer: nothing is created, adopted or moved for it, and the "
            "report lists it as decided instead of held"
        ),
        AccountDecision.KEEP_PROVIDER_BALANCE: (
            "the balance at the provider stands: no adjustment for the account, whatever the "
            "export says; the report shows both figures instead of holding it"
        ),
    },
    description=(
        "A batch migration of prepaid credit from a legacy billing export into payment-provider "
        "customer balances: one customer per legacy account (found or created), one balance "
        "transaction per changed balance, each exactly once, every balance read back. Partition = batch ID."
    ),
)
