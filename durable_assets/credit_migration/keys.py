"""Idempotency keys of the migration, derived from business identity, never from a run or a batch.

- A customer is *the legacy account*: one key per ``legacy_account_id``, whatever batch, night or
  worker asks, so an account never gets a second customer.
- An adjustment is *a move of one balance, from the version the plan read, to the target*: the key
  hashes the account, the customer, that version (the id of the customer's newest balance
  transaction, or none) and the target. The customer is part of it because "none" is every new
  customer's version: a replacement made by a person for a deleted customer starts from none too,
  and must not meet the deleted one's first adjustment under the same key. A resume, a re-run or
  the next night's batch that finds the balance unchanged since derives the same key and the
  provider (or our ledger) answers with the original transaction; once the adjustment applied, the
  version has moved on and the next plan sees the target reached (nothing to do) or a new
  difference (a new key).
- The adjustment's *subject* is the customer's balance at that version: the first adjustment
  claimed from a version is the only one ever sent from it. Two plans made from the same balance
  with different targets (two batches at once, or a changed export) cannot both apply; the second
  is held for review instead of moving the balance twice.
"""

from __future__ import annotations

import hashlib

NO_VERSION = "none"
ADJUSTMENT_PREFIX = "credit-"


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()[:40]


def customer_key(legacy_account_id: str) -> str:
    return f"customer-{_digest('customer', legacy_account_id)}"


def adjustment_key(legacy_account_id: str, customer_id: str, balance_version: str, target_cents: int) -> str:
    digest = _digest(
        "credit", legacy_account_id, customer_id, balance_version or NO_VERSION, str(target_cents)
    )
    return f"{ADJUSTMENT_PREFIX}{digest}"


def is_adjustment_key(key: str | None) -> bool:
    """Whether a balance transaction carries one of this migration's adjustment keys (it was ours)."""
    return bool(key) and str(key).startswith(ADJUSTMENT_PREFIX)


def adjustment_subject(customer_id: str, balance_version: str) -> str:
    return f"balance:{customer_id}:{balance_version or NO_VERSION}"
