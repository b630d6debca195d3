"""The payment provider's variables: which provider, and its key.

Read where the code location is wired (durable_assets/definitions.py): the gateway resource gets
them as ``EnvVar``s, so the key never shows in the UI.
"""

from __future__ import annotations

from durable_assets.settings import Section, var


class PaymentSettings(Section):
    """A Stripe-compatible provider, or (unset) the embedded one."""

    payments_url: str | None = var(
        "DURABLE_PAYMENTS_URL",
        None,
        "a Stripe-compatible API (official `stripe` SDK)",
        unset="unset = embedded provider",
    )
    stripe_api_key: str | None = var(
        "STRIPE_API_KEY",
        None,
        "the provider's secret key (passed to Dagster as an `EnvVar`, never shown in the UI)",
        unset="— (required with `DURABLE_PAYMENTS_URL`)",
        secret=True,
    )
