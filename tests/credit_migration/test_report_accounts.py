"""The report is the provider's truth, both ways (#33 item 4): what the provider holds for a
batch's accounts is accounted for in the report, not only what the report says was made.

The rules as pure functions of frames, without a provider; ``test_pipeline.py`` runs them against
the embedded provider (a customer made by hand for a held account, a transaction under a held key).
"""

from __future__ import annotations

from durable_assets.credit_migration import schema as s
from durable_assets.credit_migration.assets import _naming_every_customer
from durable_assets.payments.gateway import Customer


def _customer(cid: str, acct: str) -> Customer:
    return Customer(cid, None, None, 0, None, {s.LEGACY_ID_METADATA: acct})


def test_a_held_note_from_the_ledger_names_customers_made_since() -> None:
    """A refusal recorded on an earlier night knows nothing of a customer made by hand since."""
    refused = "the provider refused the request: email invalid"
    note = _naming_every_customer("C", refused, [_customer("cus_9", "C")])
    assert note == f"{refused}; provider customers naming legacy account C now: cus_9"
    assert _naming_every_customer("C", note, [_customer("cus_9", "C")]) == note  # named: unchanged
    assert _naming_every_customer("C", refused, []) == refused
