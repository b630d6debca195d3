"""The `job` CLI's error paths (issue #14): options checked before a batch exists, malformed input
files refused up front, one line per error."""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_assets import cli

from .conftest import job_cli

HEADER = (
    "invoice_id,customer_id,customer_email,charge_id,currency,amount_charged,contracted_amount,"
    "already_refunded,service_period,charged_at,cancelled_at"
)
ROW = "I{n},C{n},c{n}@x.com,ch_{n},usd,12.00,10.00,0,2026-10,2026-10-01T00:00:00Z,"


def _one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--id", "x", "--size", "99999999999"],
        ["run", "--id", "x", "--size", "0"],
        ["run", "--id", "x", "--size", "ten"],
        ["run", "--id", "a b"],
        ["run", "--id", "x" * 65],
        ["status", "--id", "../etc"],
        ["resume", "--id", ""],
        ["cancel", "--id", "-x-"],
        ["serve", "--port", "65536"],
        ["serve", "--port", "-1"],
        ["serve", "--host", ""],
        ["serve", "--host", "no-such-host.invalid"],
        ["provider", "serve", "--port", "99999"],
        ["provider", "serve", "--error-rate", "1.5"],
        ["provider", "serve", "--lost-response-rate", "nan"],
        ["provider", "serve", "--latency-ms", "-5"],
        ["provider", "serve", "--rate-limit", "0"],
        ["provider", "serve", "--rate-limit", "inf"],
        ["provider", "serve", "--db", "/no/such/dir/sim.db"],
        ["provider", "serve", "--db", "/tmp"],
        ["prune", "--completed-days", "-1"],
        ["prune", "--failed-days", "inf"],
        ["prune", "--ledger-days", "soon"],
        ["prune", "--archive-dir", "/etc/hostname/archive"],
        ["backfill", "--from", "2026-02-30", "--to", "2026-03-01"],
        ["backfill", "--from", "2026-03-02", "--to", "2026-03-01"],
        ["backfill", "--from", "2020-01-01", "--to", "2026-03-01"],
    ],
)
def test_every_bad_option_is_exit_2_with_one_line(
    dagster_home: Path, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse's own exit
        code = int(exc.code or 0)
    assert code == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "error:" in line
    assert not (dagster_home / "history").exists() and not (dagster_home / "storage").exists()  # no instance


def test_size_bound_is_the_steps_bound() -> None:
    from durable_assets.refunds.assets import InvoiceSource

    bounds = {type(m).__name__: m for m in InvoiceSource.model_fields["size"].metadata}
    assert bounds["Le"].le == cli.MAX_SIZE and bounds["Ge"].ge == 1


def test_out_of_range_size_leaves_the_id_unused(dagster_home: Path) -> None:
    # Issue #14, defect 7: the batch used to be created, then step 1 failed with a pydantic error (exit 1).
    bad = job_cli("run", "--id", "big", "--size", "99999999999")
    assert bad.returncode == 2
    assert "--size" in _one_error_line(bad.stderr)
    assert job_cli("status", "--id", "big").returncode == 3  # no batch


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("DURABLE_CONCURRENCY", "many", "DURABLE_CONCURRENCY='many' is not a whole number"),
        ("DURABLE_MAX_REFUNDS_PER_BATCH", "-1", "DURABLE_MAX_REFUNDS_PER_BATCH='-1' is out of range"),
        ("DURABLE_LEASE_TTL_S", "0", "DURABLE_LEASE_TTL_S='0' is out of range"),
    ],
)
def test_malformed_worker_setting_is_exit_2_naming_the_variable(
    dagster_home: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    name: str,
    value: str,
    says: str,
) -> None:
    monkeypatch.setenv(name, value)
    assert cli.main(["run", "--id", "envy", "--size", "5"]) == 2
    assert says in _one_error_line(capsys.readouterr().err)


def test_misaligned_csv_is_refused_before_the_batch_naming_file_and_line(
    dagster_home: Path, tmp_path: Path
) -> None:
    path = tmp_path / "shifted.csv"
    path.write_text(
        "\n".join([HEADER, ROW.format(n=1), ROW.format(n=2) + ",surplus", ROW.format(n=3)]) + "\n"
    )
    for option in ("--input", "--invoices"):
        bad = job_cli("run", "--id", "shifted", option, str(path))
        assert bad.returncode == 2
        line = _one_error_line(bad.stderr)
        assert str(path) in line and "line 3 has 12 fields" in line
    assert job_cli("status", "--id", "shifted").returncode == 3  # the ID was not used


def test_trailing_comma_csv_runs_unshifted(dagster_home: Path, tmp_path: Path) -> None:
    # Issue #14, defect 5: every row ending in a comma made pandas take invoice_id as the index and
    # shift every value, so every row was quarantined with nonsense reasons.
    path = tmp_path / "export.csv"
    path.write_text("\n".join([HEADER, *(ROW.format(n=n) + "," for n in range(1, 4))]) + "\n")
    result = job_cli("run", "--id", "export", "--input", str(path))
    quarantine = (dagster_home / "batches" / "export" / "quarantine.csv").read_text().splitlines()
    assert quarantine[1:] == [], quarantine  # header only: nothing quarantined
    report = (dagster_home / "batches" / "export" / "refund_report.csv").read_text()
    assert all(f"I{n}" in report for n in range(1, 4)), report
    assert result.returncode in (0, 1), result.stderr  # refunds of unknown charges are held for review
