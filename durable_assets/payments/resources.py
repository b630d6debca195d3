"""The payment provider as a Dagster resource, shared by every pipeline that talks to it, and the
CLI's way of asking which provider account a batch would talk to before the batch exists."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from dagster import ConfigurableResource, InitResourceContext
from pydantic import Field, PrivateAttr

from durable_assets.errors import (
    ProviderConfigError,
    ProviderError,
    ProviderRejectedError,
    ProviderResponseMismatchError,
    ProviderUnavailableError,
)
from durable_assets.kit import call_with_retries, shared_limiter
from durable_assets.kit.runtime import (
    EXECUTOR_TAG,
    Backoff,
    DurableDatabase,
    ExecutorKind,
    KitSettings,
    ListCursors,
    ProviderAccount,
    RateLimiter,
    account_limiter,
)
from durable_assets.payments.gateway import (
    CustomerGateway,
    EmbeddedGateway,
    RefundGateway,
    StripeGateway,
    gateway_from_settings,
)

#: The declared defaults (no environment read here): the code location passes its environment's.
_KIT = KitSettings()

#: How long a run reuses the answer :func:`resolve_provider_account` got in the same thread, for the
#: same provider and key, to "which account is this key?". A Stripe secret key belongs to one
#: account for its life, so the answer `job run` got checking the provider is the one the run's
#: first step (in that thread) would get a moment later: one round trip (a provider latency) fewer
#: before the first effect. A run with no such check just before it (launched from the UI, a
#: schedule, a worker) asks itself.
ACCOUNT_ANSWER_REUSE_S = 60.0


@dataclass(frozen=True)
class _CheckedAccount:
    provider_and_key: str  # a digest: never the key itself
    account: ProviderAccount
    at: float  # time.monotonic()


_checked_here: ContextVar[_CheckedAccount | None] = ContextVar("durable_checked_account", default=None)


def _provider_and_key(provider: str, api_key: str | None) -> str:
    return hashlib.sha256(f"{provider}\n{api_key or ''}".encode()).hexdigest()


def _remember_checked(provider: str, api_key: str | None, account: ProviderAccount) -> None:
    _checked_here.set(_CheckedAccount(_provider_and_key(provider, api_key), account, time.monotonic()))


def _recently_checked(provider: str, api_key: str | None) -> ProviderAccount | None:
    checked = _checked_here.get()
    if checked is None or checked.provider_and_key != _provider_and_key(provider, api_key):
        return None
    return checked.account if time.monotonic() - checked.at <= ACCOUNT_ANSWER_REUSE_S else None


def forget_checked_account() -> None:
    """Forget this thread's last check (a test that starts providers anew at the same address)."""
    _checked_here.set(None)


def _provider_name(payments_url: str | None, embedded_path: str) -> str:
    """One name per provider: its base URL, or the embedded store's file."""
    return payments_url or f"embedded:{embedded_path}"


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
    # The tuning fields default to the kit's declared defaults; the code location sets them from
    # its environment (DURABLE_CONCURRENCY, DURABLE_RATE_LIMIT, DURABLE_PROVIDER_DOWN_BUDGET_S).
    concurrency_limit: int = Field(
        default=_KIT.concurrency, ge=1, le=256, description="Concurrent requests (DURABLE_CONCURRENCY)"
    )
    rate_limit_per_second: float | None = Field(
        default=_KIT.rate_limit, gt=0, description="Client-side cap on requests/s (DURABLE_RATE_LIMIT)"
    )
    provider_down_budget_seconds: float = Field(
        default=_KIT.provider_down_budget_s,
        gt=0,
        description="How long the provider may let nothing through before the step fails "
        "(DURABLE_PROVIDER_DOWN_BUDGET_S)",
    )
    timeout_seconds: float = 10.0

    _gateway: EmbeddedGateway | StripeGateway | None = PrivateAttr(default=None)
    _provider: str = PrivateAttr(default="")
    _shared: RateLimiter | None = PrivateAttr(default=None)
    _account: ProviderAccount | None = PrivateAttr(default=None)
    _account_lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _cursors: ListCursors | None = PrivateAttr(default=None)

    def setup_for_execution(self, context: InitResourceContext) -> None:
        self._account = None
        embedded = str(instance_dir(context) / "payments.db")
        self._gateway = gateway_from_settings(self.payments_url, self.api_key, embedded)
        self._provider = _provider_name(self.payments_url, embedded)
        if context.instance is not None:
            self._cursors = ListCursors(DurableDatabase.for_instance(context.instance))
        run = context.dagster_run
        distributed = run is not None and run.tags.get(EXECUTOR_TAG) == ExecutorKind.CELERY.value
        if distributed and self.rate_limit and context.instance is not None:
            # N workers with the same per-process cap would send N times it: the account's one
            # bucket, in the instance's database, is shared by every worker of every batch.
            self._shared = account_limiter(
                DurableDatabase.for_instance(context.instance), self._provider, self.rate_limit
            )

    @property
    def gateway(self) -> RefundGateway:
        """Charges and refunds."""
        return self._open()

    @property
    def customers(self) -> CustomerGateway:
        """Customers and their balance transactions."""
        return self._open()

    @property
    def account(self) -> ProviderAccount:
        """The provider account this run talks to, asked once (paced and retried like any call)
        the first time a step needs it, then kept for the run: one request, not one per step. When
        this thread checked the provider for the same key within :data:`ACCOUNT_ANSWER_REUSE_S`
        (`job run` and `job resume` do, just before an in-process run), that answer is the one."""
        gateway = self._open()
        with self._account_lock:
            if self._account is None:
                self._account = _recently_checked(self._provider, self.api_key)
            if self._account is None:
                answer = call_with_retries(
                    lambda: {"account": gateway.account()}, self.limiter(), self.backoff()
                )
                self._account = answer["account"]
            return self._account

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
        return shared_limiter(self._provider, self.rate_limit)

    @property
    def concurrency(self) -> int:
        return self.concurrency_limit

    def page_cursors(self, list_name: str) -> tuple[str, ...]:
        """Where each page of ``list_name`` began when this account's list was last read whole
        (by any process of this instance; none outside a run): see ``ListCursors``."""
        return self._cursors.get(self._list_key(list_name)) if self._cursors else ()

    def remember_page_cursors(self, list_name: str, cursors: Sequence[str]) -> None:
        if self._cursors is not None:
            self._cursors.put(self._list_key(list_name), cursors)

    def _list_key(self, list_name: str) -> str:
        """This provider, this key and the list, as a digest (never the key itself, and never
        longer than the column, however long an embedded provider's path): another account's
        customers are another list."""
        named = "\n".join((self._provider, self.api_key or "", list_name))
        return f"{list_name}:{hashlib.sha256(named.encode()).hexdigest()}"

    @property
    def rate_limit(self) -> float | None:
        return self.rate_limit_per_second

    def backoff(self) -> Backoff:
        return Backoff(down_budget_s=self.provider_down_budget_seconds)


#: How long the CLI lets the provider answer 429s and 5xx before calling it unusable: long enough
#: for a provider that is briefly busy, short enough that a wrong URL is reported in seconds.
RESOLVE_BUDGET_S = 10.0


def resolve_provider_account(
    payments_url: str | None,
    api_key: str | None,
    instance_root: Path,
    *,
    budget_s: float = RESOLVE_BUDGET_S,
) -> ProviderAccount:
    """The account a batch of this instance would talk to, asked before the batch exists, so a
    provider unusable as configured is a one-line usage error (exit 2) instead of a failed step.

    Opens the gateway the resource would open (the embedded store at ``instance_root/payments.db``
    when ``payments_url`` is unset), asks for its account and closes it. Transient faults (429,
    5xx, no answer) are retried for ``budget_s``.
    """
    embedded = str(instance_root / "payments.db")
    gateway = gateway_from_settings(payments_url, api_key, embedded)
    try:
        answer = call_with_retries(
            lambda: {"account": gateway.account()}, RateLimiter(), Backoff(down_budget_s=budget_s)
        )
        account: ProviderAccount = answer["account"]
        _remember_checked(_provider_name(payments_url, embedded), api_key, account)
        return account
    except ProviderUnavailableError as error:
        raise ProviderConfigError(
            f"The payment provider at DURABLE_PAYMENTS_URL={payments_url} gave no usable answer for "
            f"{budget_s:g} s ({_cause(error)}): start it, or correct DURABLE_PAYMENTS_URL "
            "(unset it to use the embedded provider)."
        ) from error
    except ProviderRejectedError as error:
        if error.http_status in (401, 403):
            raise ProviderConfigError(
                f"The payment provider at DURABLE_PAYMENTS_URL={payments_url} refused STRIPE_API_KEY "
                f"(HTTP {error.http_status}): set STRIPE_API_KEY to a secret key of that account."
            ) from error
        raise ProviderConfigError(
            f"DURABLE_PAYMENTS_URL={payments_url} did not answer GET /v1/account as a Stripe-compatible "
            f"API would ({_cause(error)}): point DURABLE_PAYMENTS_URL at the API's base URL."
        ) from error
    except ProviderResponseMismatchError as error:
        raise ProviderConfigError(
            f"DURABLE_PAYMENTS_URL={payments_url} answered GET /v1/account without a Stripe account id, "
            "so its effects could not be told apart from another account's: point DURABLE_PAYMENTS_URL "
            "at a Stripe-compatible API."
        ) from error
    finally:
        gateway.close()


#: Network failures worth naming in a one-line error; the transport's own text is a paragraph.
_NETWORK_REASONS = ("Connection refused", "timed out", "Name or service not known", "No route to host")


def _cause(error: BaseException) -> str:
    """The provider's last answer in a few words: its status and message, or why there was none."""
    last = error.__cause__ or error.__context__
    text = " ".join(str(last if last else error).split())
    if last is None:  # the down budget's error quotes the last answer instead of chaining it
        text = text.partition("Last answer: ")[2] or text
    if (isinstance(last, ProviderError) and last.http_status is None) or "no answer from" in text:
        reason = next((reason for reason in _NETWORK_REASONS if reason.lower() in text.lower()), "")
        return f"no answer: {reason.lower()}" if reason else "no answer"
    return text.removeprefix("Payment provider: ").partition(". Retry")[0][:200]
