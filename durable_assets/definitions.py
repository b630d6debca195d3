"""The Dagster code location: the durable jobs, registered once, with the resources they share.

Configuration comes from the environment (docs/contract.md), read here, where the jobs are wired:
``DURABLE_PAYMENTS_URL`` and ``STRIPE_API_KEY`` select a Stripe-compatible provider; each
pipeline's limits are its own section (``RefundSettings``, ``CreditMigrationSettings``). Built
like any user's location (:mod:`durable_assets.location`): the daemon-side parts and the kit's
resources come from there.
"""

from __future__ import annotations

from dagster import EnvVar, JobDefinition

from durable_assets.credit_migration.job import credit_migration
from durable_assets.credit_migration.resources import CreditLimits
from durable_assets.credit_migration.settings import CreditMigrationSettings
from durable_assets.kit import DurableJobs
from durable_assets.kit.runtime import KitSettings
from durable_assets.location import definitions
from durable_assets.payments.resources import PaymentGateway, resolve_provider_account
from durable_assets.payments.settings import PaymentSettings
from durable_assets.refunds.job import REFUND_JOB, refund_batch
from durable_assets.refunds.resources import CustomerMailbox, RefundLimits
from durable_assets.refunds.settings import RefundSettings


def _optional_env(name: str, value: str | None) -> EnvVar | None:
    """EnvVar keeps secrets out of the UI's config view; only reference variables that are set."""
    return EnvVar(name) if value else None


#: The one registration point: every durable job of this code location, the default first.
durable_jobs = DurableJobs(
    [refund_batch, credit_migration],
    # Both jobs talk to the one configured payment provider: a batch is bound to its account.
    provider_account=lambda instance_root: resolve_provider_account(
        PaymentSettings.current().payments_url, PaymentSettings.current().stripe_api_key, instance_root
    ),
)

_provider = PaymentSettings.current()
_pace = KitSettings.current()
_refunds = RefundSettings.current()
_credits = CreditMigrationSettings.current()

defs = definitions(
    durable_jobs,
    resources={
        "payments": PaymentGateway(
            payments_url=_optional_env("DURABLE_PAYMENTS_URL", _provider.payments_url),
            api_key=_optional_env("STRIPE_API_KEY", _provider.stripe_api_key),
            concurrency_limit=_pace.concurrency,
            rate_limit_per_second=_pace.rate_limit,
            provider_down_budget_seconds=_pace.provider_down_budget_s,
        ),
        "mailbox": CustomerMailbox(),
        "limits": RefundLimits(
            max_refunds_per_batch=_refunds.max_refunds_per_batch,
            max_amount_per_batch_cents=_refunds.max_amount_per_batch_cents,
        ),
        "credit_limits": CreditLimits(
            max_adjustments_per_batch=_credits.max_adjustments_per_batch,
            max_credit_per_batch_cents=_credits.max_credit_per_batch_cents,
        ),
    },
)


def refund_batch_job() -> JobDefinition:
    """Module-level factory so ``reconstructable`` can rebuild the job in any process."""
    return durable_jobs.job_definition(REFUND_JOB)
