"""What an operator meets at the command line (#23 item 7): each rough edge of the list, as behaviour
of the real `job` command."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from tests.conftest import job_cli
from tests.support.homes import clean_env
from tests.support.machine import scaled
from tests.support.polling import wait_until
from tests.support.processes import JOB, PYTHON, Process
from tests.support.simulator import ThreadedSimulator

API_KEY = "sk_test_polish"


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[ThreadedSimulator]:
    s = ThreadedSimulator(tmp_path / "simulator.db")
    try:
        yield s
    finally:
        s.close()


def _stats(sim: ThreadedSimulator) -> dict[str, int]:
    import requests

    return dict(requests.get(f"{sim.url}/_sim/stats", timeout=5).json())


def test_verbose_is_accepted_after_the_subcommand(dagster_home: Path) -> None:
    after = job_cli("status", "--id", "nope", "--verbose")
    before = job_cli("--verbose", "status", "--id", "nope")
    plain = job_cli("status", "--id", "nope")
    assert after.returncode == before.returncode == plain.returncode == 3, after.stderr
    assert f"instance: {dagster_home}" in after.stderr and f"instance: {dagster_home}" in before.stderr
    assert "instance:" not in plain.stderr


@pytest.mark.slow
def test_canceled_batch_says_what_was_done_and_advises_resume_once(
    dagster_home: Path, tmp_path: Path, sim: ThreadedSimulator
) -> None:
    """Canceled inside the refund step: the summary shows how far that step got (its metadata, which
    the summary reads, is written only when a step completes), and `job resume` is advised once."""
    env = clean_env(dagster_home, DURABLE_PAYMENTS_URL=sim.url, STRIPE_API_KEY=API_KEY, DURABLE_CONCURRENCY=1)
    worker = Process(
        [JOB, "run", "--id", "stopme", "--size", "500"], env, tmp_path / "run.out", tmp_path / "run.err"
    )
    wait_until(
        lambda: _stats(sim)["refund_requests"] > 0 or worker.proc.poll() is not None,
        timeout=120,
        what="the refund step's first request",
    )
    sim.configure(latency_ms=100)
    wait_until(lambda: _stats(sim)["refunds_created"] >= 5 or worker.proc.poll() is not None, timeout=60)
    assert worker.proc.poll() is None, worker.tail()
    assert job_cli("cancel", "--id", "stopme", env=env).returncode == 0
    worker.wait(120)
    issued = _stats(sim)["refunds_created"]

    out, err = worker.stdout, worker.err_path.read_text() if worker.err_path else ""
    assert worker.proc.returncode == 1, worker.tail()
    assert (out + err).count("job resume") == 1, out + err
    assert re.search(r"stopped in step\s+4/7\s+Issuing refunds\n", out), out
    done = re.search(r"done before the stop\s+([\d,]+)\s+refund ([\d,]+)\n", out)
    assert done and int(done.group(1).replace(",", "")) == int(done.group(2).replace(",", "")) == issued, out
    assert "records read" in out and "refund candidates" in out  # the steps before the cancel


def _utc(text: str) -> datetime:
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", text), text
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.mark.slow
def test_list_shows_created_and_updated_dates(dagster_home: Path) -> None:
    assert job_cli("run", "--id", "dated", "--size", "20").returncode == 0
    (batch,) = json.loads(job_cli("list", "--json").stdout)
    created, updated = _utc(batch["created_at"]), _utc(batch["updated_at"])
    assert created <= updated
    status = json.loads(job_cli("status", "--id", "dated", "--json").stdout)
    assert (status["created_at"], status["updated_at"]) == (batch["created_at"], batch["updated_at"])
    (line,) = job_cli("list").stdout.splitlines()
    assert f"created {batch['created_at']}" in line and f"updated {batch['updated_at']}" in line, line


@pytest.mark.slow
def test_backfill_says_as_each_day_starts_and_ends(dagster_home: Path, tmp_path: Path) -> None:
    env = clean_env(dagster_home, DURABLE_STEP_DELAY_S=0.5)
    p = Process([JOB, "backfill", "--from", "2026-11-01", "--to", "2026-11-02"], env, tmp_path / "bf.out")
    first = "day 1/2 daily-2026-11-01"
    wait_until(lambda: f"{first}: starting" in p.stdout or p.proc.poll() is not None, timeout=120)
    assert f"{first}: succeeded" not in p.stdout, "the start line came only with the end"
    assert p.wait(300) == 0, p.tail()
    lines = [line for line in p.stdout.splitlines() if line.startswith("day ")]
    assert [line.split(": ")[1].split(" in ")[0] for line in lines] == ["starting", "succeeded"] * 2, lines
    assert re.fullmatch(r"day 2/2 daily-2026-11-02: succeeded in \d+\.\d s", lines[-1]), lines


def test_binary_input_is_exit_2_saying_so(dagster_home: Path, tmp_path: Path) -> None:
    path = tmp_path / "invoices.csv"
    path.write_bytes(b"invoice_id,customer_id\n" + b"\x00\x01\x02" * 100)
    done = job_cli("run", "--id", "bin", "--input", str(path))
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        f"error: {path}: not a text CSV file (binary content at byte 23); "
        "give a UTF-8 CSV or a .parquet file. Nothing was read."
    )
    assert job_cli("status", "--id", "bin").returncode == 3  # the ID stays unused


def test_review_note_in_the_report_is_readable_text(dagster_home: Path, tmp_path: Path) -> None:
    """A refund the provider refuses is held; the report says why in words, not as a dict."""
    import pandas as pd

    header = (
        "invoice_id,customer_id,customer_email,charge_id,currency,amount_charged,contracted_amount,"
        "already_refunded,service_period,charged_at,cancelled_at\n"
    )
    path = tmp_path / "held.csv"
    path.write_text(header + "H1,C1,a@x.com,ch_missing_1,usd,12.00,10.00,0,2026-10,2026-10-01T00:00:00Z,\n")
    assert job_cli("run", "--id", "held", "--invoices", str(path)).returncode == 4
    report = pd.read_csv(dagster_home / "batches" / "held" / "refund_report.csv", dtype=str)
    (note,) = report.loc[report["status"] == "held_for_review", "review_note"]
    assert note.startswith("the provider refused the request: "), note
    assert "No such charge" in note and "{" not in note and "'error':" not in note, note


def test_status_columns_stay_aligned_with_long_step_names(capsys: pytest.CaptureFixture[str]) -> None:
    from durable_assets.ops.cli import _print_status
    from durable_assets.ops.status_model import BatchStatusModel

    names = ["load", "a_step_name_well_past_twenty_characters", *[f"s{n}" for n in range(3, 11)]]
    unset = dict.fromkeys(["input_hash", "output_ref", "started_at", "error"])
    steps = [
        {
            "step": n,
            "step_name": name,
            "status": "completed",
            "executions": 1,
            "finished_at": "2026-12-01T00:00:00Z",
            **unset,
        }
        for n, name in enumerate(names, 1)
    ]
    nothing = dict.fromkeys(
        ["progress", "auto_resume", "created_at", "updated_at", "provider", "guardrails", "code"]
    )
    st = {
        "id": "b",
        "job": "mine",
        "status": "succeeded",
        "percent_complete": 100.0,
        "run_ids": ["r"],
        "needs_review": False,
        "held_for_review": 0,
        "steps": steps,
        "files": [],
        **nothing,
    }
    _print_status(BatchStatusModel.model_validate(st), as_json=False)
    rows = [line for line in capsys.readouterr().out.splitlines() if "executions=" in line]
    assert len(rows) == 10
    assert len({line.index("completed") for line in rows}) == 1, rows  # one column, whatever the name
    assert len({line.index("executions=") for line in rows}) == 1, rows
    assert all(f" {name} " in row for name, row in zip(names, rows, strict=True))


#: Runs a `job` command in this interpreter, then says which heavy modules it imported.
_IMPORTS_OF = """
import json, sys
from durable_assets.ops.cli import main
code = main(sys.argv[1:])
heavy = ("durable_assets.definitions", "durable_assets.refunds.job", "pandas", "stripe")
print(json.dumps({"exit": code, "imported": [m for m in heavy if m in sys.modules]}), file=sys.stderr)
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv", [["status", "--id", "light", "--json"], ["status", "--id", "light"], ["list", "--json"]]
)
def test_reading_commands_answer_without_importing_the_code_location(
    dagster_home: Path, argv: list[str]
) -> None:
    """`job status` and `job list` read a batch's steps, files and guardrail variables from its
    runs' stored job snapshot: importing the location (pipelines, pandas, the provider SDK) cost
    more than Dagster's own import, on every status poll."""
    assert job_cli("run", "--id", "light", "--size", "20").returncode == 0
    done = subprocess.run(
        [str(PYTHON), "-c", _IMPORTS_OF, *argv],
        capture_output=True,
        text=True,
        timeout=scaled(120),
        check=False,
    )
    said = json.loads(done.stderr.strip().splitlines()[-1])
    assert said == {"exit": 0, "imported": []}, done.stderr
    if argv[0] == "status" and "--json" in argv:
        status = json.loads(done.stdout)
        files = {f["label"]: Path(f["uri"]).name for f in status["files"]}
        assert files == {"report": "refund_report.csv", "quarantine": "quarantine.csv"}, done.stdout
        assert status["guardrails"]["variables"]["RefundLimits"] == {
            "max_amount_per_batch_cents": "DURABLE_MAX_AMOUNT_PER_BATCH_CENTS",
            "max_refunds_per_batch": "DURABLE_MAX_REFUNDS_PER_BATCH",
        }, status["guardrails"]
    elif argv[0] == "status":
        assert "DURABLE_MAX_REFUNDS_PER_BATCH=100000" in done.stdout, done.stdout
