"""kit.review_note: why an effect is held, as text a person reads in a report (#23)."""

from __future__ import annotations

from durable_assets.kit import review_note


def test_mismatch_names_the_problem_and_the_provider_object() -> None:
    note = review_note({"mismatch": "amount 900 != 1000", "provider_answer": {"id": "re_1", "amount": 900}})
    assert note == "provider answer does not match the request: amount 900 != 1000 (provider object re_1)"


def test_refusal_names_the_error_and_its_code() -> None:
    note = review_note({"error": "No such charge: ch_x", "code": "resource_missing", "http_status": 400})
    assert (
        note
        == "the provider refused the request: No such charge: ch_x (code resource_missing, http_status 400)"
    )


def test_anything_else_is_key_value_pairs_never_a_dict_repr() -> None:
    note = review_note({"why": "odd", "answer": {"status": "pending"}})
    assert note == "why=odd; answer=status: pending"
    assert review_note(None) == "held for review (no reason recorded)"


def test_a_subject_held_by_a_key_without_a_recorded_answer_is_never_worded_as_done() -> None:
    """What the ledger knows: claimed by key K, answer not recorded (it may never have been sent)."""
    from durable_assets.kit.effects import review_note

    def done(key: str, params: object) -> str:
        return f"already refunded through {key}"

    started = {"subject_taken": "charge:ch_1:duplicate", "holder_key": "refund-1", "holder_params": {}}
    note = review_note({**started, "holder_state": "started"}, subject_taken=done)
    assert "already" not in note and "is claimed by key refund-1" in note and "not recorded" in note
    assert "held for review" in review_note({**started, "holder_state": "review"}, subject_taken=done)
    assert review_note({**started, "holder_state": "finished"}, subject_taken=done) == (
        "already refunded through refund-1"
    )
    assert review_note(started, subject_taken=done) == "already refunded through refund-1"  # older records
