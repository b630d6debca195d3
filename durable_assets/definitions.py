"""The Dagster code location: the durable jobs, registered once, with the resources they share.

Configuration comes from the environment (CONTRACT.md): ``DURABLE_PAYMENTS_URL`` and
``STRIPE_API_KEY`` select a Stripe-compatible provider; tuning knobs are optional ``DURABLE_*``.
"""

from __future__ import annotations

import os

from dagster import EnvVar, JobDefinition

from durable_assets.kit import BatchRuntime, DurableJobs, IdempotencyLedger
from durable_assets.ops.auto_resume import AutoResumeSettings, auto_resume_sensor
from durable_assets.ops.batch_webhooks import webhook_sensors
from durable_assets.ops.retention import retention, retention_schedule
from durable_assets.payments.resources import PaymentGateway
from durable_assets.refunds.job import REFUND_JOB, refund_batch
from durable_assets.refunds.resources import CustomerMailbox, RefundLimits


def _env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def _optional_env(name: str) -> EnvVar | None:
    """EnvVar keeps secrets out of the UI's config view; only reference variables that are set."""
    return EnvVar(name) if os.environ.get(name) else None


#: The one registration point: every durable job of this code location, the default first.
durable_jobs = DurableJobs([refund_batch])

defs = durable_jobs.definitions(
    jobs=[retention],
    schedules=[retention_schedule],
    sensors=[
        *webhook_sensors(),  # terminal-status webhooks for runs the daemon launches
        # re-executes batches whose worker was lost and whose retry Dagster dropped
        auto_resume_sensor(AutoResumeSettings.from_env()),
    ],
    resources={
        "payments": PaymentGateway(
            payments_url=_optional_env("DURABLE_PAYMENTS_URL"),
            api_key=_optional_env("STRIPE_API_KEY"),
            concurrency=int(os.environ.get("DURABLE_CONCURRENCY", 16)),
            rate_limit_per_second=float(os.environ["DURABLE_RATE_LIMIT"])
            if os.environ.get("DURABLE_RATE_LIMIT")
            else None,
            provider_down_budget_seconds=_env_float("DURABLE_PROVIDER_DOWN_BUDGET_S", 60.0),
        ),
        "ledger": IdempotencyLedger(
            provider_key_retention_hours=_env_float("DURABLE_KEY_RETENTION_HOURS", 24.0)
        ),
        "runtime": BatchRuntime(
            lease_ttl_seconds=_env_float("DURABLE_LEASE_TTL_S", 15.0),
            step_delay_seconds=_env_float("DURABLE_STEP_DELAY_S", 0.0),
        ),
        "mailbox": CustomerMailbox(),
        "limits": RefundLimits(
            max_refunds_per_batch=int(os.environ.get("DURABLE_MAX_REFUNDS_PER_BATCH", 100_000)),
            max_amount_per_batch_cents=int(os.environ.get("DURABLE_MAX_AMOUNT_PER_BATCH_CENTS", 100_000_000)),
        ),
    },
)


def refund_batch_job() -> JobDefinition:
    """Module-level factory so ``reconstructable`` can rebuild the job in any process."""
    return durable_jobs.job_definition(REFUND_JOB)
