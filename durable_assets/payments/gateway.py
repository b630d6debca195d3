"""The seam the refund step talks to, and its two implementations.

The refund step must not care whether refunds go to the embedded provider or over HTTP to a
Stripe-compatible API: both gateways share one template (:class:`_GatewayBase`) that builds the
request, validates the answer and maps failures onto :mod:`durable_assets.errors`. Only the
transport differs, so a retry policy written against one behaves identically against the other.

Everything the provider answers is checked against what was asked (amount, currency, charge,
idempotency key) and anything that does not match raises
:class:`~durable_assets.errors.ProviderResponseMismatchError`: for money, failing closed is the
only safe reaction to an answer we do not understand.
"""

from __future__ import annotations

import email.utils
import math
import sqlite3
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

import requests
import stripe

from durable_assets.errors import (
    DurableError,
    IdempotencyKeyInFlightError,
    IdempotencyKeyMismatchError,
    ProviderRejectedError,
    ProviderResponseMismatchError,
    TransientProviderError,
    UsageError,
)
from durable_assets.payments.embedded import EmbeddedProvider
from durable_assets.payments.store import JsonObject, StripeApiError

#: Metadata keys the gateways own; callers may not set them to something else.
IDEMPOTENCY_KEY_METADATA = "idempotency_key"
DURABLE_REASON_METADATA = "durable_reason"
DEFAULT_PAGE_SIZE = 100

StripeReason = Literal["duplicate", "requested_by_customer"]
_T = TypeVar("_T")


# --- values --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Charge:
    id: str
    amount: int
    currency: str
    amount_refunded: int
    status: str
    metadata: dict[str, str] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class Refund:
    id: str
    amount: int
    currency: str
    charge_id: str
    status: str
    reason: str | None
    metadata: dict[str, str] = field(default_factory=dict, hash=False)

    @property
    def idempotency_key(self) -> str | None:
        """The key is kept in metadata because providers forget idempotency keys (Stripe: 24 h)."""
        return self.metadata.get(IDEMPOTENCY_KEY_METADATA)

    @property
    def durable_reason(self) -> str | None:
        """Our own reason; Stripe's ``reason`` enum is too coarse to carry it."""
        return self.metadata.get(DURABLE_REASON_METADATA)


class RefundGateway(Protocol):
    """What the refund step needs from a payment provider. Implementations are thread-safe."""

    def create_charge(
        self, *, amount: int, currency: str, customer: str, metadata: dict[str, str], idempotency_key: str
    ) -> Charge: ...

    def create_refund(
        self,
        *,
        charge_id: str,
        amount: int,
        currency: str,
        reason: str,
        metadata: dict[str, str],
        idempotency_key: str,
    ) -> Refund: ...

    def retrieve_refund(self, refund_id: str) -> Refund: ...

    def find_refund_by_key(self, *, charge_id: str, idempotency_key: str) -> Refund | None: ...


# --- request building ----------------------------------------------------------------------------


def stripe_reason(reason: str) -> StripeReason:
    """Stripe accepts only duplicate|fraudulent|requested_by_customer; ours goes to metadata."""
    return "duplicate" if reason == "duplicate_charge" else "requested_by_customer"


def with_owned_metadata(metadata: Mapping[str, str], owned: Mapping[str, str]) -> dict[str, str]:
    """Adds the keys the gateway owns; a caller value that disagrees is a bug, not a preference."""
    for name, value in owned.items():
        if name in metadata and metadata[name] != value:
            raise UsageError(
                f"metadata[{name!r}] is set by the payment gateway; "
                f"got {metadata[name]!r}, expected {value!r}."
            )
    return {**metadata, **owned}


# --- failure mapping -----------------------------------------------------------------------------


def provider_error(
    *,
    http_status: int | None,
    error_type: str | None,
    code: str | None,
    message: str,
    retry_after: float | None = None,
    idempotency_key: str | None = None,
) -> DurableError:
    """One mapping for both gateways, so retry decisions never depend on the transport."""
    status = "no response" if http_status is None else f"HTTP {http_status}"
    detail = f"Payment provider: {message} ({status}"
    detail += f", code {code})" if code else ")"
    key = f" {idempotency_key!r}" if idempotency_key else ""
    retry = f"{detail}. Retry later with the same idempotency key{key}."
    if http_status == 409 and (code == "idempotency_key_in_use" or error_type == "idempotency_error"):
        return IdempotencyKeyInFlightError(retry)
    if http_status is None or http_status in (409, 429) or http_status >= 500:
        return TransientProviderError(retry, http_status=http_status, code=code, retry_after=retry_after)
    if error_type == "idempotency_error":
        return IdempotencyKeyMismatchError(
            f"{detail}. The idempotency key{key} was first used with different parameters; nothing was "
            "changed. Keys and request parameters must both derive from business identity only."
        )
    if 400 <= http_status < 500:
        return ProviderRejectedError(
            f"{detail}. Retrying will not help; fix the request.", http_status=http_status, code=code
        )
    return ProviderResponseMismatchError(
        f"{detail}. Unexpected status; treating the outcome as unknown.", http_status=http_status, code=code
    )


def parse_retry_after(value: str | None) -> float | None:
    """Seconds (fractional allowed, as the simulator sends) or an HTTP date."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return None
    return max(0.0, seconds) if math.isfinite(seconds) else None


# --- response validation -------------------------------------------------------------------------


def _mismatch(what: str, body: object) -> ProviderResponseMismatchError:
    return ProviderResponseMismatchError(
        f"Payment provider answered with {what}; failing closed. Answer: {str(body)[:500]}"
    )


def _field(body: Mapping[str, Any], name: str, kind: type[_T]) -> _T:
    value = body.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise _mismatch(f"a malformed {name!r}", body)
    return value


def _metadata(body: Mapping[str, Any]) -> dict[str, str]:
    raw = body.get("metadata")
    raw = {} if raw is None else raw
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
    ):
        raise _mismatch("malformed metadata", body)
    return dict(raw)


def _object(body: object, kind: str) -> Mapping[str, Any]:
    if not isinstance(body, dict) or body.get("object") != kind:
        raise _mismatch(f"something that is not a {kind}", body)
    return body


def parse_refund(body: object) -> Refund:
    data = _object(body, "refund")
    charge = data.get("charge")
    charge_id = charge.get("id") if isinstance(charge, dict) else charge  # expanded or not
    reason = data.get("reason")
    if not isinstance(charge_id, str) or not (reason is None or isinstance(reason, str)):
        raise _mismatch("a refund without a valid charge or reason", body)
    return Refund(
        id=_field(data, "id", str),
        amount=_field(data, "amount", int),
        currency=_field(data, "currency", str),
        charge_id=charge_id,
        status=_field(data, "status", str),
        reason=reason,
        metadata=_metadata(data),
    )


def parse_charge(body: object) -> Charge:
    data = _object(body, "charge")
    return Charge(
        id=_field(data, "id", str),
        amount=_field(data, "amount", int),
        currency=_field(data, "currency", str),
        amount_refunded=_field(data, "amount_refunded", int),
        status=_field(data, "status", str),
        metadata=_metadata(data),
    )


def _expect(body: object, what: str, actual: object, expected: object) -> None:
    if actual != expected:
        raise _mismatch(f"{what} {actual!r} where {expected!r} was asked", body)


def _parse_page(body: object) -> tuple[list[Refund], bool]:
    data = _object(body, "list")
    items = data.get("data")
    has_more = data.get("has_more")
    if not isinstance(items, list) or not isinstance(has_more, bool):
        raise _mismatch("a malformed list", body)
    return [parse_refund(item) for item in items], has_more


# --- the shared template -------------------------------------------------------------------------


class _GatewayBase(ABC):
    """Request building, answer validation and pagination; subclasses supply only transport."""

    def __init__(self, *, page_size: int) -> None:
        if not 1 <= page_size <= 100:
            raise UsageError(f"page_size must be 1..100, got {page_size}.")
        self._page_size = page_size

    def create_charge(
        self, *, amount: int, currency: str, customer: str, metadata: dict[str, str], idempotency_key: str
    ) -> Charge:
        currency = currency.lower()
        owned = with_owned_metadata(metadata, {IDEMPOTENCY_KEY_METADATA: idempotency_key})
        body = self._post_charge(
            amount=amount,
            currency=currency,
            customer=customer,
            metadata=owned,
            idempotency_key=idempotency_key,
        )
        charge = parse_charge(body)
        _expect(body, "a charge amount of", charge.amount, amount)
        _expect(body, "a charge currency of", charge.currency, currency)
        _expect(body, "a charge key of", charge.metadata.get(IDEMPOTENCY_KEY_METADATA), idempotency_key)
        return charge

    def create_refund(
        self,
        *,
        charge_id: str,
        amount: int,
        currency: str,
        reason: str,
        metadata: dict[str, str],
        idempotency_key: str,
    ) -> Refund:
        """``currency`` is not sent (Stripe refunds inherit the charge's); it is checked on the answer."""
        owned = with_owned_metadata(
            metadata, {IDEMPOTENCY_KEY_METADATA: idempotency_key, DURABLE_REASON_METADATA: reason}
        )
        body = self._post_refund(
            charge=charge_id,
            amount=amount,
            reason=stripe_reason(reason),
            metadata=owned,
            idempotency_key=idempotency_key,
        )
        refund = parse_refund(body)
        _expect(body, "a refund of charge", refund.charge_id, charge_id)
        _expect(body, "a refund amount of", refund.amount, amount)
        _expect(body, "a refund currency of", refund.currency, currency.lower())
        _expect(body, "a refund key of", refund.idempotency_key, idempotency_key)
        return refund

    def retrieve_refund(self, refund_id: str) -> Refund:
        body = self._get_refund(refund_id)
        refund = parse_refund(body)
        _expect(body, "refund", refund.id, refund_id)
        return refund

    def find_refund_by_key(self, *, charge_id: str, idempotency_key: str) -> Refund | None:
        """Reads every page, so a second refund with the same key (a broken exactly-once
        guarantee) is reported instead of silently picking one."""
        matches: list[Refund] = []
        seen: set[str] = set()
        starting_after: str | None = None
        while True:
            page = self._list_refunds(charge=charge_id, limit=self._page_size, starting_after=starting_after)
            refunds, has_more = _parse_page(page)
            for refund in refunds:
                _expect(page, "a refund of charge", refund.charge_id, charge_id)
                if refund.id in seen:  # a cursor that does not advance would loop forever
                    raise _mismatch(f"refund {refund.id} twice while paginating", page)
                seen.add(refund.id)
            matches += [refund for refund in refunds if refund.idempotency_key == idempotency_key]
            if not has_more or not refunds:
                break
            starting_after = refunds[-1].id
        if len(matches) > 1:
            ids = ", ".join(refund.id for refund in matches)
            raise ProviderResponseMismatchError(
                f"Charge {charge_id} has {len(matches)} refunds with idempotency key {idempotency_key!r} "
                f"({ids}); exactly-once was violated upstream. Investigate before refunding anything else."
            )
        return matches[0] if matches else None

    # transport, implemented by subclasses; each returns the provider's JSON object as a dict

    @abstractmethod
    def _post_charge(
        self, *, amount: int, currency: str, customer: str, metadata: dict[str, str], idempotency_key: str
    ) -> object: ...

    @abstractmethod
    def _post_refund(
        self,
        *,
        charge: str,
        amount: int,
        reason: StripeReason,
        metadata: dict[str, str],
        idempotency_key: str,
    ) -> object: ...

    @abstractmethod
    def _get_refund(self, refund_id: str) -> object: ...

    @abstractmethod
    def _list_refunds(self, *, charge: str, limit: int, starting_after: str | None) -> object: ...


# --- embedded ------------------------------------------------------------------------------------


class EmbeddedGateway(_GatewayBase):
    """The in-instance provider behind the same seam; nothing to start."""

    def __init__(self, path: str, *, page_size: int = DEFAULT_PAGE_SIZE) -> None:
        super().__init__(page_size=page_size)
        self._provider = EmbeddedProvider(path)

    def stats(self) -> dict[str, int]:
        return self._provider.stats()

    def close(self) -> None:
        self._provider.close()

    def _post_charge(
        self, *, amount: int, currency: str, customer: str, metadata: dict[str, str], idempotency_key: str
    ) -> object:
        return _embedded_call(
            lambda: self._provider.create_charge(
                amount=amount,
                currency=currency,
                customer=customer,
                metadata=metadata,
                idempotency_key=idempotency_key,
            ),
            idempotency_key,
        )

    def _post_refund(
        self,
        *,
        charge: str,
        amount: int,
        reason: StripeReason,
        metadata: dict[str, str],
        idempotency_key: str,
    ) -> object:
        return _embedded_call(
            lambda: self._provider.create_refund(
                charge=charge,
                amount=amount,
                reason=reason,
                metadata=metadata,
                idempotency_key=idempotency_key,
            ),
            idempotency_key,
        )

    def _get_refund(self, refund_id: str) -> object:
        return _embedded_call(lambda: self._provider.retrieve_refund(refund_id))

    def _list_refunds(self, *, charge: str, limit: int, starting_after: str | None) -> object:
        return _embedded_call(
            lambda: self._provider.list_refunds(limit=limit, starting_after=starting_after, charge=charge)
        )


def _embedded_call(request: Callable[[], JsonObject], idempotency_key: str | None = None) -> JsonObject:
    """A locked-out database is the embedded twin of a 5xx: nothing committed, safe to retry."""
    try:
        return request()
    except StripeApiError as error:
        raise provider_error(
            http_status=error.http_status,
            error_type=error.error_type,
            code=error.code,
            message=error.message,
            idempotency_key=idempotency_key,
        ) from error
    except sqlite3.OperationalError as error:
        raise provider_error(
            http_status=None, error_type=None, code="database_unavailable", message=str(error)
        ) from error


# --- Stripe SDK ----------------------------------------------------------------------------------


class StripeGateway(_GatewayBase):
    """A Stripe-compatible API through the official SDK.

    The SDK's own retries are off (``max_network_retries=0``): retrying is the caller's decision,
    made with the same idempotency key and visible in its ledger. ``RequestsClient`` keeps one
    keep-alive session per thread, which makes the gateway safe and fast from many threads.
    """

    def __init__(
        self, base_url: str, api_key: str, timeout_s: float = 10.0, *, page_size: int = DEFAULT_PAGE_SIZE
    ) -> None:
        super().__init__(page_size=page_size)
        self._base_url = base_url.rstrip("/")
        self._timeout_s = timeout_s
        self._client = stripe.StripeClient(
            api_key,
            base_addresses={"api": self._base_url},
            max_network_retries=0,
            http_client=stripe.RequestsClient(timeout=timeout_s),
        )

    def stats(self) -> dict[str, int]:
        """The simulator's counters (``GET /_sim/stats``); real Stripe has no such route."""
        try:
            response = requests.get(f"{self._base_url}/_sim/stats", timeout=self._timeout_s)
            response.raise_for_status()
            return {str(name): int(value) for name, value in response.json().items()}
        except (requests.RequestException, ValueError, AttributeError) as error:
            raise TransientProviderError(f"Payment simulator stats unavailable: {error}") from error

    def _post_charge(
        self, *, amount: int, currency: str, customer: str, metadata: dict[str, str], idempotency_key: str
    ) -> object:
        return _sdk_call(
            lambda: self._client.v1.charges.create(
                params={"amount": amount, "currency": currency, "customer": customer, "metadata": metadata},
                options={"idempotency_key": idempotency_key},
            ),
            idempotency_key,
        )

    def _post_refund(
        self,
        *,
        charge: str,
        amount: int,
        reason: StripeReason,
        metadata: dict[str, str],
        idempotency_key: str,
    ) -> object:
        return _sdk_call(
            lambda: self._client.v1.refunds.create(
                params={"charge": charge, "amount": amount, "reason": reason, "metadata": metadata},
                options={"idempotency_key": idempotency_key},
            ),
            idempotency_key,
        )

    def _get_refund(self, refund_id: str) -> object:
        return _sdk_call(lambda: self._client.v1.refunds.retrieve(refund_id))

    def _list_refunds(self, *, charge: str, limit: int, starting_after: str | None) -> object:
        if starting_after is None:
            return _sdk_call(lambda: self._client.v1.refunds.list(params={"charge": charge, "limit": limit}))
        return _sdk_call(
            lambda: self._client.v1.refunds.list(
                params={"charge": charge, "limit": limit, "starting_after": starting_after}
            )
        )


def _sdk_call(request: Callable[[], stripe.StripeObject], idempotency_key: str | None = None) -> object:
    try:
        answer = request()
    except stripe.APIConnectionError as error:
        raise provider_error(
            http_status=None,
            error_type=None,
            code="connection_error",
            message=f"no answer from DURABLE_PAYMENTS_URL ({_network_cause(error)})",
            idempotency_key=idempotency_key,
        ) from error
    except stripe.StripeError as error:
        raise _from_stripe_error(error, idempotency_key) from error
    try:
        return answer.to_dict()
    except Exception as error:  # the SDK built something we cannot read: outcome unknown
        raise _mismatch("an unreadable object", answer) from error


def _from_stripe_error(error: stripe.StripeError, idempotency_key: str | None) -> DurableError:
    body = error.json_body if isinstance(error.json_body, dict) else {}
    raw_details = body.get("error")
    details: dict[str, Any] = raw_details if isinstance(raw_details, dict) else {}
    return provider_error(
        http_status=error.http_status,
        error_type=details.get("type"),
        code=details.get("code") or error.code,
        message=str(details.get("message") or _one_line(error.user_message or str(error))),
        retry_after=parse_retry_after(_header(error.headers, "Retry-After")),
        idempotency_key=idempotency_key,
    )


def _header(headers: Mapping[str, str] | None, name: str) -> str | None:
    for key, value in (headers or {}).items():
        if key.lower() == name.lower():
            return value
    return None


def _network_cause(error: stripe.APIConnectionError) -> str:
    """Keeps the SDK's "(Network error: ...)" detail and drops its advice to email Stripe support."""
    text = _one_line(error.user_message or str(error))
    _, marker, cause = text.partition("(Network error: ")
    return cause.rstrip(")") if marker else text


def _one_line(text: str) -> str:
    """The SDK's messages are wrapped paragraphs; errors.py messages are single lines."""
    return " ".join(text.split())[:500] or "unknown error"


# --- factory -------------------------------------------------------------------------------------


def gateway_from_settings(payments_url: str | None, api_key: str | None, embedded_path: str) -> RefundGateway:
    """``DURABLE_PAYMENTS_URL`` unset means the embedded provider, per CONTRACT.md."""
    if not payments_url:
        return EmbeddedGateway(embedded_path)
    if not api_key:
        raise UsageError(
            "DURABLE_PAYMENTS_URL is set but STRIPE_API_KEY is not: set the provider's API key "
            "(any non-empty value for the simulator), "
            "or unset DURABLE_PAYMENTS_URL to use the embedded provider."
        )
    return StripeGateway(payments_url, api_key)
