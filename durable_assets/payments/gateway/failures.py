"""The provider's failures as :mod:`durable_assets.errors`: one mapping for both transports, so a
retry policy written against one behaves identically against the other.
"""

from __future__ import annotations

import email.utils
import math
import time

from durable_assets.errors import (
    DurableError,
    IdempotencyKeyEndpointError,
    IdempotencyKeyInFlightError,
    IdempotencyKeyMismatchError,
    ProviderRejectedError,
    ProviderResponseMismatchError,
    TransientProviderError,
)

#: How Stripe's 400 ``idempotency_error`` tells a key reused on another endpoint (it has no code).
_OTHER_ENDPOINT = "can only be used for the same endpoint"


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
    if error_type == "idempotency_error" and _OTHER_ENDPOINT in message:
        return IdempotencyKeyEndpointError(
            f"{detail}. The idempotency key{key} was first used on another endpoint; nothing was changed. "
            "A key must name one request: derive it from the business identity and the kind of effect."
        )
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
