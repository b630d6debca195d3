"""The simulator's answers in Stripe's shape: status, JSON error body and the headers a Stripe
client reads (``Idempotent-Replayed``, ``Stripe-Should-Retry``, ``Retry-After``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from durable_assets.payments.params import JsonObject, StripeApiError
from durable_assets_testing.simulator.faults import format_retry_after


@dataclass(frozen=True)
class Response:
    status: int
    body: JsonObject
    headers: dict[str, str] = field(default_factory=dict)


def success_headers(key: str | None, replayed: bool) -> dict[str, str]:
    headers = {} if key is None else {"Idempotency-Key": key}
    if replayed:
        headers["Idempotent-Replayed"] = "true"
    return headers


def error_response(error: StripeApiError, key: str | None = None) -> Response:
    headers = success_headers(key, error.replayed)
    headers["Stripe-Should-Retry"] = "true" if error.http_status >= 500 else "false"
    return Response(error.http_status, error.to_body(), headers)


def api_error(message: str) -> Response:
    return Response(
        500, {"error": {"type": "api_error", "message": message}}, {"Stripe-Should-Retry": "true"}
    )


def unrecognized(method: str, path: str) -> Response:
    message = f"Unrecognized request URL ({method}: {path})."
    return Response(404, {"error": {"type": "invalid_request_error", "message": message}})


MISSING_KEY = (
    "You did not provide an API key. You need to provide your API key in the Authorization header, "
    "using Bearer auth (e.g. 'Authorization: Bearer YOUR_SECRET_KEY'). See "
    "https://stripe.com/docs/api#authentication for details, or we can help at https://support.stripe.com/."
)


def unauthorized(message: str) -> Response:
    """Stripe's 401: an ``invalid_request_error`` without code, and a Basic challenge."""
    return Response(
        401,
        {"error": {"type": "invalid_request_error", "message": message}},
        {"WWW-Authenticate": 'Basic realm="Stripe"', "Stripe-Should-Retry": "false"},
    )


def rate_limited(wait_s: float) -> Response:
    body = {
        "error": {
            "type": "invalid_request_error",
            "code": "rate_limit",
            "message": "Too many requests hit the API too quickly. Retry after the Retry-After delay.",
        }
    }
    return Response(429, body, {"Retry-After": format_retry_after(wait_s), "Stripe-Should-Retry": "true"})


def key_in_use(key: str) -> Response:
    message = (
        "There is currently another in-progress request using this Idempotency-Key (that probably means "
        f"you submitted twice, and the other request is still going through): '{key}'. "
        "Please try again later."
    )
    body = {"error": {"type": "idempotency_error", "code": "idempotency_key_in_use", "message": message}}
    return Response(409, body, {"Stripe-Should-Retry": "true", "Idempotency-Key": key})
