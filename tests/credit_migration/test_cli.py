"""The credit migration through the real `job` CLI: how it is listed, its ceilings from the environment."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from durable_assets.payments.store import PaymentStore
from tests.support.credits import ProviderCredits, assert_credits_exact, expected_balances

from ..conftest import job_cli

CREDIT_STEPS = [
    ("legacy_accounts", "Extracting legacy accounts", None),
    ("validated_accounts", "Validating accounts", None),
    ("provider_customers", "Finding or creating customers", "customer"),
    ("planned_adjustments", "Planning balance adjustments", None),
    ("applied_adjustments", "Applying balance adjustments", "balance"),
    ("verified_balances", "Verifying balances", None),
    ("migration_report", "Writing the migration report", None),
]


@pytest.mark.slow
def test_jobs_json_lists_both_jobs_with_the_credit_jobs_steps(dagster_home: Path) -> None:
    listed = job_cli("jobs", "--json")
    assert listed.returncode == 0, listed.stderr
    jobs = {j["name"]: j for j in json.loads(listed.stdout)}
    assert list(jobs) == ["refund_batch", "credit_migration"]  # the default first
    assert jobs["refund_batch"]["default"] is True and jobs["credit_migration"]["default"] is False
    credit = jobs["credit_migration"]
    assert [(st["step"], st["step_name"], st["label"], st["effect_scope"]) for st in credit["steps"]] == [
        (n, name, label, scope) for n, (name, label, scope) in enumerate(CREDIT_STEPS, start=1)
    ]
    assert [st["step_name"] for st in credit["steps"] if st["effect_scope"]] == [
        "provider_customers",
        "applied_adjustments",
    ]
    assert credit["schedule"] == "nightly_credit_migration"
    assert jobs["refund_batch"]["schedule"] == "daily_refund_batch"
    assert "legacy" in credit["description"]

    human = job_cli("jobs")
    assert human.returncode == 0, human.stderr
    assert "credit_migration" in human.stdout and "[side effects: balance]" in human.stdout


def _env_without_credit_ceilings() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("DURABLE_MAX_CREDIT")}


def _fails_closed_at_the_ceiling(variable: str, value: str, home: Path) -> None:
    run = job_cli(
        "run",
        "--job",
        "credit_migration",
        "--id",
        "cm",
        "--size",
        "30",
        env={**_env_without_credit_ceilings(), variable: value},
    )
    assert run.returncode == 1, (run.stdout, run.stderr)
    last = run.stderr.strip().splitlines()[-1]
    assert "step 5 (applied_adjustments)" in last and "CreditCeilingExceededError" in last
    assert variable in last and "no balance was moved" in last
    with PaymentStore(str(home / "payments.db")) as store:
        assert store.stats()["balance_transactions_created"] == 0


@pytest.mark.slow
def test_the_adjustment_count_ceiling_from_the_environment_fails_closed_and_resume_finishes(
    dagster_home: Path,
) -> None:
    _fails_closed_at_the_ceiling("DURABLE_MAX_CREDIT_ADJUSTMENTS_PER_BATCH", "2", dagster_home)
    # The ceiling raised, on purpose: a batch keeps the guardrails pinned at `job run` otherwise.
    resumed = job_cli("resume", "--id", "cm", "--override-guardrails", env=_env_without_credit_ceilings())
    assert resumed.returncode == 0, (resumed.stdout, resumed.stderr)
    assert_credits_exact(
        ProviderCredits.of_store(dagster_home / "payments.db"), expected_balances([("cm", 30)])
    )
    status = json.loads(job_cli("status", "--id", "cm", "--json").stdout)
    assert status["job"] == "credit_migration" and status["status"] == "succeeded"
    assert [st["executions"] for st in status["steps"]] == [1, 1, 1, 1, 2, 1, 1]


def test_the_credit_amount_ceiling_from_the_environment_fails_closed(dagster_home: Path) -> None:
    _fails_closed_at_the_ceiling("DURABLE_MAX_CREDIT_PER_BATCH_CENTS", "5000", dagster_home)
