"""Idempotency keys derived from business identity, never from a run.

A key must be the same on every retry, resume, re-execution and even a brand-new batch that
contains the same invoice, or the provider cannot deduplicate. So it is a hash of what the money
movement *is* (which invoice, which reason), short enough for Stripe's 255-character limit.
"""

from __future__ import annotations

import hashlib


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()[:40]


def refund_key(invoice_id: str, reason: str) -> str:
    return f"refund-{_digest('refund', invoice_id, reason)}"


def notice_key(invoice_id: str, reason: str) -> str:
    return f"notice-{_digest('notice', invoice_id, reason)}"


def charge_key(invoice_id: str) -> str:
    return f"charge-{_digest('charge', invoice_id)}"


def refund_item(invoice_id: str, reason: str) -> str:
    """The business item a refund and its notice stand for, however their keys are spelled: the
    ledger compares a resumed batch's keys with the ones it recorded for the same item."""
    return f"invoice:{invoice_id}:{reason}"


def refund_subject(charge_id: str, reason: str) -> str:
    """What a refund acts on: the charge, once per reason, whichever invoice or batch asks.

    Keys stay per invoice (the contract's business identity); the ledger lets only the first key
    that names this subject ever send, so a charge is never refunded twice for one reason.
    """
    return f"charge:{charge_id}:{reason}"
