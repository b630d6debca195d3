"""The Dagster code location: the refund pipeline wired to the durability kit.

Configuration comes from the environment (CONTRACT.md): ``DURABLE_PAYMENTS_URL`` and
``STRIPE_API_KEY`` select a Stripe-compatible provider; tuning knobs are optional ``DURABLE_*``.
"""

from __future__ import annotations

import os

from dagster import (
    AssetSelection,
    Definitions,
    EnvVar,
    JobDefinition,
    define_asset_job,
    in_process_executor,
)

from durable_assets.kit.resources import BatchRuntime, IdempotencyLedger
from durable_assets.ops.auto_resume import AutoResumeSettings, auto_resume_sensor
from durable_assets.ops.batch_webhooks import webhook_sensors
from durable_assets.ops.retention import retention, retention_schedule
from durable_assets.payments.resources import PaymentGateway
from durable_assets.refunds.assets import ALL_ASSETS, BATCHES
from durable_assets.refunds.checks import ALL_CHECKS
from durable_assets.refunds.resources import CustomerMailbox, RefundLimits
from durable_assets.refunds.schedules import build_daily_schedule

REFUND_JOB = "refund_batch"


def _env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def _optional_env(name: str) -> EnvVar | None:
    """EnvVar keeps secrets out of the UI's config view; only reference variables that are set."""
    return EnvVar(name) if os.environ.get(name) else None


# The in-process executor runs all steps in the run worker's process: ~0.1 s per step instead of
# ~4 s to spawn a subprocess per step. The cost: no process isolation between steps (one step's
# crash takes the run worker down), which leases and resume are built to absorb.
refund_batch = define_asset_job(
    REFUND_JOB,
    selection=AssetSelection.assets(*ALL_ASSETS),
    partitions_def=BATCHES,
    executor_def=in_process_executor,
    description="One refund batch, end to end. Partition = batch ID.",
)

defs = Definitions(
    assets=ALL_ASSETS,
    asset_checks=ALL_CHECKS,
    jobs=[refund_batch, retention],
    schedules=[build_daily_schedule(refund_batch), retention_schedule],
    executor=in_process_executor,
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
    return defs.resolve_job_def(REFUND_JOB)
