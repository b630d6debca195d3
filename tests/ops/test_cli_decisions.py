"""`job decide` and `job decisions` as a person uses them: checked words, a required reason, one line."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import job_cli


def test_deciding_checks_the_word_and_the_reason_before_anything_is_written(dagster_home: Path) -> None:
    default_job = job_cli("decide", "--item", "ACC-1", "no-customer", "--note", "closed")
    assert default_job.returncode == 2
    assert "refund_batch declares no decisions" in default_job.stderr
    assert "--job credit_migration" in default_job.stderr

    unknown = job_cli("decide", "--job", "credit_migration", "--item", "ACC-1", "refund-twice", "--note", "x")
    assert unknown.returncode == 2
    assert "no-customer, keep-provider-balance" in unknown.stderr
    assert len(unknown.stderr.strip().splitlines()) == 1 and "Traceback" not in unknown.stderr

    no_reason = job_cli("decide", "--job", "credit_migration", "--item", "ACC-1", "no-customer")
    assert no_reason.returncode == 2 and "--note is required" in no_reason.stderr

    assert json.loads(job_cli("decisions", "--json").stdout) == []


def test_a_decision_is_recorded_listed_replaced_and_withdrawn(dagster_home: Path) -> None:
    made = job_cli(
        "decide",
        "--job",
        "credit_migration",
        "--item",
        "ACC-00007",
        "no-customer",
        "--note",
        "closed in 2019",
    )
    assert made.returncode == 0, made.stderr
    assert "credit_migration item ACC-00007" in made.stdout and "no-customer" in made.stdout

    replaced = job_cli(
        "decide",
        "--job",
        "credit_migration",
        "--item",
        "ACC-00007",
        "keep-provider-balance",
        "--note",
        "support credited it by hand",
    )
    assert replaced.returncode == 0, replaced.stderr
    listed = json.loads(job_cli("decisions", "--job", "credit_migration", "--json").stdout)
    assert [(d["item"], d["decision"], d["note"]) for d in listed] == [
        ("ACC-00007", "keep-provider-balance", "support credited it by hand")
    ]
    assert listed[0]["decided_by"] and listed[0]["decided_at"].endswith("+00:00")
    assert "keep-provider-balance" in job_cli("decisions").stdout

    withdrawn = job_cli("decide", "--job", "credit_migration", "--item", "ACC-00007", "--withdraw")
    assert withdrawn.returncode == 0 and "withdrew keep-provider-balance" in withdrawn.stdout
    again = job_cli("decide", "--job", "credit_migration", "--item", "ACC-00007", "--withdraw")
    assert again.returncode == 0 and "nothing withdrawn" in again.stdout
    assert "no decisions in force" in job_cli("decisions").stdout
