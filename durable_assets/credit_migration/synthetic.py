"""A deterministic synthetic legacy-credit export, for demos, the nightly schedule, benchmarks and tests.

Unlike synthetic invoices, accounts are *not* per batch: account ``n`` is the same legacy account
(``LEG-0000042``, same email, name and currency) in every batch, because a migration runs night
after night over the same population and must converge. What a batch changes is credit: each
account has a base credit derived from its number alone, and about one account in ten has a
different credit in a given batch (derived from the batch ID). So two batches over the same
accounts differ in about one credit in five (an account changed in either), the second moves only
those balances, and an identical re-run moves none.

Everything derives from (account number, batch ID) through a stateless 64-bit mix, never from a
clock or a random state: a resumed batch regenerates exactly the same rows, and ``--size 2000``
holds the same first 1000 accounts as ``--size 1000``.

About 1% of the rows are broken on purpose, one way each, so validation has something to
quarantine: empty or over-long IDs, a bad email, an unsupported currency, negative or non-numeric
credit, an impossible timestamp, an undecodable character (which rows depends on the batch).
"""

from __future__ import annotations

import hashlib
from typing import Final

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from durable_assets.credit_migration import schema as s
from durable_assets.errors import UsageError
from durable_assets.payments.money import money_text

#: Share of rows broken on purpose (exactly ``round(size * MALFORMED_SHARE)`` of them).
MALFORMED_SHARE: Final = 0.01
#: Share of accounts whose credit differs from their base credit in a given batch.
CHANGED_SHARE: Final = 0.10
#: Share of accounts with no credit (target balance 0: a customer, and no balance transaction).
ZERO_CREDIT_SHARE: Final = 0.10

_CURRENCIES: Final = ("usd", "eur", "gbp", "cad", "aud", "chf")
_CURRENCY_WEIGHTS: Final = np.array([0.55, 0.20, 0.10, 0.06, 0.05, 0.04])
_MIN_CENTS, _MAX_CENTS = 100, 50_000
_N_DEFECTS: Final = 8
_EPOCH_2026: Final = 1_767_225_600  # 2026-01-01T00:00:00Z
_MASK64: Final = np.uint64(0xFFFFFFFFFFFFFFFF)


def legacy_account_id(n: int) -> str:
    return f"LEG-{n:07d}"


def synthetic_mix(size: int) -> dict[str, int]:
    """How many rows ``synthetic_accounts(_, size)`` breaks on purpose, and how many are valid."""
    if size < 0:
        raise UsageError(f"--size must be >= 0, got {size}")
    malformed = int(np.floor(size * MALFORMED_SHARE + 0.5))
    return {"malformed": malformed, "valid": size - malformed}


def _mix(values: np.ndarray, salt: int) -> np.ndarray:
    """splitmix64's finalizer over ``values + salt``: a stateless, well-spread 64-bit hash."""
    with np.errstate(over="ignore"):
        z = (values.astype(np.uint64) + np.uint64(salt & 0xFFFFFFFFFFFFFFFF)) & _MASK64
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _uniform(values: np.ndarray, salt: int) -> np.ndarray:
    return (_mix(values, salt) >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _seed(batch_id: str) -> int:
    return int.from_bytes(hashlib.sha256(batch_id.encode("utf-8")).digest()[:8], "big")


def _text(values: pa.Array | pa.ChunkedArray) -> pd.Series:
    return pd.Series(values.to_pandas(), dtype="str")


def account_credit_cents(numbers: np.ndarray, batch_id: str) -> np.ndarray:
    """The credit of accounts ``numbers`` in batch ``batch_id``, in cents (the pure rule tests use)."""
    zero = _uniform(numbers, 2) < ZERO_CREDIT_SHARE
    base = _MIN_CENTS + (_mix(numbers, 3) % np.uint64(_MAX_CENTS - _MIN_CENTS + 1)).astype(np.int64)
    base = np.where(zero, 0, base)
    seed = _seed(batch_id)
    changed = _uniform(numbers, seed ^ 4) < CHANGED_SHARE
    new = _MIN_CENTS + (_mix(numbers, seed ^ 5) % np.uint64(_MAX_CENTS - _MIN_CENTS + 1)).astype(np.int64)
    return np.where(changed, new, base)


def synthetic_accounts(batch_id: str, size: int = 1000) -> pd.DataFrame:
    """Accounts 1..``size`` as batch ``batch_id`` exports them: :data:`schema.INPUT_COLUMNS`, all text."""
    mix = synthetic_mix(size)
    numbers = np.arange(1, size + 1, dtype=np.int64)
    seed = _seed(batch_id)
    currency_index = np.searchsorted(np.cumsum(_CURRENCY_WEIGHTS), _uniform(numbers, 1), side="right")
    currency_index = np.minimum(currency_index, len(_CURRENCIES) - 1)
    credit = account_credit_cents(numbers, batch_id)
    updated = _EPOCH_2026 + (_mix(numbers, seed ^ 6) % np.uint64(300 * 86_400)).astype(np.int64)

    padded = pc.utf8_lpad(pc.cast(pa.array(numbers), pa.string()), 7, "0")
    updated_text = pc.utf8_replace_slice(
        pc.cast(pa.array(updated.astype("datetime64[s]")), pa.string()), 10, 11, "T"
    )
    frame = pd.DataFrame(
        {
            s.LEGACY_ACCOUNT_ID: _text(pc.binary_join_element_wise("LEG", padded, "-")),
            s.EMAIL: _text(pc.binary_join_element_wise("account", padded, "@legacy.example.com", "")),
            s.NAME: _text(pc.binary_join_element_wise("Legacy Account", padded, " ")),
            s.CURRENCY: _text(pc.take(pa.array(_CURRENCIES), pa.array(currency_index))),
            s.CREDIT_BALANCE: _text(money_text(credit)),
            s.UPDATED_AT: _text(pc.binary_join_element_wise(updated_text, "Z", "")),
        },
        columns=list(s.INPUT_COLUMNS),
    )
    if mix["malformed"]:
        order = np.argsort(_mix(numbers, seed ^ 7), kind="stable")
        _break(frame, np.sort(order[: mix["malformed"]]))
    return frame.astype("str")


def _break(frame: pd.DataFrame, rows: np.ndarray) -> None:
    """Break each of ``rows`` in one way validation must catch (in place); every kind appears once
    before any repeats."""
    defect = np.arange(len(rows)) % _N_DEFECTS

    def put(which: int, column: str, value: str) -> None:
        idx = rows[defect == which]
        if len(idx):
            frame.loc[idx, column] = value

    put(0, s.LEGACY_ACCOUNT_ID, "")  # empty_legacy_account_id
    put(1, s.EMAIL, "account at legacy dot example")  # invalid_email
    put(2, s.CURRENCY, "jpy")  # unknown_currency (zero-decimal: deliberately unsupported)
    put(3, s.CREDIT_BALANCE, "-12.50")  # negative_credit
    put(4, s.CREDIT_BALANCE, "12,50")  # non_numeric_credit
    put(5, s.UPDATED_AT, "2026-02-30T10:00:00Z")  # invalid_timestamp
    put(6, s.NAME, "J\ufffdrgen")  # bad_encoding
    idx = rows[defect == 7]
    if len(idx):  # legacy_account_id_too_long: the ID padded past 64 characters
        frame.loc[idx, s.LEGACY_ACCOUNT_ID] = frame.loc[idx, s.LEGACY_ACCOUNT_ID] + "-" + "x" * 64
