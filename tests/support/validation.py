"""How the two pipelines' validation tests make raw rows, read a row's reasons and write input files.

Each pipeline's tests state what its own schema accepts and refuses. Making a raw frame of text
rows from one good row, reading the reasons of a single row, comparing a frame's dtypes with the
ones declared, and writing a frame as the file its reader reads are the same for any schema, so
they are written once here and each test file binds them to its schema.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

from durable_assets.kit.tables import REASONS


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
