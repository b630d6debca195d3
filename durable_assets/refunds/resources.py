"""Resources of the refund pipeline: the customer mailbox and the money limits."""

from __future__ import annotations

from dagster import ConfigurableResource, InitResourceContext
from pydantic import PrivateAttr

from durable_assets.kit import Guardrails, amount_ceiling, count_ceiling
from durable_assets.payments.resources import instance_dir
from durable_assets.refunds.notices import Mailbox
from durable_assets.refunds.settings import RefundSettings


class CustomerMailbox(ConfigurableResource):
    """Where customer notices are delivered (a mailbox file in the instance)."""

    path: str | None = None

    _mailbox: Mailbox | None = PrivateAttr(default=None)

    def setup_for_execution(self, context: InitResourceContext) -> None:
        self._mailbox = Mailbox(self.path or instance_dir(context) / "mailbox.db")

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        if self._mailbox is not None:
            self._mailbox.close()

    @property
    def mailbox(self) -> Mailbox:
        if self._mailbox is None:
            raise RuntimeError("CustomerMailbox used outside a run")
        return self._mailbox


class RefundLimits(Guardrails):
    """Per-batch ceilings: a bad input or policy bug cannot drain the account. Pinned with the batch
    at its first run (``Guardrails``): a resume from another shell keeps them."""

    env_vars = RefundSettings.variables_of("max_refunds_per_batch", "max_amount_per_batch_cents")

    max_refunds_per_batch: int = count_ceiling(RefundSettings().max_refunds_per_batch)
    max_amount_per_batch_cents: int = amount_ceiling(RefundSettings().max_amount_per_batch_cents)
