"""Reading invoice files and splitting their rows into *valid* (normalised, typed) and *quarantined*.

Why this module is strict: every row that passes becomes input to a policy that sends real money back
to customers. A row we cannot fully understand must never produce a refund, yet it must not vanish
either — an operator has to see it, fix the source and re-run. Hence the invariants:

* nothing is silently dropped: ``len(valid) + len(quarantined) == len(raw)``;
* a quarantined row lists *all* of its problems, so one round of fixes is enough;
* a whole file is rejected (``InputFileError``) only when it cannot be read at all or lacks a required
  column — then no row can be trusted, and failing loudly beats quarantining 100% of the rows.

Money is parsed with :class:`decimal.Decimal` (never ``float``) into integer cents. Parsing is done
once per *distinct* amount string (``pd.factorize``), which keeps exact decimal semantics while staying
fast: invoice amounts repeat a lot, so a million rows typically have tens of thousands of distinct
amounts. Everything else is vectorised pandas / Arrow string kernels.
"""

from __future__ import annotations

import csv
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Context, Decimal
from os import PathLike, fspath
from pathlib import Path
from typing import Final

import numpy as np
import pandas as pd

from durable_assets.kit import InputFileError
from durable_assets.refunds import schema as s
from durable_assets.refunds.schema import QuarantineReason as R

__all__ = [
    "ValidationResult",
    "parse_money_cents",
    "read_invoice_file",
    "validate_invoices",
]

CSV_SUFFIXES: Final = frozenset({".csv"})
PARQUET_SUFFIXES: Final = frozenset({".parquet", ".pq"})

#: Plain decimal notation only: optional sign, ASCII digits, optional "." fraction. No exponent ("1e3"),
#: no thousands separators ("1,000.00"), no "NaN"/"Infinity", no underscores, no non-ASCII digits —
#: all of which ``Decimal()`` would otherwise happily accept.
_DECIMAL_PATTERN: Final = r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
#: int64 cents hold at most 19 digits, so more than 17 significant integer digits can never fit (and
#: must not reach Decimal arithmetic or numpy, where they would overflow).
_AT_MOST_17_INTEGER_DIGITS: Final = r"[+-]?0*[0-9]{0,17}(?:\.[0-9]*)?"
_CENT: Final = Decimal("0.01")
#: Wide enough that quantizing any amount with at most 17 integer digits to the cent is exact.
_DECIMAL_CONTEXT: Final = Context(prec=64)
_INT64_MAX: Final = int(np.iinfo(np.int64).max)

#: Whitespace spelled out as literal characters: ``\s`` would make pandas fall back from Arrow's RE2 to
#: Python's ``re`` row by row (RE2's ``\s`` differs), which is ~20x slower on a million rows.
_WHITESPACE: Final = (
    " \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
)
_EMAIL_ATOM: Final = f"[^@{_WHITESPACE}]+"
#: "Looks like an email": something@something.tld, no whitespace, exactly one "@". Deliberately loose —
#: the provider validates deliverability; we only want to catch swapped columns and junk.
_EMAIL_PATTERN: Final = f"{_EMAIL_ATOM}@{_EMAIL_ATOM}\\.{_EMAIL_ATOM}"
_SERVICE_PERIOD_PATTERN: Final = r"[0-9]{4}-(?:0[1-9]|1[0-2])"
#: C0/C1 control characters and U+FFFD (what ``encoding_errors="replace"`` turns undecodable bytes into).
#: Literal characters rather than escapes so the same pattern works for Python ``re`` and Arrow's RE2.
_BAD_ENCODING_PATTERN: Final = "[\x00-\x1f\x7f-\x9f\ufffd]"

# Money parse outcomes, per distinct value.
_OK, _NON_NUMERIC, _NEGATIVE, _TOO_LARGE = 0, 1, 2, 3


@dataclass(frozen=True)
class ValidationResult:
    """The two halves of a validated invoice frame.

    ``valid`` has exactly the columns of :data:`schema.VALID_DTYPES` (``row_number``, the string
    identity columns, integer-cent amounts, UTC timestamps), in source order with a fresh RangeIndex.

    ``quarantined`` has the raw input columns exactly as given (strings, already whitespace-stripped by
    :func:`read_invoice_file`) plus ``row_number`` (1-based data row of the source, header not counted)
    and ``reasons`` (every applicable reason code, ``;``-joined, in :data:`schema.QUARANTINE_REASONS`
    order, per-column codes as ``code:column``).
    """

    valid: pd.DataFrame
    quarantined: pd.DataFrame

    @property
    def total_rows(self) -> int:
        """Rows in the input; always ``len(valid) + len(quarantined)``."""
        return len(self.valid) + len(self.quarantined)

    def reason_counts(self) -> dict[str, int]:
        """How many quarantined rows carry each reason code (a row with two reasons counts twice).

        Sorted by code, plain ``int`` values: meant for run metadata and logs.
        """
        counts: Counter[str] = Counter()
        for joined in self.quarantined[s.REASONS]:
            counts.update(str(joined).split(";"))
        return dict(sorted(counts.items()))


# --- reading --------------------------------------------------------------------------------------


def read_invoice_file(path: str | PathLike[str]) -> pd.DataFrame:
    """Read a CSV or Parquet invoice file into a frame of stripped strings, one row per data row.

    Every column is read as text (``keep_default_na=False``: an empty cell is ``""``, never NaN, and the
    literal text "NA" stays "NA") because typing is :func:`validate_invoices`' job: it can quarantine a
    bad *row*, whereas a type error here could only reject the whole file. For the same reason CSV bytes
    that are not UTF-8 are decoded with ``encoding_errors="replace"``: the row gets U+FFFD and is
    quarantined as ``bad_encoding`` while its neighbours still go through.

    The format is chosen by extension (case-insensitive): ``.csv``; ``.parquet`` / ``.pq``. Parquet
    columns of any scalar type are cast to text by Arrow (prefer string or decimal columns for money:
    a float column is read via its shortest round-trip text, e.g. ``0.30000000000000004``).

    CSV rows are checked against the header first (:func:`_csv_shape`): trailing *empty* extra fields
    are ignored; a row with too few fields or a non-empty value past the last column rejects the file,
    naming the line, because its values would otherwise land in the wrong columns.

    Raises :class:`InputFileError`, naming the file, if it is missing or unreadable, has an unsupported
    extension, cannot be parsed, has a misaligned CSV row (naming its line), or lacks required columns.
    """
    p = Path(fspath(path))
    suffix = p.suffix.lower()
    if suffix in CSV_SUFFIXES:
        frame = _read_csv(p)
    elif suffix in PARQUET_SUFFIXES:
        frame = _read_parquet(p)
    else:
        raise InputFileError(
            f"{p}: unsupported file type {p.suffix or '(no extension)'!r}; "
            "use .csv, .parquet or .pq (case-insensitive)"
        )

    stripped = [str(c).strip() for c in frame.columns]
    dupes = {c for c in stripped if stripped.count(c) > 1}
    # pandas renames a repeated CSV header "x" to "x.1": for a schema column that is a duplicate too, and
    # silently using one of two "amount_charged" columns is exactly the guess we must not make.
    dupes |= {
        c for c in stripped if c.rpartition(".")[0] in s.INPUT_COLUMNS and c.rpartition(".")[2].isdigit()
    }
    if dupes:
        raise InputFileError(f"{p}: duplicate column names: {', '.join(sorted(dupes))}")
    frame.columns = pd.Index(stripped)
    missing = [c for c in s.REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise InputFileError(
            f"{p}: missing required columns: {', '.join(missing)} "
            f"(found: {', '.join(stripped) or 'none'}; required: {', '.join(s.REQUIRED_COLUMNS)})"
        )
    for col in frame.columns:
        frame[col] = frame[col].str.strip()
    return frame


def _read_csv(p: Path) -> pd.DataFrame:
    names, widest = _csv_shape(p)
    try:
        frame = pd.read_csv(
            p,
            header=0,  # replaced by positional names: the header's own names are taken by _csv_shape
            names=list(range(widest)),
            usecols=list(range(len(names))),  # trailing empty fields (checked empty) are dropped
            index_col=False,  # never take the first column as the index, whatever the row widths
            dtype=str,
            keep_default_na=False,
            na_filter=False,
            encoding="utf-8",
            encoding_errors="replace",
        )
    except (OSError, ValueError, UnicodeError) as exc:  # ParserError is a ValueError
        raise InputFileError(f"{p}: cannot read CSV: {exc}") from exc
    frame.columns = pd.Index(names)
    return frame.fillna("").astype("str")


def _csv_rows(p: Path) -> Iterator[tuple[int, list[str]]]:
    """Each non-blank CSV record with the physical line it starts on (a quoted line break counts)."""
    try:
        with open(p, encoding="utf-8", errors="replace", newline="") as f:
            reader = csv.reader(f)
            line = 0
            try:
                for row in reader:
                    start, line = line + 1, reader.line_num
                    if row:  # a blank line is no record (pandas skips it too)
                        yield start, row
            except csv.Error as exc:
                raise InputFileError(f"{p}: line {line + 1}: cannot read CSV: {exc}") from exc
    except OSError as exc:
        raise InputFileError(f"{p}: cannot read CSV: {exc.strerror or exc}") from exc


def _csv_shape(p: Path) -> tuple[list[str], int]:
    """Check every row's field count before pandas sees the file; (column names, widest record).

    One pass of the ``csv`` module (same dialect as pandas' defaults); it costs about a third of the
    pandas read, and it is what can name the physical line of a bad row.

    ``named`` is the header's fields up to its last non-empty name (``a,b,c,`` names three). Every
    data row must have the same number of fields, at least ``named``, and whatever lies past the
    last named column must be empty: that is a trailing comma written on every row (spreadsheet and
    hand-rolled exports do it), and it is ignored. A row with fewer fields, with a value past the
    last column, or wider or narrower than the rows before it is misaligned (a missing field, an
    unquoted comma inside a value): its values would land in the wrong columns, so the whole file is
    rejected naming that row's line rather than read shifted.
    """
    rows = _csv_rows(p)
    first = next(rows, None)
    if first is None:
        raise InputFileError(f"{p}: file is empty (no header row)")
    header = first[1]
    named = len(header)
    while named > 1 and not header[named - 1].strip():
        named -= 1
    widest, width, first_line = len(header), -1, 0
    for line, row in rows:
        n = len(row)
        if n == width:
            if n == named or not any(value.strip() for value in row[named:]):
                continue
        elif width < 0 and n >= named:
            width, first_line = n, line
            widest = max(widest, n)
            if n == named or not any(value.strip() for value in row[named:]):
                continue
        if n < named:
            problem = "every row needs a field (empty if need be) for each column"
        elif any(value.strip() for value in row[named:]):
            problem = "it has values past the last column (an unquoted comma inside a value?)"
        else:
            problem = (
                f"line {first_line} has {width}; every row must have the same number of fields "
                "(a missing field, or an unquoted comma inside a value?)"
            )
        raise InputFileError(
            f"{p}: line {line} has {n} fields but the header names {named} columns; {problem}. "
            "Nothing was read."
        )
    header[0] = header[0].removeprefix("\ufeff")  # a UTF-8 byte-order mark is not part of the name
    return [name.strip() or f"Unnamed: {i}" for i, name in enumerate(header[:named])], widest


def _read_parquet(p: Path) -> pd.DataFrame:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(p)
    except (OSError, pa.ArrowException, ValueError) as exc:
        raise InputFileError(f"{p}: cannot read Parquet: {exc}") from exc
    columns: list[pd.Series] = []  # a list, not a dict: duplicate names must survive to be reported
    for name in table.column_names:
        col = table[name]
        try:
            if pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
                # Mirror the CSV behaviour: undecodable bytes become U+FFFD and the row is quarantined.
                values = [b.decode("utf-8", "replace") if b is not None else "" for b in col.to_pylist()]
                columns.append(pd.Series(values, dtype="str"))
                continue
            text = pc.cast(col, pa.string()).fill_null("")
        except (pa.ArrowException, ValueError) as exc:
            raise InputFileError(
                f"{p}: column {name!r} of type {col.type} cannot be read as text: {exc}"
            ) from exc
        columns.append(pd.Series(text.to_pandas(), dtype="str"))
    frame = pd.DataFrame(dict(enumerate(columns)), index=pd.RangeIndex(table.num_rows))
    frame.columns = pd.Index(table.column_names)
    return frame


# --- money ----------------------------------------------------------------------------------------


def parse_money_cents(text: str) -> int:
    """Parse one decimal amount in major units to integer cents, rounding half-up (``10.005`` → 1001).

    Exactly what :func:`validate_invoices` does to every amount (it *is* the same code, run on a
    one-element column), for callers and tests that hold a single value. Raises ``ValueError`` for
    anything that is not plain decimal notation or does not fit int64 cents. Negative amounts come
    back as negative cents: whether they are allowed is the caller's business.
    """
    parsed = _parse_money_column(pd.Series([text.strip()], dtype="str"), empty_means_zero=False)
    if parsed.non_numeric[0]:
        raise ValueError(f"not a decimal amount: {text!r}")
    if parsed.too_large[0]:
        raise ValueError(f"amount too large for int64 cents: {text!r}")
    return int(parsed.cents[0])


@dataclass(frozen=True)
class _Money:
    """Per-row parse outcome of one money column (all arrays have the column's length)."""

    cents: np.ndarray
    non_numeric: np.ndarray
    negative: np.ndarray
    too_large: np.ndarray


def _parse_money_column(values: pd.Series, *, empty_means_zero: bool) -> _Money:
    """Parse a column of stripped amount strings to int64 cents, once per *distinct* string.

    The syntax and size checks run as Arrow regex kernels over the distinct strings; only strings
    that pass reach the Python loop, where ``Decimal`` does the exact arithmetic: quantize to the cent
    half-up (one rounding step on the exact value, so ``10.0049999`` is 1000, not 1001), then scale.
    """
    codes, uniques = pd.factorize(values, sort=False)
    texts = pd.Series(uniques, dtype="str")
    n = len(texts)
    syntax_ok = _bools(texts.str.fullmatch(_DECIMAL_PATTERN))
    fits = _bools(texts.str.fullmatch(_AT_MOST_17_INTEGER_DIGITS))
    status_u = np.where(syntax_ok, np.where(fits, _OK, _TOO_LARGE), _NON_NUMERIC).astype(np.int8)
    if empty_means_zero:
        status_u[_bools(texts == "")] = _OK  # optional amount left empty: 0 cents
    cents_u = np.zeros(n, dtype=np.int64)
    todo = np.flatnonzero(syntax_ok & fits)
    for i, text in zip(todo.tolist(), texts.iloc[todo].tolist(), strict=True):
        amount = Decimal(text)
        cents = int(amount.quantize(_CENT, rounding=ROUND_HALF_UP, context=_DECIMAL_CONTEXT).scaleb(2))
        if abs(cents) > _INT64_MAX:  # 17 digits can still exceed 92,233,720,368,547,758.07
            status_u[i] = _TOO_LARGE
            continue
        cents_u[i] = cents
        if amount < 0:
            # Judged on the exact value, not the rounded one: "-0.004" is still a negative amount.
            status_u[i] = _NEGATIVE
    row_codes = np.asarray(codes, dtype=np.intp)
    status = status_u[row_codes]
    return _Money(
        cents=cents_u[row_codes],
        non_numeric=status == _NON_NUMERIC,
        negative=status == _NEGATIVE,
        too_large=status == _TOO_LARGE,
    )


# --- validation -----------------------------------------------------------------------------------


def _clean_strings(series: pd.Series) -> pd.Series:
    """The column as pandas' default string dtype, empty string for missing, whitespace stripped."""
    if not pd.api.types.is_string_dtype(series.dtype) or series.dtype == object:
        series = series.astype(object).where(series.notna(), "")
    return series.astype("str").fillna("").str.strip()


def _bools(series: pd.Series) -> np.ndarray:
    return series.fillna(False).to_numpy(dtype=bool)


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
    missing = [c for c in s.REQUIRED_COLUMNS if c not in raw.columns]
    if missing:
        raise InputFileError(f"invoice frame is missing required columns: {', '.join(missing)}")

    n = len(raw)
    col: dict[str, pd.Series] = {}
    for name in s.INPUT_COLUMNS:
        if name in raw.columns:
            col[name] = _clean_strings(raw[name]).reset_index(drop=True)
        else:
            col[name] = pd.Series([s.OPTIONAL_COLUMN_DEFAULTS[name]] * n, dtype="str")

    # (code, mask) in the order codes are reported.
    checks: list[tuple[str, np.ndarray]] = []

    def add(code: str, mask: np.ndarray) -> None:
        checks.append((code, mask))

    invoice_id = col[s.INVOICE_ID]
    empty_id = _bools(invoice_id == "")
    add(R.EMPTY_INVOICE_ID, empty_id)
    add(R.DUPLICATE_INVOICE_ID, invoice_id.duplicated(keep=False).to_numpy(dtype=bool) & ~empty_id)
    add(R.MISSING_CUSTOMER_ID, _bools(col[s.CUSTOMER_ID] == ""))
    add(R.INVALID_EMAIL, ~_bools(col[s.CUSTOMER_EMAIL].str.fullmatch(_EMAIL_PATTERN)))
    if require_charge_id:
        add(R.MISSING_CHARGE_ID, _bools(col[s.CHARGE_ID] == ""))
    else:
        add(R.MISSING_CHARGE_ID, np.zeros(n, dtype=bool))
    # A charge pays one invoice. Rows that name the same charge contradict each other, and every
    # refund is a refund *of the charge*: refunding per row would pay one charge back several times.
    charge_id = col[s.CHARGE_ID]
    add(R.SHARED_CHARGE_ID, _bools(charge_id.duplicated(keep=False) & (charge_id != "")))
    currency = col[s.CURRENCY].str.lower()
    add(R.UNKNOWN_CURRENCY, ~_bools(currency.isin(s.ACCEPTED_CURRENCIES)))

    money = {
        name: _parse_money_column(col[name], empty_means_zero=name in s.OPTIONAL_COLUMN_DEFAULTS)
        for name in s.MONEY_COLUMNS
    }
    for reason, attr in ((R.NON_NUMERIC_AMOUNT, "non_numeric"), (R.NEGATIVE_AMOUNT, "negative")):
        for name, parsed in money.items():
            add(s.reason_for_column(reason, name), getattr(parsed, attr))
    for name, parsed in money.items():
        add(s.reason_for_column(R.AMOUNT_TOO_LARGE, name), parsed.too_large)

    charged, refunded = money[s.AMOUNT_CHARGED], money[s.ALREADY_REFUNDED]
    both_usable = ~(charged.non_numeric | charged.negative | charged.too_large)
    both_usable &= ~(refunded.non_numeric | refunded.negative | refunded.too_large)
    add(R.REFUNDED_EXCEEDS_CHARGED, both_usable & (refunded.cents > charged.cents))

    timestamps: dict[str, pd.Series] = {}
    for name, empty_allowed in s.TIMESTAMP_COLUMNS.items():
        text = col[name]
        parsed_ts = pd.to_datetime(text, format="ISO8601", utc=True, errors="coerce")
        empty = _bools(text == "")
        bad = parsed_ts.isna().to_numpy(dtype=bool) & ~(empty & empty_allowed)
        add(s.reason_for_column(R.INVALID_TIMESTAMP, name), bad)
        timestamps[name] = parsed_ts

    period = col[s.SERVICE_PERIOD]
    empty_period = _bools(period == "")
    add(R.MISSING_SERVICE_PERIOD, empty_period)
    add(R.INVALID_SERVICE_PERIOD, ~empty_period & ~_bools(period.str.fullmatch(_SERVICE_PERIOD_PATTERN)))

    bad_encoding = np.zeros(n, dtype=bool)
    for name in raw.columns:
        values = col[name] if name in col else _clean_strings(raw[name]).reset_index(drop=True)
        bad_encoding |= _bools(values.str.contains(_BAD_ENCODING_PATTERN, regex=True))
    add(R.BAD_ENCODING, bad_encoding)

    any_bad = np.zeros(n, dtype=bool)
    for _, mask in checks:
        any_bad |= mask
    row_number = np.arange(1, n + 1, dtype=np.int64)

    good = ~any_bad

    def keep(series: pd.Series) -> pd.Series:
        # Stay in the column's own (Arrow) storage; a detour through numpy object arrays costs seconds.
        return series[good].reset_index(drop=True)

    valid = pd.DataFrame(
        {
            s.ROW_NUMBER: row_number[good],
            s.INVOICE_ID: keep(invoice_id),
            s.CUSTOMER_ID: keep(col[s.CUSTOMER_ID]),
            s.CUSTOMER_EMAIL: keep(col[s.CUSTOMER_EMAIL]),
            s.CHARGE_ID: keep(col[s.CHARGE_ID]),
            s.CURRENCY: keep(currency),
            s.AMOUNT_CHARGED_CENTS: charged.cents[good],
            s.CONTRACTED_CENTS: money[s.CONTRACTED_AMOUNT].cents[good],
            s.ALREADY_REFUNDED_CENTS: refunded.cents[good],
            s.SERVICE_PERIOD: keep(period),
            s.CHARGED_AT: keep(timestamps[s.CHARGED_AT]),
            s.CANCELLED_AT: keep(timestamps[s.CANCELLED_AT]),
        }
    ).astype(s.VALID_DTYPES)

    bad_positions = np.flatnonzero(any_bad)
    joined = np.full(len(bad_positions), "", dtype=object)
    for code, mask in checks:
        hit = mask[bad_positions]
        if hit.any():
            joined[hit] = joined[hit] + f";{code}"
    quarantined = raw.iloc[bad_positions].reset_index(drop=True)
    quarantined[s.ROW_NUMBER] = row_number[bad_positions]
    quarantined[s.REASONS] = pd.Series(joined, dtype="str").str.slice(1)

    return ValidationResult(valid=valid.reset_index(drop=True), quarantined=quarantined)
