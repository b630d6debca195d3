"""Which provider account a batch's side effects go to, and why every key carries it.

Stripe scopes idempotency keys per account: the same key sent to two accounts is two requests. Our
ledger must do the same, or a batch pointed at a second account (test mode then live mode, a second
simulator, the embedded provider) would take the first account's settled keys and provider IDs as
its own: a refund "already issued" that never was, a customer ID that does not exist there.

So a :class:`ProviderAccount` names the account (the provider's own id plus live/test mode), the
ledger files every entry and effect subject under its :attr:`~ProviderAccount.namespace`, and each
batch is bound to the account it started with (:mod:`durable_assets.kit.account_bindings`): a
resume against another account is refused instead of silently starting over somewhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

#: The ledger namespace of entries written before accounts were recorded (migration 0004); the
#: first account a batch of the upgraded instance binds adopts them (see ``AccountBindings.bind``).
UNBOUND_NAMESPACE: Final = ""
#: The namespace of effects whose step names no provider account (a job with one foreign system).
DEFAULT_NAMESPACE: Final = "default"


@dataclass(frozen=True)
class ProviderAccount:
    """One account at one provider. ``kind`` is the provider's family (``embedded``, ``stripe``, or
    a job's own), ``account`` the provider's id for the account, ``livemode`` whether money is real."""

    kind: str
    account: str
    livemode: bool = False

    def __post_init__(self) -> None:
        if not self.kind or not self.account:
            raise ValueError("a provider account needs a kind and an account id")

    @property
    def namespace(self) -> str:
        """The ledger's name for this account: one account in two modes is two namespaces, as at Stripe."""
        return f"{self.kind}:{self.account}:{'live' if self.livemode else 'test'}"

    def describe(self) -> str:
        """``stripe account acct_1 (test mode)``: for errors and summaries."""
        return f"{self.kind} account {self.account} ({'live' if self.livemode else 'test'} mode)"

    def as_json(self) -> dict[str, str | bool]:
        return {"kind": self.kind, "account": self.account, "livemode": self.livemode}
