"""The nightly credit migration: ``credits-YYYY-MM-DD`` at 03:00 UTC, after the legacy system's
nightly export. Ships stopped, like every schedule that moves money (the kit's :class:`DailyBatches`)."""

from __future__ import annotations

from durable_assets.kit import DailyBatches

NIGHTLY_SCHEDULE = "nightly_credit_migration"
#: A file per night, e.g. ``/data/legacy/credits-{date}.csv``; unset = a synthetic export (demos).
EXPORT_TEMPLATE_ENV = "DURABLE_NIGHTLY_CREDITS"

NIGHTLY_CREDITS = DailyBatches(
    schedule_name=NIGHTLY_SCHEDULE,
    id_prefix="credits",
    input_env=EXPORT_TEMPLATE_ENV,
    cron="0 3 * * *",
    description="Migrates the night's legacy credit export into provider customer balances.",
)
