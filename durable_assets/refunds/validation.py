"""Reading invoice files and splitting their rows into *valid* (normalised, typed) and *quarantined*.

Why this module is strict: every row that passes becomes input to a policy that sends real money back
to customers. A row we cannot fully understand must never produce a refund, yet it must not vanish
either — an operator has to see it, fix the source and re-run. Hence the invariants:

* nothing is silently dropped: ``len(valid) + len(quarantined) == len(raw)``;
* a quarantined row lists *all* of its problems, so one round of fixes is enough;
* a whole file is rejected (``InputFileError``) only when it cannot be read at all or lacks a required
  column — then no row can be trusted, and failing loudly beats quarantining 100% of the rows.

Money is parsed exactly into integer cents by :mod:`durable_assets.payments.money` (``Decimal``, never
``float``, once per distinct amount string); reading the file and collecting the reasons are the
kit's (:func:`durable_assets.kit.tables.read_text_table`, :class:`durable_assets.kit.tables.RowChecks`).
Everything else is vectorised pandas / Arrow string kernels.
"""

from __future__ import annotations

from os import PathLike
from typing import Final

import numpy as np
import pandas as pd

from durable_assets import kit
from durable_assets.payments.money import parse_money_cents, parse_money_column
from durable_assets.refunds import schema as s
from durable_assets.refunds.schema import QuarantineReason as R

__all__ = [
    "ValidationResult",
    "parse_money_cents",
    "read_invoice_file",
    "validate_invoices",
]

_SERVICE_PERIOD_PATTERN: Final = r"[0-9]{4}-(?:0[1-9]|1[0-2])"


class ValidationResult(kit.tables.Validated):
    """The two halves of a validated invoice frame.

    ``valid`` has exactly the columns of :data:`schema.VALID_DTYPES` (``row_number``, the string
    identity columns, integer-cent amounts, UTC timestamps), in source order with a fresh RangeIndex.

    ``quarantined`` has the raw input columns exactly as given (strings, already whitespace-stripped by
    :func:`read_invoice_file`) plus ``row_number`` (1-based data row of the source, header not counted)
    and ``reasons`` (every applicable reason code, ``;``-joined, in :data:`schema.QUARANTINE_REASONS`
    order, per-column codes as ``code:column``).
    """


def read_invoice_file(path: str | PathLike[str]) -> pd.DataFrame:
    """Read a CSV or Parquet invoice file into a frame of stripped strings, one row per data row.

    Every column is read as text because typing is :func:`validate_invoices`' job: it can quarantine
    a bad *row*, whereas a type error here could only reject the whole file (see
    :func:`durable_assets.kit.tables.read_text_table` for what rejects a file: an unreadable one, a
    misaligned CSV row, a duplicated or missing required column).
    """
    return kit.tables.read_text_table(path, columns=s.INPUT_COLUMNS, required=s.REQUIRED_COLUMNS)


# --- validation -----------------------------------------------------------------------------------


def validate_invoices(raw: pd.DataFrame, *, require_charge_id: bool = True) -> ValidationResult:
    """Split a raw string invoice frame into normalised valid rows and quarantined rows.

    ``raw`` is what :func:`read_invoice_file` or :func:`synthetic.synthetic_invoices` returns: one row
    per invoice, all values text. Row numbers are positional (1-based), so pass the frame in source
    order. ``require_charge_id=False`` accepts an empty ``charge_id``: synthetic frames only get their
    charges created on the provider after validation; invoice *files* always describe existing charges.

    Checks, each a quarantine reason (see ``docs/input-and-policy.md``): non-empty and unique
    ``invoice_id`` (*every* copy of a duplicated id is quarantined — we cannot tell which is right),
    non-empty ``customer_id``, email shape, ``charge_id`` presence and uniqueness (every row naming a
    charge that another row names is quarantined), accepted currency, each amount is a
    plain decimal, non-negative and fits int64 cents, ``already_refunded <= amount_charged``, timestamps
    parse as ISO 8601, ``service_period`` present and ``YYYY-MM``, no U+FFFD / control characters in
    any field.

    Raises :class:`InputFileError` if a required column is missing (the file-reading path names the
    file; this is the guard for frames built in code).
    """
    col = kit.tables.text_columns(
        raw,
        s.INPUT_COLUMNS,
        required=s.REQUIRED_COLUMNS,
        what="invoice frame",
        defaults=s.OPTIONAL_COLUMN_DEFAULTS,
    )
    n = len(raw)
    checks = kit.tables.RowChecks(n)
    add = checks.add

    invoice_id = col[s.INVOICE_ID]
    empty_id = kit.tables.as_mask(invoice_id == "")
    add(R.EMPTY_INVOICE_ID, empty_id)
    add(R.DUPLICATE_INVOICE_ID, invoice_id.duplicated(keep=False).to_numpy(dtype=bool) & ~empty_id)
    add(R.MISSING_CUSTOMER_ID, kit.tables.as_mask(col[s.CUSTOMER_ID] == ""))
    add(R.INVALID_EMAIL, ~kit.tables.as_mask(col[s.CUSTOMER_EMAIL].str.fullmatch(kit.tables.EMAIL_PATTERN)))
    if require_charge_id:
        add(R.MISSING_CHARGE_ID, kit.tables.as_mask(col[s.CHARGE_ID] == ""))
    else:
        add(R.MISSING_CHARGE_ID, np.zeros(n, dtype=bool))
    # A charge pays one invoice. Rows that name the same charge contradict each other, and every
    # refund is a refund *of the charge*: refunding per row would pay one charge back several times.
    charge_id = col[s.CHARGE_ID]
    add(R.SHARED_CHARGE_ID, kit.tables.as_mask(charge_id.duplicated(keep=False) & (charge_id != "")))
    currency = col[s.CURRENCY].str.lower()
    add(R.UNKNOWN_CURRENCY, ~kit.tables.as_mask(currency.isin(s.ACCEPTED_CURRENCIES)))

    money = {
        name: parse_money_column(col[name], empty_means_zero=name in s.OPTIONAL_COLUMN_DEFAULTS)
        for name in s.MONEY_COLUMNS
    }
    for reason, attr in ((R.NON_NUMERIC_AMOUNT, "non_numeric"), (R.NEGATIVE_AMOUNT, "negative")):
        for name, parsed in money.items():
            add(s.reason_for_column(reason, name), getattr(parsed, attr))
    for name, parsed in money.items():
        add(s.reason_for_column(R.AMOUNT_TOO_LARGE, name), parsed.too_large)

    charged, refunded = money[s.AMOUNT_CHARGED], money[s.ALREADY_REFUNDED]
    both_usable = charged.usable & refunded.usable
    add(R.REFUNDED_EXCEEDS_CHARGED, both_usable & (refunded.cents > charged.cents))

    timestamps: dict[str, pd.Series] = {}
    for name, empty_allowed in s.TIMESTAMP_COLUMNS.items():
        text = col[name]
        parsed_ts = pd.to_datetime(text, format="ISO8601", utc=True, errors="coerce")
        empty = kit.tables.as_mask(text == "")
        bad = parsed_ts.isna().to_numpy(dtype=bool) & ~(empty & empty_allowed)
        add(s.reason_for_column(R.INVALID_TIMESTAMP, name), bad)
        timestamps[name] = parsed_ts

    period = col[s.SERVICE_PERIOD]
    empty_period = kit.tables.as_mask(period == "")
    add(R.MISSING_SERVICE_PERIOD, empty_period)
    add(
        R.INVALID_SERVICE_PERIOD,
        ~empty_period & ~kit.tables.as_mask(period.str.fullmatch(_SERVICE_PERIOD_PATTERN)),
    )
    add(R.BAD_ENCODING, kit.tables.bad_encoding(raw))

    valid = checks.valid_rows(
        {
            s.INVOICE_ID: invoice_id,
            s.CUSTOMER_ID: col[s.CUSTOMER_ID],
            s.CUSTOMER_EMAIL: col[s.CUSTOMER_EMAIL],
            s.CHARGE_ID: col[s.CHARGE_ID],
            s.CURRENCY: currency,
            s.AMOUNT_CHARGED_CENTS: charged.cents,
            s.CONTRACTED_CENTS: money[s.CONTRACTED_AMOUNT].cents,
            s.ALREADY_REFUNDED_CENTS: refunded.cents,
            s.SERVICE_PERIOD: period,
            s.CHARGED_AT: timestamps[s.CHARGED_AT],
            s.CANCELLED_AT: timestamps[s.CANCELLED_AT],
        },
        s.VALID_DTYPES,
    )
    return ValidationResult(valid=valid, quarantined=checks.quarantine(raw))
