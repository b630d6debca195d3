"""Webhooks for every durable job: :mod:`.outbox` signs and delivers at least once through a
durable outbox (Standard Webhooks v1); :mod:`.batch` decides which batch events become messages and
enqueues them from the CLI and the daemon's sensors.

A receiver verifies what it gets with :func:`verify` (``from durable_assets.ops.webhooks import verify``).
"""

from durable_assets.ops.webhooks.outbox import verify

__all__ = ["verify"]
