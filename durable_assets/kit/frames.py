"""Small helpers on DataFrames shared by the assets: content hashes and safe CSV output."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import pandas as pd

#: The dtypes a stored frame declares for :func:`typed`, named once. ``TEXT`` is pandas' default
#: string dtype (Arrow-backed ``StringDtype`` under pandas 3); ``INT64`` holds minor units, counts
#: and row numbers; timestamps are timezone-aware UTC.
TEXT: Final = "str"
INT64: Final = "int64"
BOOL: Final = "bool"
UTC_TIMESTAMP: Final = "datetime64[ns, UTC]"

_FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")
_EMPTY_BY_DTYPE: dict[str, str | int | bool] = {TEXT: "", INT64: 0, BOOL: False}
_PLAIN_NUMBER = r"^[-+]?\d+(\.\d+)?$"


def typed(df: pd.DataFrame, dtypes: Mapping[str, str]) -> pd.DataFrame:
    """Exactly the declared columns with the declared dtypes, however many rows (zero included).

    A column a checkpoint written by an older release lacks is added empty, so a batch started
    before an upgrade still resumes.
    """
    out = df.copy()
    for name, dtype in dtypes.items():
        if name not in out.columns:
            out[name] = _EMPTY_BY_DTYPE[dtype]
    return out[list(dtypes)].astype(dict(dtypes))


def text_dtypes(*columns: str) -> dict[str, str]:
    """``{column: TEXT}`` for each of ``columns``, in order: a frame's run of text columns, declared
    as one (most columns of a stored frame are identifiers, codes and notes)."""
    return dict.fromkeys(columns, TEXT)


def frame_digest(df: pd.DataFrame) -> str:
    """A content hash of a frame; it becomes the asset's data version and so the next step's input hash."""
    h = hashlib.sha256()
    h.update(",".join(map(str, df.columns)).encode())
    if len(df):
        h.update(pd.util.hash_pandas_object(df, index=False).to_numpy().tobytes())
    return h.hexdigest()[:32]


def neutralize_formulas(df: pd.DataFrame) -> pd.DataFrame:
    """Quote text cells a spreadsheet would evaluate (``=HYPERLINK(...)``): OWASP CSV injection."""
    out = df.copy()
    for col in out.columns:
        if out[col].dtype == object or pd.api.types.is_string_dtype(out[col]):
            values = out[col].astype("string").fillna("")
            risky = values.str.startswith(_FORMULA_PREFIXES) & ~values.str.match(_PLAIN_NUMBER)
            out[col] = values.where(~risky, "'" + values)
    return out


def csv_bytes(df: pd.DataFrame) -> bytes:
    """The frame as a CSV file for people (UTF-8, no index, spreadsheet formulas neutralised)."""
    return neutralize_formulas(df).to_csv(index=False, lineterminator="\n").encode("utf-8")


def write_csv_atomically(df: pd.DataFrame, path: Path) -> Path:
    """Write, fsync and rename, so a crash never leaves a half-written report behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8", newline="") as fh:
        neutralize_formulas(df).to_csv(fh, index=False)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path
