"""The Dagster code location: the durable jobs, registered once, with the resources they share.

Configuration comes from the environment (docs/contract.md): ``DURABLE_PAYMENTS_URL`` and
``STRIPE_API_KEY`` select a Stripe-compatible provider; tuning knobs are optional ``DURABLE_*``,
read by the resources themselves. Built like any user's location (:mod:`durable_assets.location`):
the daemon-side parts and the kit's resources come from there.
"""

from __future__ import annotations

from dagster import EnvVar, JobDefinition

from durable_assets.credit_migration.job import credit_migration
from durable_assets.credit_migration.resources import CreditLimits
from durable_assets.kit import DurableJobs
from durable_assets.location import definitions
from durable_assets.payments.resources import PaymentGateway, resolve_provider_account
from durable_assets.refunds.job import REFUND_JOB, refund_batch
from durable_assets.refunds.resources import CustomerMailbox, RefundLimits
from durable_assets.settings import settings


def _optional_env(name: str, value: str | None) -> EnvVar | None:
    """EnvVar keeps secrets out of the UI's config view; only reference variables that are set."""
    return EnvVar(name) if value else None


#: The one registration point: every durable job of this code location, the default first.
durable_jobs = DurableJobs(
    [refund_batch, credit_migration],
    # Both jobs talk to the one configured payment provider: a batch is bound to its account.
    provider_account=lambda instance_root: resolve_provider_account(
        settings().payments_url, settings().stripe_api_key, instance_root
    ),
)

defs = definitions(
    durable_jobs,
    resources={
        "payments": PaymentGateway(
            payments_url=_optional_env("DURABLE_PAYMENTS_URL", settings().payments_url),
            api_key=_optional_env("STRIPE_API_KEY", settings().stripe_api_key),
        ),
        "mailbox": CustomerMailbox(),
        "limits": RefundLimits(
            max_refunds_per_batch=settings().max_refunds_per_batch,
            max_amount_per_batch_cents=settings().max_amount_per_batch_cents,
        ),
        "credit_limits": CreditLimits(
            max_adjustments_per_batch=settings().max_credit_adjustments_per_batch,
            max_credit_per_batch_cents=settings().max_credit_per_batch_cents,
        ),
    },
)


def refund_batch_job() -> JobDefinition:
    """Module-level factory so ``reconstructable`` can rebuild the job in any process."""
    return durable_jobs.job_definition(REFUND_JOB)
