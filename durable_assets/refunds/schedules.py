"""The daily refund batch: ``daily-YYYY-MM-DD`` at 02:00 UTC, when the previous day's invoices are final.

The scheduling itself (idempotent ticks, shipped stopped, 02:00 UTC by default) is the kit's
:class:`DailyBatches`.
"""

from __future__ import annotations

from durable_assets.kit import DailyBatches

DAILY_SCHEDULE = "daily_refund_batch"
#: A file per day, e.g. ``/data/invoices/{date}.csv``; unset = a synthetic batch (demos).
INVOICES_TEMPLATE_ENV = "DURABLE_DAILY_INVOICES"

DAILY_REFUNDS = DailyBatches(
    schedule_name=DAILY_SCHEDULE,
    id_prefix="daily",
    input_env=INVOICES_TEMPLATE_ENV,
    description="One refund batch per day.",
)
