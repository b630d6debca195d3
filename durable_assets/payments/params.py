"""What the provider's store accepts: Stripe's parameter rules, each refusal worded as Stripe words it.

Kept apart from the store (``payments/store.py``) so its rules read as one list, shared by the
store and the HTTP simulator's parameter parsing: a value the store would take and Stripe would
refuse is a fidelity bug (``tests/payments/test_simulator_fidelity.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any

from durable_assets.payments.stripe_currencies import SUPPORTED as SUPPORTED_CURRENCIES
from durable_assets.payments.stripe_currencies import unsupported_message

JsonObject = dict[str, Any]

#: Stripe's refund reasons a client may send (``expired_uncaptured_charge`` is Stripe-set only).
REFUND_REASONS = frozenset({"duplicate", "fraudulent", "requested_by_customer"})
#: Stripe's ceiling for a single amount in minor units (USD 999,999.99).
MAX_AMOUNT = 99_999_999
MAX_IDEMPOTENCY_KEY_LENGTH = 255
#: Stripe's limits on a customer's fields and on a balance transaction's description.
MAX_EMAIL_LENGTH = 512
MAX_NAME_LENGTH = 256
MAX_BALANCE_DESCRIPTION_LENGTH = 350
MAX_CUSTOMER_DESCRIPTION_LENGTH = 350
METADATA_MAX_KEYS = 50
METADATA_MAX_KEY_LENGTH = 40
METADATA_MAX_VALUE_LENGTH = 500


@dataclass(eq=False)  # compared by identity, as any exception
class StripeApiError(Exception):
    """An error in Stripe's vocabulary, so every front can render or map it without guessing.

    ``replayed`` is true when the error was answered from a stored idempotency key; the HTTP
    front turns it into Stripe's ``Idempotent-Replayed`` header.
    """

    http_status: int
    error_type: str
    code: str | None
    message: str
    param: str | None = None
    _: KW_ONLY
    replayed: bool = False

    def __post_init__(self) -> None:
        super().__init__(self.message)  # str(error) is the message

    def to_body(self) -> JsonObject:
        """Stripe omits absent fields, so ``None`` values are left out of the JSON."""
        fields = {"type": self.error_type, "code": self.code, "message": self.message, "param": self.param}
        return {"error": {name: value for name, value in fields.items() if value is not None}}

    @classmethod
    def from_body(cls, http_status: int, body: JsonObject, *, replayed: bool = False) -> StripeApiError:
        """Rebuilds a stored error so a replay raises exactly what the first request raised."""
        error = body.get("error", {})
        return cls(
            http_status,
            str(error.get("type", "api_error")),
            error.get("code"),
            str(error.get("message", "")),
            error.get("param"),
            replayed=replayed,
        )


def invalid_request(message: str, *, code: str | None = None, param: str | None = None) -> StripeApiError:
    """The 400 every validation failure uses; shared with the HTTP front's parameter parsing."""
    return StripeApiError(400, "invalid_request_error", code, message, param)


def check_amount(amount: object) -> int:
    if isinstance(amount, bool) or not isinstance(amount, int):
        raise invalid_request("Invalid integer: amount.", code="parameter_invalid_integer", param="amount")
    if amount < 1:
        raise invalid_request(
            "This value must be greater than or equal to 1.", code="parameter_invalid_integer", param="amount"
        )
    if amount > MAX_AMOUNT:
        raise invalid_request(
            f"Amount must be no more than {MAX_AMOUNT}.", code="amount_too_large", param="amount"
        )
    return amount


def check_currency(currency: object) -> str:
    """One of Stripe's currencies (:mod:`.stripe_currencies`), any case, answered lowercase; else
    Stripe's 400 with the list, which has no ``code``."""
    normalized = currency.lower() if isinstance(currency, str) else ""
    if normalized not in SUPPORTED_CURRENCIES:
        raise invalid_request(unsupported_message(str(currency)), param="currency")
    return normalized


def check_reason(reason: object) -> str | None:
    if reason is None:
        return None
    if isinstance(reason, str) and reason in REFUND_REASONS:
        return reason
    raise invalid_request(
        "Invalid reason: must be one of duplicate, fraudulent, or requested_by_customer",
        code="parameter_invalid_string",
        param="reason",
    )


def check_id(value: object, param: str) -> str:
    if not isinstance(value, str) or not value:
        raise invalid_request(f"Missing required param: {param}.", code="parameter_missing", param=param)
    return value


def check_optional_str(value: object, param: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise invalid_request(f"Invalid string: {param}.", code="parameter_invalid_string", param=param)


def check_text(value: object, param: str, max_length: int) -> str | None:
    text = check_optional_str(value, param)
    if text is not None and len(text) > max_length:
        raise invalid_request(
            f"Invalid {param}: must be at most {max_length} characters.",
            code="parameter_invalid_string",
            param=param,
        )
    return text


def check_email(email: object) -> str | None:
    """Stripe's loose check (one ``@`` with something either side, no spaces), and its length limit."""
    text = check_text(email, "email", MAX_EMAIL_LENGTH)
    if text is None:
        return None
    local, at, domain = text.rpartition("@")
    if not at or not local or not domain or any(character.isspace() for character in text):
        raise invalid_request(f"Invalid email address: {text}", code="email_invalid", param="email")
    return text


def check_balance_amount(amount: object) -> int:
    """Signed (negative is credit to the customer), never zero, within Stripe's amount ceiling."""
    if isinstance(amount, bool) or not isinstance(amount, int):
        raise invalid_request("Invalid integer: amount.", code="parameter_invalid_integer", param="amount")
    if amount == 0:
        raise invalid_request(
            "A balance transaction must move the balance: amount cannot be 0.",
            code="parameter_invalid_integer",
            param="amount",
        )
    if abs(amount) > MAX_AMOUNT:
        raise invalid_request(
            f"Amount must be between -{MAX_AMOUNT} and {MAX_AMOUNT}.", code="amount_too_large", param="amount"
        )
    return amount


def check_metadata(metadata: Mapping[str, str] | None) -> dict[str, str]:
    """Stripe's limits, enforced here so a pipeline that works on the simulator works on Stripe.

    Empty values are dropped: on Stripe an empty value means "unset this key".
    """
    if metadata is None:
        return {}
    cleaned = {key: value for key, value in metadata.items() if value != ""}
    if len(cleaned) > METADATA_MAX_KEYS:
        raise invalid_request(f"Metadata can have at most {METADATA_MAX_KEYS} keys.", param="metadata")
    for key, value in cleaned.items():
        check_metadata_item(key, value)
    return dict(sorted(cleaned.items()))


def check_metadata_changes(metadata: Mapping[str, str]) -> dict[str, str]:
    """An update's metadata: empty values are kept (they remove their key); each item within limits."""
    for key, value in metadata.items():
        if value != "":
            check_metadata_item(key, value)
        elif not isinstance(key, str) or not key:
            raise invalid_request("Metadata keys and values must be strings.", param="metadata")
    return dict(sorted(metadata.items()))


def check_metadata_item(key: object, value: object) -> None:
    if not isinstance(key, str) or not isinstance(value, str):
        raise invalid_request("Metadata keys and values must be strings.", param="metadata")
    if not key or len(key) > METADATA_MAX_KEY_LENGTH:
        raise invalid_request(
            f"Metadata keys must be 1 to {METADATA_MAX_KEY_LENGTH} characters: {key!r}.",
            param=f"metadata[{key}]",
        )
    if len(value) > METADATA_MAX_VALUE_LENGTH:
        raise invalid_request(
            f"Metadata values can have up to {METADATA_MAX_VALUE_LENGTH} characters.",
            param=f"metadata[{key}]",
        )


def check_idempotency_key(key: object) -> None:
    if not isinstance(key, str) or not key or len(key) > MAX_IDEMPOTENCY_KEY_LENGTH:
        raise invalid_request(
            f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY_LENGTH} characters.",
            code="idempotency_key_invalid",
        )
