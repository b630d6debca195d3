"""How the two pipelines' validation tests make raw rows, read a row's reasons and write input files.

Each pipeline's tests state what its own schema accepts and refuses. Making a raw frame of text
rows from one good row, reading the reasons of a single row, comparing a frame's dtypes with the
ones declared, and writing a frame as the file its reader reads are the same for any schema, so
they are written once here, with each pipeline's good row bound to its schema (:data:`INVOICES`,
:data:`ACCOUNTS`) for its own tests and for the end-to-end checks both share.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

from durable_assets.credit_migration import schema as accounts
from durable_assets.credit_migration.validation import validate_accounts
from durable_assets.kit.tables import REASONS, ROW_NUMBER
from durable_assets.refunds import schema as invoices
from durable_assets.refunds.validation import validate_invoices


class Validated(Protocol):
    """What a pipeline's validation returns: its valid rows and its quarantined rows."""

    @property
    def valid(self) -> pd.DataFrame: ...

    @property
    def quarantined(self) -> pd.DataFrame: ...


@dataclass(frozen=True)
class RawRows:
    """Raw text rows of one input schema, and the validation that reads them.

    Each row is ``good`` with its overrides; each column of ``distinct`` (``{column: prefix}``) is
    numbered per row unless the row gives it (row 2's is ``prefix + "2"``), so rows are distinct
    by default and a test names only what it is about.
    """

    good: Mapping[str, str]
    columns: Sequence[str]
    distinct: Mapping[str, str]
    validate: Callable[[pd.DataFrame], Validated]

    def frame(self, *rows: Mapping[str, Any]) -> pd.DataFrame:
        """A raw string frame of these rows (none: the empty frame with every input column)."""
        records = [
            {**self.good, **{c: f"{prefix}{i + 1}" for c, prefix in self.distinct.items()}, **row}
            for i, row in enumerate(rows)
        ]
        return pd.DataFrame(records, columns=list(self.columns), dtype="str")

    def assert_undecodable_bytes_quarantine_only_their_row(
        self, path: Path, read: Callable[[Path], pd.DataFrame], column: str, undecodable: bytes
    ) -> None:
        """Three rows as the CSV file ``path``, row 2's ``column`` written as ``undecodable`` bytes,
        read by the pipeline's ``read`` and validated: only row 2 is quarantined, as ``bad_encoding``,
        with the text it was read as (U+FFFD for each bad byte), and its neighbours go through.

        The kit's reader and its row check are tested once (tests/kit/test_tables.py); this is the
        same promise end to end through a pipeline's own reader and validation, the same for any
        schema. The identity is the first ``distinct`` column.
        """
        identity, prefix = next(iter(self.distinct.items()))
        marker = "UNDECODABLE"
        write_file(path, self.frame({}, {column: marker}, {}))
        path.write_bytes(path.read_bytes().replace(marker.encode(), undecodable))
        result = self.validate(read(path))
        assert result.valid[identity].tolist() == [f"{prefix}1", f"{prefix}3"]
        assert result.quarantined[REASONS].tolist() == ["bad_encoding"]
        assert result.quarantined[ROW_NUMBER].tolist() == [2]
        assert "\ufffd" in result.quarantined[column].iloc[0]

    def reasons_of(self, **overrides: str) -> str:
        """The reasons string for a single row, or "" if it is valid."""
        result = self.validate(self.frame(overrides))
        if len(result.valid):
            return ""
        return str(result.quarantined[REASONS].iloc[0])


def dtypes_of(frame: pd.DataFrame) -> dict[str, str]:
    """A frame's dtypes by column, as text, to compare with :func:`declared`."""
    return {str(c): str(t) for c, t in frame.dtypes.items()}


def declared(dtypes: Mapping[str, str]) -> dict[str, str]:
    """A schema's declared dtypes as pandas spells them (``"str"`` is ``object``, ...)."""
    return {c: str(pd.api.types.pandas_dtype(t)) for c, t in dtypes.items()}


def assert_typed_as(frame: pd.DataFrame, dtypes: Mapping[str, str]) -> None:
    """``frame`` has the declared columns, in their declared order, each of its declared dtype.

    What a stored frame must be whatever rows it holds (zero, all quarantined, one): the schema's
    promise that a later merge of two such frames cannot fail on an inferred dtype.
    """
    assert list(frame.columns) == list(dtypes)
    assert dtypes_of(frame) == declared(dtypes)


def write_file(path: Path, raw: pd.DataFrame, *, trailing_comma: bool = False) -> Path:
    """``raw`` written as the file its suffix says (``.csv`` or ``.parquet``), without the index.

    ``trailing_comma``: a CSV whose every row (not its header) ends in a comma, as some exporters
    write them."""
    if path.suffix == ".parquet":
        raw.to_parquet(path, index=False)
    elif trailing_comma:
        header, *rows = raw.to_csv(index=False).splitlines()
        path.write_text("\n".join([header, *(r + "," for r in rows)]) + "\n")
    else:
        raw.to_csv(path, index=False)
    return path


#: The refund pipeline's raw invoices: a good row with overrides, each of a distinct invoice and
#: charge unless given. Here, not in tests/refunds, because the checks both pipelines share end to
#: end (tests/kit/test_tables.py) make their rows from it too.
INVOICES = RawRows(
    {
        invoices.INVOICE_ID: "INV-1",
        invoices.CUSTOMER_ID: "CUS-1",
        invoices.CUSTOMER_EMAIL: "ada@example.com",
        invoices.CHARGE_ID: "ch_1",
        invoices.CURRENCY: "usd",
        invoices.AMOUNT_CHARGED: "12.34",
        invoices.CONTRACTED_AMOUNT: "12.34",
        invoices.ALREADY_REFUNDED: "0",
        invoices.SERVICE_PERIOD: "2026-10",
        invoices.CHARGED_AT: "2026-10-01T10:00:00Z",
        invoices.CANCELLED_AT: "",
    },
    invoices.INPUT_COLUMNS,
    {invoices.INVOICE_ID: "INV-", invoices.CHARGE_ID: "ch_"},
    validate_invoices,
)

#: The credit migration's raw legacy accounts: a good row with overrides, each of a distinct legacy
#: account unless given (shared as :data:`INVOICES` is).
ACCOUNTS = RawRows(
    {
        accounts.LEGACY_ACCOUNT_ID: "LEG-1",
        accounts.EMAIL: "ada@example.com",
        accounts.NAME: "Ada Lovelace",
        accounts.CURRENCY: "usd",
        accounts.CREDIT_BALANCE: "12.50",
        accounts.UPDATED_AT: "2026-10-01T10:00:00Z",
    },
    accounts.INPUT_COLUMNS,
    {accounts.LEGACY_ACCOUNT_ID: "LEG-"},
    validate_accounts,
)
