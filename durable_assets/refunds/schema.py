"""The invoice input schema and the normalised frame it becomes, in one place.

Every other module (validation, policy, synthetic data, the assets, the docs) refers to these names
instead of spelling column strings itself, so a rename is one edit and a typo is an ``AttributeError``
at import time rather than a silent ``KeyError`` halfway through a batch that is moving money.

See ``docs/input-and-policy.md`` for the prose version of this schema.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from durable_assets import kit
from durable_assets.payments import money

# --- input columns (the file / raw string frame) -------------------------------------------------

INVOICE_ID: Final = "invoice_id"
CUSTOMER_ID: Final = "customer_id"
CUSTOMER_EMAIL: Final = "customer_email"
CHARGE_ID: Final = "charge_id"
CURRENCY: Final = "currency"
AMOUNT_CHARGED: Final = "amount_charged"
CONTRACTED_AMOUNT: Final = "contracted_amount"
ALREADY_REFUNDED: Final = "already_refunded"
SERVICE_PERIOD: Final = "service_period"
CHARGED_AT: Final = "charged_at"
CANCELLED_AT: Final = "cancelled_at"

#: Every column of the input schema, in the canonical order (files may order them differently).
INPUT_COLUMNS: Final[tuple[str, ...]] = (
    INVOICE_ID,
    CUSTOMER_ID,
    CUSTOMER_EMAIL,
    CHARGE_ID,
    CURRENCY,
    AMOUNT_CHARGED,
    CONTRACTED_AMOUNT,
    ALREADY_REFUNDED,
    SERVICE_PERIOD,
    CHARGED_AT,
    CANCELLED_AT,
)

#: Columns a file must have (values may still be empty where the schema allows it, e.g. ``cancelled_at``).
#: ``already_refunded`` is the only optional column: when absent, every row has refunded nothing yet.
#: ``cancelled_at`` is required as a *column* on purpose: a file that simply forgot it would otherwise
#: look like "nobody ever cancelled" and silently skip every charged-after-cancellation refund.
REQUIRED_COLUMNS: Final[tuple[str, ...]] = tuple(c for c in INPUT_COLUMNS if c != ALREADY_REFUNDED)

#: Columns that may be missing from the input, with the value every row then gets.
OPTIONAL_COLUMN_DEFAULTS: Final[dict[str, str]] = {ALREADY_REFUNDED: ""}

#: Money columns of the input and the integer-cents columns they become.
MONEY_COLUMNS: Final[dict[str, str]] = {
    AMOUNT_CHARGED: "amount_charged_cents",
    CONTRACTED_AMOUNT: "contracted_cents",
    ALREADY_REFUNDED: "already_refunded_cents",
}
AMOUNT_CHARGED_CENTS: Final = MONEY_COLUMNS[AMOUNT_CHARGED]
CONTRACTED_CENTS: Final = MONEY_COLUMNS[CONTRACTED_AMOUNT]
ALREADY_REFUNDED_CENTS: Final = MONEY_COLUMNS[ALREADY_REFUNDED]

#: Timestamp columns and whether an empty value is allowed.
TIMESTAMP_COLUMNS: Final[dict[str, bool]] = {CHARGED_AT: False, CANCELLED_AT: True}

#: Accepted currencies and their minor units: the provider's (see :mod:`durable_assets.payments.money`).
ACCEPTED_CURRENCIES: Final = money.ACCEPTED_CURRENCIES
CENTS_PER_UNIT: Final = money.CENTS_PER_UNIT

# --- the normalised ("valid") frame --------------------------------------------------------------

#: 1-based data row in the source and the quarantined rows' reason codes: the kit's names, shared by
#: every pipeline's quarantine file.
ROW_NUMBER: Final = kit.tables.ROW_NUMBER
REASONS: Final = kit.tables.REASONS

#: Who and what an invoice is: the first text columns of the valid frame and of the candidates.
_INVOICE_IDENTITY: Final[dict[str, str]] = kit.tables.text_dtypes(
    INVOICE_ID, CUSTOMER_ID, CUSTOMER_EMAIL, CHARGE_ID, CURRENCY
)

#: Pandas dtype of every column of the valid frame, in column order (the kit's dtype names).
VALID_DTYPES: Final[dict[str, str]] = {
    ROW_NUMBER: kit.tables.INT64,
    **_INVOICE_IDENTITY,
    AMOUNT_CHARGED_CENTS: kit.tables.INT64,
    CONTRACTED_CENTS: kit.tables.INT64,
    ALREADY_REFUNDED_CENTS: kit.tables.INT64,
    SERVICE_PERIOD: kit.tables.TEXT,
    CHARGED_AT: kit.tables.UTC_TIMESTAMP,
    CANCELLED_AT: kit.tables.UTC_TIMESTAMP,
}
VALID_COLUMNS: Final[tuple[str, ...]] = tuple(VALID_DTYPES)


class QuarantineReason(StrEnum):
    """Why a row was quarantined. The values are stable API: they end up in reports and dashboards.

    Reasons that concern one particular column are reported as ``"<code>:<column>"`` (see
    :func:`reason_for_column`), e.g. ``non_numeric_amount:amount_charged``, so an operator can fix the
    file without re-deriving which of three amounts was wrong.
    """

    EMPTY_INVOICE_ID = "empty_invoice_id"
    DUPLICATE_INVOICE_ID = "duplicate_invoice_id"
    MISSING_CUSTOMER_ID = "missing_customer_id"
    INVALID_EMAIL = "invalid_email"
    MISSING_CHARGE_ID = "missing_charge_id"
    SHARED_CHARGE_ID = "shared_charge_id"
    UNKNOWN_CURRENCY = "unknown_currency"
    NON_NUMERIC_AMOUNT = "non_numeric_amount"  # per column
    NEGATIVE_AMOUNT = "negative_amount"  # per column
    AMOUNT_TOO_LARGE = "amount_too_large"  # per column: does not fit int64 cents
    REFUNDED_EXCEEDS_CHARGED = "refunded_exceeds_charged"
    INVALID_TIMESTAMP = "invalid_timestamp"  # per column
    MISSING_SERVICE_PERIOD = "missing_service_period"
    INVALID_SERVICE_PERIOD = "invalid_service_period"
    BAD_ENCODING = "bad_encoding"


#: Reasons that are always qualified by the column they concern.
PER_COLUMN_REASONS: Final[frozenset[QuarantineReason]] = frozenset(
    {
        QuarantineReason.NON_NUMERIC_AMOUNT,
        QuarantineReason.NEGATIVE_AMOUNT,
        QuarantineReason.AMOUNT_TOO_LARGE,
        QuarantineReason.INVALID_TIMESTAMP,
    }
)

#: Every reason code as a string, in the order codes appear in a row's ``reasons`` value.
QUARANTINE_REASONS: Final[tuple[str, ...]] = tuple(r.value for r in QuarantineReason)


def reason_for_column(reason: QuarantineReason, column: str) -> str:
    """The reported code for a per-column reason, e.g. ``"negative_amount:contracted_amount"``."""
    return f"{reason.value}:{column}"


class RefundReason(StrEnum):
    """Why the policy proposes a refund. Declared in precedence order (first wins).

    The values are part of every refund's and notice's idempotency key (:mod:`.keys`) and of the
    charge's refund subject: renaming one would let the same refund be sent again.
    """

    DUPLICATE_CHARGE = "duplicate_charge"
    CHARGED_AFTER_CANCELLATION = "charged_after_cancellation"
    OVERCHARGE = "overcharge"


#: Columns and dtypes of the refund-candidates frame (``policy.compute_refund_candidates``).
CANDIDATE_DTYPES: Final[dict[str, str]] = {
    **_INVOICE_IDENTITY,
    "reason": kit.tables.TEXT,
    "refund_cents": kit.tables.INT64,
    "refundable_cents": kit.tables.INT64,
    "explanation": kit.tables.TEXT,
}
CANDIDATE_COLUMNS: Final[tuple[str, ...]] = tuple(CANDIDATE_DTYPES)

# --- the frames the later steps store -------------------------------------------------------------
# Declared, not inferred: pandas infers ``float64`` or ``object`` for a column built from zero rows,
# and a later merge of two such frames fails. A nightly batch with nothing to refund is normal, so
# every stored frame has the same dtypes whether it holds zero rows or a million.


class RefundOutcome(StrEnum):
    """What became of one approved refund candidate."""

    REFUNDED = "refunded"
    HELD_FOR_REVIEW = "held_for_review"


#: One row per refund candidate after step 4 (``issued_refunds``).
OUTCOME_DTYPES: Final[dict[str, str]] = {
    **kit.tables.text_dtypes(INVOICE_ID, CHARGE_ID, "idempotency_key", "provider_id"),
    "amount_cents": kit.tables.INT64,
    **kit.tables.text_dtypes(CURRENCY, "reason", "status", "review_note"),
}

#: Step 5 (``reconciled_refunds``) adds what the provider says about each refund.
REPORTED_DTYPES: Final[dict[str, str]] = {**OUTCOME_DTYPES, "reconciliation": kit.tables.TEXT}

#: What step 5's one listing of each refunded charge found besides our refund, kept so the blocking
#: duplicate check reads it from the frame instead of listing every charge again: how many refunds
#: of the charge carry our idempotency key and which (``", "``-joined ids), and how many are for our
#: reason and which. Zero and empty for rows that were not refunded.
PROVIDER_LISTING_DTYPES: Final[dict[str, str]] = {
    "provider_refunds_with_key": kit.tables.INT64,
    "provider_ids_with_key": kit.tables.TEXT,
    "provider_refunds_for_reason": kit.tables.INT64,
    "provider_ids_for_reason": kit.tables.TEXT,
}

#: The stored frame of step 5; the batch report keeps only :data:`REPORTED_DTYPES` of it.
RECONCILED_DTYPES: Final[dict[str, str]] = {**REPORTED_DTYPES, **PROVIDER_LISTING_DTYPES}

#: One row per customer notice of step 6 (``customer_notices``).
NOTICE_DTYPES: Final[dict[str, str]] = {
    **kit.tables.text_dtypes(INVOICE_ID, "recipient", "message_id"),
    "sent": kit.tables.BOOL,
}
