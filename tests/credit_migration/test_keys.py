"""Idempotency keys and subjects of the migration: from business identity only, and stable."""

from __future__ import annotations

from durable_assets.credit_migration.keys import adjustment_key, adjustment_subject, customer_key

# Stripe refuses keys longer than this; the simulator does too.
MAX_KEY_LENGTH = 255


def test_customer_key_depends_only_on_the_legacy_account() -> None:
    key = customer_key("LEG-0000001")
    assert key == customer_key("LEG-0000001")  # every batch, night and worker asks for the same customer
    assert key != customer_key("LEG-0000002")
    assert key != customer_key("leg-0000001")  # IDs are case-sensitive
    assert key.startswith("customer-") and len(key) <= MAX_KEY_LENGTH
    assert customer_key("L" * 64) != customer_key("L" * 63)


def test_keys_are_pinned_across_releases() -> None:
    """A changed derivation would resend every intent of an unfinished batch under a new key (a
    resume across it is refused by the batch's per-item record). The adjustment key took the customer
    in 2026-12, so that a replacement customer's first adjustment is not its deleted one's."""
    assert customer_key("LEG-0000001") == "customer-f65f852ce3bfab0491e50cfb00c0dfd61562b8dc"
    assert (
        adjustment_key("LEG-0000001", "cus_1", "", -1250) == "credit-f1757dc6e6565d042609932e7cdffee7d8f8bb2e"
    )
    assert (
        adjustment_key("LEG-0000001", "cus_1", "cbtxn_1", -1250)
        == "credit-f74f63bac1386e9d90fd903b783afe71867138bd"
    )


def test_adjustment_key_changes_with_account_customer_version_and_target() -> None:
    base = adjustment_key("LEG-1", "cus_1", "cbtxn_1", -1250)
    assert base == adjustment_key("LEG-1", "cus_1", "cbtxn_1", -1250)
    assert base != adjustment_key("LEG-2", "cus_1", "cbtxn_1", -1250)
    assert adjustment_key("LEG-1", "cus_1", "", -1250) != adjustment_key(
        "LEG-1", "cus_2", "", -1250
    )  # a replacement
    assert base != adjustment_key(
        "LEG-1", "cus_1", "cbtxn_2", -1250
    )  # the balance moved since: a new adjustment
    assert base != adjustment_key("LEG-1", "cus_1", "cbtxn_1", -1251)  # another target from the same balance
    assert base != adjustment_key("LEG-1", "cus_1", "", -1250)
    assert base.startswith("credit-") and len(base) <= MAX_KEY_LENGTH


def test_no_version_is_one_version() -> None:
    assert adjustment_key("LEG-1", "cus_1", "", -1) == adjustment_key("LEG-1", "cus_1", "none", -1)


def test_parts_cannot_run_into_each_other() -> None:
    assert adjustment_key("LEG-1", "cus_1", "2", -3) != adjustment_key("LEG-12", "cus_1", "", -3)
    assert adjustment_key("LEG-1", "cus_1", "cbtxn_1", -12) != adjustment_key(
        "LEG-1", "cus_1", "cbtxn_1-", 12
    )


def test_subject_is_the_customers_balance_at_a_version() -> None:
    subject = adjustment_subject("cus_1", "cbtxn_1")
    assert subject == adjustment_subject("cus_1", "cbtxn_1")
    assert subject != adjustment_subject("cus_2", "cbtxn_1")
    assert subject != adjustment_subject("cus_1", "cbtxn_2")
    assert adjustment_subject("cus_1", "") == "balance:cus_1:none"


def test_customer_and_adjustment_keys_never_collide() -> None:
    assert customer_key("LEG-1") != adjustment_key("LEG-1", "cus_1", "", 0)
