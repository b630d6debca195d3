"""The payment provider as a Dagster resource, shared by every pipeline that talks to it."""

from __future__ import annotations

from pathlib import Path

from dagster import ConfigurableResource, InitResourceContext
from pydantic import Field, PrivateAttr

from durable_assets.kit.db import DurableDatabase
from durable_assets.kit.modes import EXECUTOR_TAG, ExecutorKind
from durable_assets.kit.pacing import Backoff, RateLimiter, account_limiter, shared_limiter
from durable_assets.payments.gateway import (
    CustomerGateway,
    EmbeddedGateway,
    RefundGateway,
    StripeGateway,
    gateway_from_settings,
)


def instance_dir(context: InitResourceContext) -> Path:
    if context.instance is None:
        raise RuntimeError("a durable job needs a Dagster instance (set DAGSTER_HOME)")
    return Path(context.instance.root_directory)


class PaymentGateway(ConfigurableResource):
    """The Stripe-compatible provider: embedded in the instance by default, or any base URL.

    Concurrency and the client-side rate limit are what make a 100k-refund batch take minutes,
    not hours, against a provider that answers in 100-500 ms and limits request rates. The rate is
    learned from the provider's 429s and shared by every step, check and thread of the process
    (:mod:`durable_assets.kit.pacing`); ``rate_limit_per_second`` only caps it.
    """

    payments_url: str | None = Field(default=None, description="Stripe-compatible base URL; unset = embedded")
    api_key: str | None = Field(default=None, description="Secret key for the provider (STRIPE_API_KEY)")
    concurrency: int = Field(default=16, ge=1, le=256)
    rate_limit_per_second: float | None = Field(default=None, description="Client-side cap on requests/s")
    provider_down_budget_seconds: float = Field(
        default=60.0,
        gt=0,
        description="How long the provider may let nothing through before the step fails "
        "(DURABLE_PROVIDER_DOWN_BUDGET_S)",
    )
    timeout_seconds: float = 10.0

    _gateway: EmbeddedGateway | StripeGateway | None = PrivateAttr(default=None)
    _provider: str = PrivateAttr(default="")
    _shared: RateLimiter | None = PrivateAttr(default=None)

    def setup_for_execution(self, context: InitResourceContext) -> None:
        embedded = str(instance_dir(context) / "payments.db")
        self._gateway = gateway_from_settings(self.payments_url, self.api_key, embedded)
        self._provider = self.payments_url or f"embedded:{embedded}"
        run = context.dagster_run
        distributed = run is not None and run.tags.get(EXECUTOR_TAG) == ExecutorKind.CELERY.value
        if distributed and self.rate_limit_per_second and context.instance is not None:
            # N workers with the same per-process cap would send N times it: the account's one
            # bucket, in the instance's database, is shared by every worker of every batch.
            self._shared = account_limiter(
                DurableDatabase.for_instance(context.instance), self._provider, self.rate_limit_per_second
            )

    @property
    def gateway(self) -> RefundGateway:
        """Charges and refunds."""
        return self._open()

    @property
    def customers(self) -> CustomerGateway:
        """Customers and their balance transactions."""
        return self._open()

    def _open(self) -> EmbeddedGateway | StripeGateway:
        if self._gateway is None:
            raise RuntimeError("PaymentGateway used outside a run")
        return self._gateway

    def limiter(self) -> RateLimiter:
        """The process's one limiter for this provider: what one step learns, the next one knows.

        In a distributed run the cap is the account's, shared with every other worker.
        """
        if self._shared is not None:
            return self._shared
        return shared_limiter(self._provider, self.rate_limit_per_second)

    def backoff(self) -> Backoff:
        return Backoff(down_budget_s=self.provider_down_budget_seconds)
