"""Reading a legacy-credit export and splitting its rows into valid accounts and quarantined rows.

A row we cannot fully understand must never move a balance, and must not vanish either: it is
quarantined with every reason that applies (``len(valid) + len(quarantined) == len(raw)``), and the
quarantine file tells whoever fixes the export what to fix. Every copy of a repeated
``legacy_account_id`` is quarantined: two rows claiming one account contradict each other, and
picking one would be a guess about somebody's money.
"""

from __future__ import annotations

from os import PathLike

import pandas as pd

from durable_assets import kit
from durable_assets.credit_migration import schema as s
from durable_assets.credit_migration.schema import QuarantineReason as R
from durable_assets.payments.money import parse_money_column


class AccountValidation(kit.tables.Validated):
    """``valid``: :data:`schema.ACCOUNT_DTYPES`, in source order. ``quarantined``: the raw rows as
    given plus ``row_number`` and ``reasons``."""


def read_legacy_file(path: str | PathLike[str]) -> pd.DataFrame:
    """The export as stripped strings; a file no row of which can be trusted is an
    :class:`InputFileError` naming the file (and the line, for a misaligned CSV row)."""
    return kit.tables.read_text_table(path, columns=s.INPUT_COLUMNS, required=s.REQUIRED_COLUMNS)


def validate_accounts(raw: pd.DataFrame) -> AccountValidation:
    """Split a raw export frame (all text) into typed valid accounts and quarantined rows.

    Checks, each a reason: ``legacy_account_id`` non-empty, at most 64 characters and unique;
    ``email`` shaped like one and within Stripe's length; ``name`` (may be empty) within Stripe's
    length; an accepted two-decimal currency; ``credit_balance`` a plain decimal, not negative and
    within the provider's balance limit; ``updated_at`` ISO 8601; no U+FFFD or control character
    in any field.
    """
    col = kit.tables.text_columns(
        raw, s.INPUT_COLUMNS, required=s.REQUIRED_COLUMNS, what="legacy account frame"
    )
    checks = kit.tables.RowChecks(len(raw))

    legacy_id = col[s.LEGACY_ACCOUNT_ID]
    empty_id = kit.tables.as_mask(legacy_id == "")
    checks.add(R.EMPTY_LEGACY_ACCOUNT_ID, empty_id)
    checks.add(R.LEGACY_ACCOUNT_ID_TOO_LONG, kit.tables.as_mask(legacy_id.str.len() > s.MAX_LEGACY_ID_LENGTH))
    checks.add(
        R.DUPLICATE_LEGACY_ACCOUNT_ID, legacy_id.duplicated(keep=False).to_numpy(dtype=bool) & ~empty_id
    )
    email = col[s.EMAIL]
    checks.add(
        R.INVALID_EMAIL,
        ~kit.tables.as_mask(email.str.fullmatch(kit.tables.EMAIL_PATTERN))
        | kit.tables.as_mask(email.str.len() > s.MAX_EMAIL_LENGTH),
    )
    checks.add(R.NAME_TOO_LONG, kit.tables.as_mask(col[s.NAME].str.len() > s.MAX_NAME_LENGTH))
    currency = col[s.CURRENCY].str.lower()
    checks.add(R.UNKNOWN_CURRENCY, ~kit.tables.as_mask(currency.isin(s.ACCEPTED_CURRENCIES)))

    credit = parse_money_column(col[s.CREDIT_BALANCE])
    checks.add(R.NON_NUMERIC_CREDIT, credit.non_numeric)
    checks.add(R.NEGATIVE_CREDIT, credit.negative)
    checks.add(R.CREDIT_TOO_LARGE, credit.too_large | (credit.usable & (credit.cents > s.MAX_BALANCE_CENTS)))

    updated_at = pd.to_datetime(col[s.UPDATED_AT], format="ISO8601", utc=True, errors="coerce")
    checks.add(R.INVALID_TIMESTAMP, updated_at.isna().to_numpy(dtype=bool))
    checks.add(R.BAD_ENCODING, kit.tables.bad_encoding(raw))

    valid = checks.valid_rows(
        {
            s.LEGACY_ACCOUNT_ID: legacy_id,
            s.EMAIL: email,
            s.NAME: col[s.NAME],
            s.CURRENCY: currency,
            "credit_cents": credit.cents,
            s.UPDATED_AT: updated_at,
        },
        s.ACCOUNT_DTYPES,
    )
    return AccountValidation(valid=valid, quarantined=checks.quarantine(raw))
