"""A batch's input table read as text, the row checks every input shares, and typed frames.

Part of the author face (``from durable_assets.kit import tables``): everything a job's first
steps need to turn a file into a typed frame of valid rows and a quarantine with reasons.

Why text: every pipeline's first steps split rows into *valid* and *quarantined*, and a row can
only be quarantined with a reason if reading it never failed. So files are read with every cell a
string (``keep_default_na=False``: an empty cell is ``""``, the literal text "NA" stays "NA"), and
typing is each pipeline's validation's job. A whole file is rejected (:class:`InputFileError`,
exit 2 at the CLI) only when no row of it can be trusted: unreadable, an unsupported extension, a
duplicated or missing required column, or a CSV row whose values would land in the wrong columns.

Row checks (:class:`RowChecks`) collect ``(reason code, mask)`` pairs in the order codes are
reported and split a frame once at the end, so a quarantined row lists *all* of its problems and
one round of fixes is enough.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from os import PathLike, fspath
from pathlib import Path
from typing import Final

import numpy as np
import pandas as pd

from durable_assets.errors import InputFileError
from durable_assets.kit.frames import BOOL, INT64, TEXT, UTC_TIMESTAMP, text_dtypes, typed

__all__ = [
    "BOOL",
    "EMAIL_PATTERN",
    "INT64",
    "REASONS",
    "ROW_NUMBER",
    "TEXT",
    "UTC_TIMESTAMP",
    "RowChecks",
    "Validated",
    "as_mask",
    "bad_encoding",
    "clean_strings",
    "read_text_table",
    "reason_counts",
    "require_columns",
    "text_columns",
    "text_dtypes",
    "typed",
]

CSV_SUFFIXES: Final = frozenset({".csv"})
PARQUET_SUFFIXES: Final = frozenset({".parquet", ".pq"})

#: 1-based data row of the source (header not counted), on valid and quarantined rows alike, so
#: every side effect traces back to the line of the file it came from.
ROW_NUMBER: Final = "row_number"
#: Semicolon-joined reason codes of a quarantined row.
REASONS: Final = "reasons"

#: Whitespace spelled out as literal characters: ``\s`` would make pandas fall back from Arrow's RE2 to
#: Python's ``re`` row by row (RE2's ``\s`` differs), which is ~20x slower on a million rows.
_WHITESPACE: Final = (
    " \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
)
_EMAIL_ATOM: Final = f"[^@{_WHITESPACE}]+"
#: "Looks like an email": something@something.tld, no whitespace, exactly one "@". Deliberately loose —
#: the provider validates deliverability; we only want to catch swapped columns and junk.
EMAIL_PATTERN: Final = f"{_EMAIL_ATOM}@{_EMAIL_ATOM}\\.{_EMAIL_ATOM}"
#: C0/C1 control characters and U+FFFD (what ``encoding_errors="replace"`` turns undecodable bytes into).
#: Literal characters rather than escapes so the same pattern works for Python ``re`` and Arrow's RE2.
BAD_ENCODING_PATTERN: Final = "[\x00-\x1f\x7f-\x9f\ufffd]"


def read_text_table(
    path: str | PathLike[str], *, columns: Sequence[str], required: Sequence[str]
) -> pd.DataFrame:
    """A CSV or Parquet file as a frame of stripped strings, one row per data row.

    ``columns`` are the schema's columns (a repeated one is reported even as pandas' ``x.1``),
    ``required`` those a file must have. CSV bytes that are not UTF-8 are decoded with
    ``encoding_errors="replace"``: the row gets U+FFFD, which :data:`BAD_ENCODING_PATTERN` finds,
    while its neighbours still go through. Parquet columns of any scalar type are cast to text by
    Arrow (prefer string or decimal columns for money: a float column is read via its shortest
    round-trip text, e.g. ``0.30000000000000004``).

    CSV rows are checked against the header first (:func:`_csv_shape`): trailing *empty* extra fields
    are ignored; a row with too few fields or a non-empty value past the last column rejects the file,
    naming the line, because its values would otherwise land in the wrong columns.

    Raises :class:`InputFileError`, naming the file (and the line where there is one).
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
    # silently using one of two "amount" columns is exactly the guess we must not make.
    dupes |= {c for c in stripped if c.rpartition(".")[0] in columns and c.rpartition(".")[2].isdigit()}
    if dupes:
        raise InputFileError(f"{p}: duplicate column names: {', '.join(sorted(dupes))}")
    frame.columns = pd.Index(stripped)
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise InputFileError(
            f"{p}: missing required columns: {', '.join(missing)} "
            f"(found: {', '.join(stripped) or 'none'}; required: {', '.join(required)})"
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
    _refuse_binary(p)
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
            f"{p}: line {line} has {_count(n, 'field')} but the header names {_count(named, 'column')}; "
            f"{problem}. Nothing was read."
        )
    header[0] = header[0].removeprefix("\ufeff")  # a UTF-8 byte-order mark is not part of the name
    return [name.strip() or f"Unnamed: {i}" for i, name in enumerate(header[:named])], widest


#: How much of a CSV file is looked at for binary content: a text file has no NUL byte anywhere, and
#: every binary format a user may pick by mistake (Parquet, Excel, zip, gzip, images) has one early.
_SNIFF_BYTES = 64 * 1024


def _refuse_binary(p: Path) -> None:
    """A binary file named .csv is said to be one, not reported as a row of odd fields."""
    try:
        with open(p, "rb") as f:
            head = f.read(_SNIFF_BYTES)
    except OSError:
        return  # unreadable: reported by the read itself, with its reason
    at = head.find(b"\0")
    if at >= 0:
        hint = " (it is a Parquet file: name it .parquet)" if head.startswith(b"PAR1") else ""
        raise InputFileError(
            f"{p}: not a text CSV file (binary content at byte {at}){hint}; "
            "give a UTF-8 CSV or a .parquet file. Nothing was read."
        )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


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


# --- row checks -----------------------------------------------------------------------------------


def require_columns(frame: pd.DataFrame, required: Sequence[str], what: str) -> None:
    """Refuse a frame that lacks a required column, naming ``what`` it is and the columns.

    :func:`read_text_table` checks a file already (naming it); this is the same guard for a frame
    built in code (synthetic data, a test), before any row of it is judged.
    """
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise InputFileError(f"{what} is missing required columns: {', '.join(missing)}")


def clean_strings(series: pd.Series) -> pd.Series:
    """The column as pandas' default string dtype, empty string for missing, whitespace stripped."""
    if not pd.api.types.is_string_dtype(series.dtype) or series.dtype == object:
        series = series.astype(object).where(series.notna(), "")
    return series.astype("str").fillna("").str.strip().reset_index(drop=True)


def text_columns(
    raw: pd.DataFrame,
    columns: Sequence[str],
    *,
    required: Sequence[str],
    what: str,
    defaults: Mapping[str, str] | None = None,
) -> dict[str, pd.Series]:
    """The schema's ``columns`` of a raw frame as clean text (:func:`clean_strings`), cleaned once.

    Every validation starts here, before any row is judged: a frame without a ``required`` column
    is refused (:func:`require_columns`, naming ``what`` it is), and an optional column it lacks
    reads as ``defaults[column]`` in every row.
    """
    require_columns(raw, required, what)
    return {
        name: clean_strings(raw[name])
        if name in raw.columns
        else pd.Series([(defaults or {})[name]] * len(raw), dtype="str")
        for name in columns
    }


def as_mask(series: pd.Series) -> np.ndarray:
    """A boolean (possibly nullable) Series as a plain mask; missing counts as False."""
    return series.fillna(False).to_numpy(dtype=bool)


def bad_encoding(frame: pd.DataFrame) -> np.ndarray:
    """Rows with U+FFFD or a control character in any field."""
    found = np.zeros(len(frame), dtype=bool)
    for name in frame.columns:
        found |= as_mask(clean_strings(frame[name]).str.contains(BAD_ENCODING_PATTERN, regex=True))
    return found


@dataclass
class RowChecks:
    """Reason codes and the rows each one hits, in the order codes are reported."""

    rows: int
    checks: list[tuple[str, np.ndarray]] = field(default_factory=list)

    def add(self, code: str, mask: np.ndarray) -> None:
        if len(mask) != self.rows:
            raise ValueError(f"check {code!r} has {len(mask)} rows, the frame {self.rows}")
        self.checks.append((code, mask))

    def failed(self) -> np.ndarray:
        """Rows at least one check hit."""
        bad = np.zeros(self.rows, dtype=bool)
        for _, mask in self.checks:
            bad |= mask
        return bad

    def valid_rows(
        self, columns: Mapping[str, pd.Series | np.ndarray], dtypes: Mapping[str, str]
    ) -> pd.DataFrame:
        """The rows no check hit, as a frame of ``dtypes``: ``row_number`` first, then ``columns``.

        Each column holds a value for every row of the frame checked (a Series, or an array such as
        parsed cents); only the rows that passed are kept, in source order, with a fresh index. A
        Series stays in its own (Arrow) storage: a detour through numpy object arrays costs seconds.
        """
        good = ~self.failed()
        kept: dict[str, pd.Series | np.ndarray] = {
            ROW_NUMBER: np.arange(1, self.rows + 1, dtype=np.int64)[good]
        }
        for name, values in columns.items():
            kept[name] = (
                values[good].reset_index(drop=True) if isinstance(values, pd.Series) else values[good]
            )
        return pd.DataFrame(kept).astype(dict(dtypes))

    def quarantine(self, raw: pd.DataFrame) -> pd.DataFrame:
        """The failed rows of ``raw`` as given, plus ``row_number`` and every reason, ``;``-joined."""
        positions = np.flatnonzero(self.failed())
        joined = np.full(len(positions), "", dtype=object)
        for code, mask in self.checks:
            hit = mask[positions]
            if hit.any():
                joined[hit] = joined[hit] + f";{code}"
        quarantined = raw.iloc[positions].reset_index(drop=True)
        quarantined[ROW_NUMBER] = positions.astype(np.int64) + 1
        quarantined[REASONS] = pd.Series(joined, dtype="str").str.slice(1)
        return quarantined


@dataclass(frozen=True)
class Validated:
    """An input split in two: ``valid`` rows, typed, and ``quarantined`` rows as given, with reasons.

    Why both halves travel together: nothing may be dropped silently, so ``len(valid) +
    len(quarantined)`` is always the input's row count, and the reasons are counted from the half
    a person fixes.
    """

    valid: pd.DataFrame
    quarantined: pd.DataFrame

    @property
    def total_rows(self) -> int:
        """Rows in the input; always ``len(valid) + len(quarantined)``."""
        return len(self.valid) + len(self.quarantined)

    def reason_counts(self) -> dict[str, int]:
        """How many quarantined rows carry each reason code (:func:`reason_counts`)."""
        return reason_counts(self.quarantined)


def reason_counts(quarantined: pd.DataFrame) -> dict[str, int]:
    """How many quarantined rows carry each reason (a row with two counts twice), sorted by code."""
    if not len(quarantined):
        return {}
    counts = quarantined[REASONS].astype(str).str.split(";").explode().value_counts()
    return {str(k): int(v) for k, v in sorted(counts.items())}
