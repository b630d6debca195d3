"""The legacy-credit export's schema and the frames the migration's steps store, in one place.

Every other module of the migration refers to these names instead of spelling column strings, so a
rename is one edit and a typo fails at import time. Stored frames have declared dtypes: pandas
infers ``float64`` or ``object`` for a column built from zero rows, and a nightly export with
nothing new in it is normal, so every frame has the same dtypes at zero rows as at a million.

Money follows Stripe's sign for customer balances: a *negative* balance is credit the business owes
the customer. An account with 12.50 of legacy credit has the target balance -1250.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from durable_assets import kit
from durable_assets.payments import money, params

# --- input columns (the export, read as text) ----------------------------------------------------

LEGACY_ACCOUNT_ID: Final = "legacy_account_id"
EMAIL: Final = "email"
NAME: Final = "name"
CURRENCY: Final = "currency"
CREDIT_BALANCE: Final = "credit_balance"
UPDATED_AT: Final = "updated_at"

#: The export's columns, in canonical order (files may order them differently). All are required
#: as columns; ``name`` may be empty in a row.
INPUT_COLUMNS: Final[tuple[str, ...]] = (LEGACY_ACCOUNT_ID, EMAIL, NAME, CURRENCY, CREDIT_BALANCE, UPDATED_AT)
REQUIRED_COLUMNS: Final = INPUT_COLUMNS

#: docs/contract.md: a legacy account ID is non-empty and at most 64 characters.
MAX_LEGACY_ID_LENGTH: Final = 64
#: Stripe's limits on a customer's fields, and on a balance (minor units), as the provider enforces them.
MAX_NAME_LENGTH: Final = params.MAX_NAME_LENGTH
MAX_EMAIL_LENGTH: Final = params.MAX_EMAIL_LENGTH
MAX_BALANCE_CENTS: Final = params.MAX_AMOUNT

ACCEPTED_CURRENCIES: Final = money.ACCEPTED_CURRENCIES
ROW_NUMBER: Final = kit.tables.ROW_NUMBER
REASONS: Final = kit.tables.REASONS

#: Where a provider customer records the legacy account it was migrated from (its business identity).
LEGACY_ID_METADATA: Final = "legacy_account_id"


class QuarantineReason(StrEnum):
    """Why an account row was quarantined. The values are stable API (reports, dashboards)."""

    EMPTY_LEGACY_ACCOUNT_ID = "empty_legacy_account_id"
    LEGACY_ACCOUNT_ID_TOO_LONG = "legacy_account_id_too_long"
    DUPLICATE_LEGACY_ACCOUNT_ID = "duplicate_legacy_account_id"
    INVALID_EMAIL = "invalid_email"
    NAME_TOO_LONG = "name_too_long"
    UNKNOWN_CURRENCY = "unknown_currency"
    NON_NUMERIC_CREDIT = "non_numeric_credit"
    NEGATIVE_CREDIT = "negative_credit"
    CREDIT_TOO_LARGE = "credit_too_large"
    INVALID_TIMESTAMP = "invalid_timestamp"
    BAD_ENCODING = "bad_encoding"


#: The valid accounts (step 2): typed, normalised, in source order.
ACCOUNT_DTYPES: Final[dict[str, str]] = {
    ROW_NUMBER: kit.tables.INT64,
    **kit.tables.text_dtypes(LEGACY_ACCOUNT_ID, EMAIL, NAME, CURRENCY),
    "credit_cents": kit.tables.INT64,
    UPDATED_AT: kit.tables.UTC_TIMESTAMP,
}

# --- the later steps' frames ----------------------------------------------------------------------


class CustomerOutcome(StrEnum):
    """What became of an account's provider customer (step 3)."""

    READY = "ready"  # created now, or found (ledger, provider lookup)
    HELD_FOR_REVIEW = "held_for_review"
    DECIDED_BY_PERSON = "decided_by_person"  # `job decide ... no-customer`: nothing made or adopted


#: Step 3 (``provider_customers``): one row per valid account.
CUSTOMER_DTYPES: Final[dict[str, str]] = kit.tables.text_dtypes(
    LEGACY_ACCOUNT_ID, "customer_id", "idempotency_key", "status", "review_note"
)


#: The first columns of every later frame of an account (steps 4 to 6): whose, where, and its target.
_ACCOUNT_TARGET: Final[dict[str, str]] = {
    **kit.tables.text_dtypes(LEGACY_ACCOUNT_ID, "customer_id", CURRENCY),
    "target_cents": kit.tables.INT64,
}


class ProviderChange(StrEnum):
    """What happened at the provider, while a batch ran, to a customer the batch had found or made:
    each holds its account alone, with a note saying so, while the rest of the batch migrates."""

    DELETED = "deleted"
    DUPLICATED = "duplicated"  # a second customer now names the account
    RELABELLED = "relabelled"  # its metadata.legacy_account_id was changed by hand


class PlannedAction(StrEnum):
    """What the plan (step 4) does for an account."""

    ADJUST = "adjust"  # one balance transaction of the difference
    UNCHANGED = "unchanged"  # the provider already holds the target balance
    HELD_FOR_REVIEW = "held_for_review"
    DECIDED_BY_PERSON = "decided_by_person"  # a person's standing decision: nothing moves


#: Step 4 (``planned_adjustments``): target against what the provider holds now. ``balance_version``
#: is the id of the customer's newest balance transaction when the plan read it ("" for none): the
#: adjustment is keyed by it, so it applies at most once to the balance it was computed from.
PLAN_DTYPES: Final[dict[str, str]] = {
    **_ACCOUNT_TARGET,
    "current_cents": kit.tables.INT64,
    "balance_version": kit.tables.TEXT,
    "adjustment_cents": kit.tables.INT64,
    **kit.tables.text_dtypes("action", "review_note"),
}


class AccountDecision(StrEnum):
    """What a person may decide for one held account (``job decide --job credit_migration``): the
    reviews the provider alone cannot settle, which would otherwise come back every night."""

    #: The account gets no customer: nothing is created, adopted or moved for it.
    NO_CUSTOMER = "no-customer"
    #: The balance at the provider stands as it is: no adjustment, whatever the export says.
    KEEP_PROVIDER_BALANCE = "keep-provider-balance"


class AdjustmentOutcome(StrEnum):
    """What became of an account's planned adjustment (step 5)."""

    APPLIED = "applied"
    UNCHANGED = "unchanged"
    HELD_FOR_REVIEW = "held_for_review"
    DECIDED_BY_PERSON = "decided_by_person"


#: Step 5 (``applied_adjustments``): one row per planned account.
APPLIED_DTYPES: Final[dict[str, str]] = {
    **_ACCOUNT_TARGET,
    "adjustment_cents": kit.tables.INT64,
    **kit.tables.text_dtypes("idempotency_key", "transaction_id", "status", "review_note"),
}


class Verification(StrEnum):
    """A migrated account's balance read back from the provider (step 6)."""

    MATCHED = "matched"
    MISMATCH = "mismatch"
    NOT_MIGRATED = "not_migrated"  # held for review before any balance moved
    #: The customer changed at the provider after the plan read it (deleted, duplicated, re-labelled):
    #: its balance is no longer this account's alone to compare, so the account is held with a note.
    CUSTOMER_DELETED = "customer_deleted"
    CUSTOMER_DUPLICATED = "customer_duplicated"
    CUSTOMER_RELABELLED = "customer_relabelled"


#: The verification of each provider change seen after the plan (step 6).
VERIFICATION_OF_CHANGE: Final[dict[ProviderChange, Verification]] = {
    ProviderChange.DELETED: Verification.CUSTOMER_DELETED,
    ProviderChange.DUPLICATED: Verification.CUSTOMER_DUPLICATED,
    ProviderChange.RELABELLED: Verification.CUSTOMER_RELABELLED,
}


#: Step 6 (``verified_balances``).
VERIFIED_DTYPES: Final[dict[str, str]] = {
    **_ACCOUNT_TARGET,
    "provider_balance_cents": kit.tables.INT64,
    "verification": kit.tables.TEXT,
    #: What the provider holds for the account now, where step 6 found it changed since the row's
    #: note was written (a customer deleted, duplicated or re-labelled; one made for a held account);
    #: "" otherwise. The report's note for the account.
    "provider_note": kit.tables.TEXT,
}

#: Step 7 (``migration_report``): one line per valid account, for finance and support.
REPORT_DTYPES: Final[dict[str, str]] = {
    **kit.tables.text_dtypes(LEGACY_ACCOUNT_ID, "customer_id", CURRENCY),
    "credit_cents": kit.tables.INT64,
    "target_cents": kit.tables.INT64,
    "adjustment_cents": kit.tables.INT64,
    **kit.tables.text_dtypes("transaction_id", "status", "verification", "review_note"),
}
