"""The `job` CLI as outside tooling sees it: JSON shape and exit codes from docs/contract.md."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import job_cli

STEP_FIELDS = {
    "step",
    "step_name",
    "status",
    "executions",
    "input_hash",
    "output_ref",
    "started_at",
    "finished_at",
    "error",
}


@pytest.mark.slow
def test_run_status_list_and_exit_codes(dagster_home: Path) -> None:
    run = job_cli("run", "--id", "demo", "--size", "200")
    assert run.returncode == 0, run.stderr
    assert "succeeded" in run.stdout and "refund_report.csv" in run.stdout
    assert "Traceback" not in run.stderr

    status = json.loads(job_cli("status", "--id", "demo", "--json").stdout)
    assert set(status) == {
        "id",
        "job",
        "status",
        "run_ids",
        "percent_complete",
        "progress",
        "needs_review",
        "held_for_review",
        "auto_resume",
        "created_at",
        "updated_at",
        "provider",
        "guardrails",
        "code",
        "files",
        "steps",
        "decisions",
    }
    assert status["auto_resume"] is None and status["job"] == "refund_batch"
    assert status["decisions"] == []
    assert status["guardrails"]["pinned"]["RefundLimits"]["max_refunds_per_batch"] == 100_000
    assert status["provider"]["kind"] == "embedded" and status["provider"]["livemode"] is False
    assert status["status"] == "succeeded" and status["percent_complete"] == 100.0
    assert status["needs_review"] is False and status["held_for_review"] == 0
    assert len(status["run_ids"]) == 1 and len(status["steps"]) == 7
    for n, step in enumerate(status["steps"], start=1):
        assert set(step) == STEP_FIELDS
        assert step["step"] == n and step["status"] == "completed" and step["executions"] == 1
        assert step["output_ref"] and Path(step["output_ref"]).exists()
        assert step["finished_at"].endswith("Z")
        assert (step["input_hash"] is None) == (n == 1)  # only the load step has no upstream input

    human = job_cli("status", "--id", "demo")
    assert human.returncode == 0 and "issued_refunds" in human.stdout

    listed = json.loads(job_cli("list", "--json").stdout)
    assert [b["id"] for b in listed] == ["demo"]

    assert job_cli("run", "--id", "demo").returncode == 3  # exists
    assert job_cli("status", "--id", "nope").returncode == 3  # unknown
    assert job_cli("resume", "--id", "nope").returncode == 3
    assert job_cli("cancel", "--id", "nope").returncode == 3
    resumed = job_cli("resume", "--id", "demo")  # already succeeded: nothing to do
    assert resumed.returncode == 0 and "nothing to do" in resumed.stdout
    assert job_cli("run").returncode == 2
    assert job_cli("frobnicate").returncode == 2


@pytest.mark.slow
def test_bad_input_file_is_exit_2_with_a_clear_message(dagster_home: Path, tmp_path: Path) -> None:
    missing = job_cli("run", "--id", "f1", "--invoices", str(tmp_path / "nope.csv"))
    assert missing.returncode == 2 and "nope.csv" in missing.stderr and "Traceback" not in missing.stderr
    partial = tmp_path / "partial.csv"
    partial.write_text("invoice_id,amount_charged\nA,1.00\n")
    bad = job_cli("run", "--id", "f2", "--invoices", str(partial))
    assert bad.returncode == 2 and "customer_id" in bad.stderr
    assert job_cli("status", "--id", "f2").returncode == 3  # no run was created


@pytest.mark.slow
def test_csv_batch_quarantines_bad_rows_and_refunds_the_rest(dagster_home: Path, tmp_path: Path) -> None:
    header = (
        "invoice_id,customer_id,customer_email,charge_id,currency,amount_charged,contracted_amount,"
        "already_refunded,service_period,charged_at,cancelled_at\n"
    )
    rows = [
        "I1,C1,a@x.com,ch_missing,usd,12.00,10.00,0,2026-10,2026-10-01T00:00:00Z,",  # overcharge
        "I2,C2,b@x.com,ch_x,xyz,12.00,10.00,0,2026-10,2026-10-01T00:00:00Z,",  # unknown currency
        "I3,C3,not-an-email,ch_y,usd,-1,10.00,0,2026-10,2026-10-01T00:00:00Z,",  # two reasons
    ]
    path = tmp_path / "inv.csv"
    path.write_text(header + "\n".join(rows) + "\n")
    result = job_cli("run", "--id", "csv1", "--invoices", str(path))
    # I1's charge does not exist at the provider: the refund is held for review, not recorded as done,
    # and the batch's only refund waiting for a person is its outcome: exit 4, not a plain success.
    assert result.returncode == 4, result.stderr
    quarantine = (dagster_home / "batches" / "csv1" / "quarantine.csv").read_text()
    assert (
        "unknown_currency" in quarantine and "invalid_email" in quarantine and "negative_amount" in quarantine
    )
    report = (dagster_home / "batches" / "csv1" / "refund_report.csv").read_text()
    assert "I1" in report and "held_for_review" in report
