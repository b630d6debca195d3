"""The refund pipeline materialized on a temporary Dagster instance (materialize tier)."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import pandas as pd
import pytest
from dagster import DagsterInstance, materialize

from durable_assets.definitions import defs
from durable_assets.kit.tags import BATCH_TAG
from durable_assets.payments.store import PaymentStore
from durable_assets.refunds.assets import ALL_ASSETS, BATCHES
from durable_assets.refunds.job import refund_batch
from durable_assets.refunds.notices import Mailbox
from tests.support.machine import scaled

from .conftest import job_cli

STEPS = refund_batch.step_keys


def _materialize(
    instance: DagsterInstance, batch_id: str, size: int = 300, path: str | None = None
) -> object:
    instance.add_dynamic_partitions(BATCHES.name or "batches", [batch_id])
    config: dict[str, object] = {"size": size}
    if path:
        config["path"] = path
    return materialize(
        ALL_ASSETS,
        instance=instance,
        partition_key=batch_id,
        resources=defs.resources,
        run_config={"ops": {"invoices": {"config": config}}},
        tags={BATCH_TAG: batch_id},
        raise_on_error=False,
    )


def test_batch_materializes_with_metadata_and_exactly_one_refund_each(dagster_home: Path) -> None:
    with DagsterInstance.get() as instance:
        result = _materialize(instance, "b1")
        assert result.success  # type: ignore[attr-defined]
        mats = {
            m.asset_key.path[-1]: m.metadata
            for m in result.asset_materializations_for_node("issued_refunds")  # type: ignore[attr-defined]
        }
        meta = mats["issued_refunds"]
        issued = meta["refunds_issued"].value
        assert issued > 0 and meta["held_for_review"].value == 0
        stats = PaymentStore(str(dagster_home / "payments.db")).stats()
        assert stats["refunds_created"] == issued
        assert Mailbox(dagster_home / "mailbox.db").count() == issued


def test_the_io_manager_writes_no_debug_lines_and_still_names_each_output_path(dagster_home: Path) -> None:
    """Issue #37: Dagster's filesystem IO manager wrote a debug line per output and two per input
    (37 event-log rows a batch) that no one reads; each output's path stays in its metadata."""
    with DagsterInstance.get() as instance:
        result = _materialize(instance, "q1", size=40)
        assert result.success  # type: ignore[attr-defined]
        records = instance.get_records_for_run(result.run_id, limit=10_000).records  # type: ignore[attr-defined]
        logged = [r.event_log_entry for r in records if r.event_log_entry.dagster_event is None]
        assert not [e.user_message for e in logged if e.level == logging.DEBUG], logged
        paths = {
            m.asset_key.path[-1]: m.metadata["path"].value
            for step in STEPS
            for m in result.asset_materializations_for_node(step)  # type: ignore[attr-defined]
        }
        assert paths["issued_refunds"] == str(dagster_home / "storage" / "issued_refunds" / "q1")


def test_rematerializing_the_refund_step_sends_nothing_new(dagster_home: Path) -> None:
    with DagsterInstance.get() as instance:
        assert _materialize(instance, "b2").success  # type: ignore[attr-defined]
        before = PaymentStore(str(dagster_home / "payments.db")).stats()
        again = materialize(
            ALL_ASSETS,
            selection=[a.key for a in ALL_ASSETS[3:]],
            instance=instance,
            partition_key="b2",
            resources=defs.resources,
            tags={BATCH_TAG: "b2"},
        )
        assert again.success
        meta = again.asset_materializations_for_node("issued_refunds")[0].metadata
        assert meta["requests_sent"].value == 0 and meta["reused_from_ledger"].value > 0
        after = PaymentStore(str(dagster_home / "payments.db")).stats()
        assert after["refunds_created"] == before["refunds_created"]
        assert Mailbox(dagster_home / "mailbox.db").counters().get("duplicates_suppressed", 0) == 0


def test_unreadable_file_fails_the_load_step_naming_file_and_columns(
    dagster_home: Path, tmp_path: Path
) -> None:
    bad = tmp_path / "invoices.csv"
    bad.write_text("invoice_id,amount_charged\nA,1.00\n")
    with DagsterInstance.get() as instance:
        result = _materialize(instance, "bad", path=str(bad))
        assert not result.success  # type: ignore[attr-defined]
        failure = next(e for e in result.all_events if e.is_step_failure)  # type: ignore[attr-defined]
        text = str(failure.step_failure_data.error)
        assert "invoices.csv" in text and "customer_id" in text


@pytest.mark.slow
def test_concurrent_batches_keep_separate_checkpoints(dagster_home: Path) -> None:
    """Two real `job run` processes at once: each batch's stored outputs hold only its own invoices."""
    import subprocess

    from .conftest import REPO

    exe = str(REPO / ".venv" / "bin" / "job")
    procs = {
        bid: subprocess.Popen(
            [exe, "run", "--id", bid, "--size", "400"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for bid in ("left", "right")
    }
    for bid, proc in procs.items():
        out, err = proc.communicate(timeout=scaled(180))
        assert proc.returncode == 0, (bid, out, err)
    for bid in procs:
        for step in STEPS:
            stored = dagster_home / "storage" / step / bid
            assert stored.exists(), stored
        with open(dagster_home / "storage" / "invoices" / bid, "rb") as fh:
            left = pickle.load(fh)
        with open(dagster_home / "storage" / "validated_invoices" / bid, "rb") as fh:
            valid = pickle.load(fh)
        assert isinstance(left, pd.DataFrame) and set(valid["invoice_id"]) <= set(left["invoice_id"])
    left_ids = set(pd.read_pickle(dagster_home / "storage" / "invoices" / "left")["invoice_id"])
    right_ids = set(pd.read_pickle(dagster_home / "storage" / "invoices" / "right")["invoice_id"])
    assert left_ids.isdisjoint(right_ids)
    status = job_cli("status", "--id", "left", "--json")
    assert status.returncode == 0


_HEADER = ",".join(
    (
        "invoice_id,customer_id,customer_email,charge_id,currency,amount_charged,contracted_amount",
        "already_refunded,service_period,charged_at,cancelled_at",
    )
)
_ALL_BAD = "\n".join(
    [
        _HEADER,
        "INV-1,C1,a@example.com,ch_1,xyz,12.00,10.00,0,2026-10,2026-10-01T00:00:00Z,",
        "INV-2,C2,not-an-email,ch_2,usd,-1,10.00,0,2026-10,2026-10-01T00:00:00Z,",
    ]
)


@pytest.mark.parametrize(
    ("case", "content", "quarantined"),
    [("synthetic_5", None, 0), ("header_only", _HEADER + "\n", 0), ("all_quarantined", _ALL_BAD + "\n", 2)],
)
def test_a_batch_with_nothing_to_refund_succeeds(
    case: str, content: str | None, quarantined: int, dagster_home: Path, tmp_path: Path
) -> None:
    """Issue #14.1: empty frames are normal for a nightly batch; every step handles zero rows."""
    path = None
    if content is not None:
        path = tmp_path / f"{case}.csv"
        path.write_text(content)
    with DagsterInstance.get() as instance:
        result = _materialize(instance, case, size=5, path=str(path) if path else None)
        assert result.success, [  # type: ignore[attr-defined]
            str(e.step_failure_data.error)
            for e in result.all_events
            if e.is_step_failure  # type: ignore[attr-defined]
        ]
        mats = {
            m.asset_key.path[-1]: m.metadata
            for m in result.get_asset_materialization_events()  # type: ignore[attr-defined]
            for m in [m.materialization]
        }
        assert mats["issued_refunds"]["refunds_issued"].value == 0
        assert mats["validated_invoices"]["quarantined"].value == quarantined
        assert mats["batch_report"]["refunds"].value == 0
        report = pd.read_csv(dagster_home / "batches" / case / "refund_report.csv")
        assert len(report) == 0 and "notice_sent" in report.columns
    assert PaymentStore(str(dagster_home / "payments.db")).stats()["refunds_created"] == 0


def test_empty_notices_checkpoint_of_an_older_release_still_merges() -> None:
    """A batch that failed at the report on an empty notices frame (float64 columns) resumes."""
    from durable_assets.kit.frames import typed
    from durable_assets.refunds import schema as s

    old_notices = pd.DataFrame({"invoice_id": [], "recipient": [], "message_id": [], "sent": []})
    assert old_notices["invoice_id"].dtype == "float64"  # what pandas infers from zero rows
    old_outcomes = pd.DataFrame([], columns=[c for c in s.RECONCILED_DTYPES if c != s.CHARGE_ID])
    merged = typed(old_outcomes, s.RECONCILED_DTYPES).merge(
        typed(old_notices, s.NOTICE_DTYPES), on="invoice_id", how="left"
    )
    assert len(merged) == 0


@pytest.mark.parametrize("batch_id", ["", "-x", "a b", "x" * 65, "a/b"])
def test_bad_batch_ids_are_usage_errors(batch_id: str, dagster_home: Path) -> None:
    assert job_cli("run", "--id", batch_id).returncode == 2
