"""Every code location gets what ours gets: the daemon-side parts, the kit's resources tuned by
the environment where the location is wired, and steps that cannot lose their cancel, fence and
ledger (issue #21 items 1-3)."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest
import yaml
from dagster import Definitions, DynamicPartitionsDefinition, asset

from durable_assets.errors import StepWiringError
from durable_assets.kit import BatchRuntime, DurableJob, DurableJobs, durable_asset
from durable_assets.kit.pacing import Backoff
from durable_assets.kit.resources import IdempotencyLedger
from durable_assets.location import definitions
from durable_assets.ops import registry
from durable_assets.ops.instance import INSTANCE_YAML, missing_parts
from durable_assets.payments.resources import PaymentGateway
from tests.support.homes import clean_env, make_home
from tests.support.processes import REPO
from tests.support.tutorial import tutorial_module

from .crash.helpers import EXIT_OK, EXIT_USAGE, job

PARTS = DynamicPartitionsDefinition(name="location_test")


def _parts(defs: Definitions) -> tuple[set[str], set[str], set[str]]:
    repo = defs.get_repository_def()
    return (
        {s.name for s in repo.sensor_defs},
        {s.name for s in repo.schedule_defs},
        {j.name for j in repo.get_all_jobs()},
    )


def _ours_independent_of_jobs(ours: Definitions) -> tuple[set[str], set[str]]:
    from durable_assets.definitions import durable_jobs

    per_job = {j.daily.schedule_name for j in durable_jobs if j.daily}
    sensors, schedules, _jobs = _parts(ours)
    return sensors, schedules - per_job


def test_a_users_location_has_every_sensor_and_schedule_ours_has(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from durable_assets.definitions import defs as ours

    (tmp_path / "postcards.py").write_text(tutorial_module("postcards"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("DURABLE_CODE_LOCATION", "postcards")  # keeps this process's own location
    monkeypatch.setattr(registry, "_built", None)  # importing it builds it: forgotten after the test
    monkeypatch.setitem(sys.modules, "postcards", importlib.import_module("postcards"))
    theirs: Definitions = sys.modules["postcards"].defs
    sensors, schedules = _ours_independent_of_jobs(ours)
    assert {"auto_resume_lost_batches", "webhook_outbox", "batch_failed_webhooks"} <= sensors
    assert schedules == {"retention_daily"}
    their_sensors, their_schedules, their_jobs = _parts(theirs)
    assert their_sensors == sensors and their_schedules == schedules
    assert {"postcards", "retention"} <= their_jobs
    resources = theirs.resources or {}
    assert isinstance(resources["runtime"], BatchRuntime) and isinstance(
        resources["ledger"], IdempotencyLedger
    )


def test_each_daemon_part_can_be_switched_off() -> None:
    @durable_asset(label="One", partitions_def=PARTS)
    def one() -> int:
        return 1

    jobs = DurableJobs([DurableJob("switched", assets=[one], partitions=PARTS, description="d")])
    sensors, schedules, names = _parts(definitions(jobs, auto_resume=False, webhooks=False, retention=False))
    assert sensors == set() and schedules == set() and "retention" not in names


def test_a_step_that_cannot_get_the_kit_resources_fails_when_the_job_is_defined() -> None:
    @asset(partitions_def=PARTS)
    def plain() -> int:
        return 1

    with pytest.raises(StepWiringError, match=r"step plain does not require the 'runtime' resource"):
        DurableJob("plain", assets=[plain], partitions=PARTS, description="d")

    @durable_asset(label="Two", partitions_def=PARTS)
    def two() -> int:
        return 2

    wrong = DurableJobs([DurableJob("wrong", assets=[two], partitions=PARTS, description="d")])
    with pytest.raises(StepWiringError, match=r"step two needs resource 'ledger' to be a IdempotencyLedger"):
        wrong.definitions(resources={"ledger": object()})


def test_a_job_is_partitioned_like_its_steps_unless_told_otherwise() -> None:
    @durable_asset(label="One", partitions_def=PARTS)
    def first() -> int:
        return 1

    other = DynamicPartitionsDefinition(name="location_test_other")

    @durable_asset(label="Two", partitions_def=other)
    def second(first: int) -> int:
        return first

    assert DurableJob("inferred", assets=[first], description="d").partitions is PARTS
    with pytest.raises(ValueError, match=r"durable job 'mixed': its steps must share one"):
        DurableJob("mixed", assets=[first, second], description="d")


def test_kit_resources_take_their_values_from_the_environment_where_the_location_is_wired(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    @durable_asset(label="One", partitions_def=PARTS)
    def wired() -> int:
        return 1

    monkeypatch.setenv("DURABLE_LEASE_TTL_S", "7")
    monkeypatch.setenv("DURABLE_KEY_RETENTION_HOURS", "2")
    monkeypatch.setenv("DURABLE_CONCURRENCY", "5")
    monkeypatch.setenv("DURABLE_RATE_LIMIT", "30")
    monkeypatch.setenv("DURABLE_PROVIDER_DOWN_BUDGET_S", "9")
    monkeypatch.setenv("DURABLE_STEP_DELAY_S", "0.5")
    monkeypatch.setenv("DURABLE_STEP_MAX_ATTEMPTS", "4")
    jobs = DurableJobs([DurableJob("wired", assets=[wired], description="d")])
    definitions(jobs)
    runtime, ledger = jobs.resources["runtime"], jobs.resources["ledger"]
    assert runtime.lease_ttl_s == 7 and runtime.step_delay_s == 0.5
    assert ledger.key_retention_s == 2 * 3600
    assert (
        ledger.concurrency == 5 and ledger.rate_limit_per_second == 30 and ledger.backoff().down_budget_s == 9
    )
    executor = jobs.distributed_job_definition("wired", 2).executor_def
    config = executor.apply_config_mapping({}).value["config"]  # configured where the location is wired
    assert (config["lease_ttl_s"], config["step_max_attempts"], config["step_lease_ttl_s"]) == (7, 4, 15)
    from durable_assets.definitions import defs as ours  # our provider resource, wired the same way

    assert isinstance(ours.resources["payments"], PaymentGateway)
    # Kit code reads no variable: a resource built without the location keeps the declared defaults.
    assert BatchRuntime().lease_ttl_s == 15 and BatchRuntime().step_delay_s == 0
    assert IdempotencyLedger().concurrency == 16 and Backoff().down_budget_s == 60
    assert PaymentGateway().concurrency == 16
    assert BatchRuntime(lease_ttl_seconds=3).lease_ttl_s == 3


@pytest.mark.parametrize("variant", ["", "postgres", "distributed"])
def test_the_shipped_instances_and_the_written_one_have_every_part(variant: str) -> None:
    assert missing_parts(yaml.safe_load((REPO / "dagster_home" / variant / "dagster.yaml").read_text())) == []
    assert missing_parts(yaml.safe_load(INSTANCE_YAML)) == []


def test_an_instance_folder_without_dagster_yaml_gets_the_projects(tmp_path: Path) -> None:
    home = tmp_path / "fresh"
    home.mkdir()
    listed = job(["list", "--json"], clean_env(home), tmp_path, timeout=60)
    assert listed.proc.returncode == EXIT_OK, listed.tail()
    assert (home / "dagster.yaml").read_text() == INSTANCE_YAML


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def pg_url(request: pytest.FixtureRequest) -> str | None:
    """The instance's storage: files in its folder, or a Postgres database of its own."""
    return str(request.getfixturevalue("pg_database")) if request.param == "postgres" else None


def _tables(pg_url: str) -> set[str]:
    import psycopg2

    with psycopg2.connect(pg_url) as conn, conn.cursor() as cur:
        cur.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        tables = {str(row[0]) for row in cur.fetchall()}
    conn.close()
    return tables


def test_a_dagster_yaml_without_the_parts_is_refused_naming_each(tmp_path: Path, pg_url: str | None) -> None:
    """Whatever its storage: a Postgres instance without the parts loses the same guarantees."""
    home = make_home(
        tmp_path / "bare", pg_url, config="telemetry:\n  enabled: false\nrun_retries:\n  enabled: true\n"
    )
    listed = job(["list"], clean_env(home), tmp_path, timeout=60)
    assert listed.proc.returncode == EXIT_USAGE, listed.tail()
    [line] = listed.stderr.strip().splitlines()
    assert "run_launcher: {module: durable_assets.kit.launcher, class: LeaseAwareRunLauncher}" in line
    assert "run_monitoring: {enabled: true}" in line and "run_retries" not in line
    assert not list(home.glob("*.db")), "no storage was created in a refused instance"
    if pg_url:
        assert _tables(pg_url) == set(), "no table was created in a refused instance's database"


@pytest.mark.slow
def test_an_instance_with_every_part_is_used_as_written(tmp_path: Path, pg_url: str | None) -> None:
    """A folder whose dagster.yaml has the parts is never rewritten: its storage (Postgres here)
    is where the commands keep the batch, the leases and the ledger."""
    home = make_home(tmp_path, pg_url)
    written = (home / "dagster.yaml").read_text()
    ran = job(["run", "--id", "loc-1", "--size", "50"], clean_env(home), tmp_path)
    assert ran.proc.returncode == EXIT_OK, ran.tail()
    assert (home / "dagster.yaml").read_text() == written
    if pg_url:
        assert {"runs", "event_logs", "durable_leases", "durable_idempotency"} <= _tables(pg_url)
    assert (home / "durable.db").exists() is not bool(pg_url), "our tables live with Dagster's storage"


def _write_location(folder: Path, name: str, body: str) -> None:
    (folder / f"{name}.py").write_text(
        "from durable_assets.kit import DurableJob, DurableJobs, durable_asset\n"
        "from durable_assets.location import definitions\n"
        "from dagster import DynamicPartitionsDefinition\n" + body
    )


_ONE_JOB = """
@durable_asset(label="One", partitions_def=DynamicPartitionsDefinition(name="{name}_batches"))
def {name}_step() -> int:
    return 1

durable_jobs = DurableJobs([DurableJob("{name}", assets=[{name}_step], description="d")])
defs = definitions(durable_jobs, auto_resume=False, webhooks=False, retention=False)
"""


def test_a_process_serves_the_location_it_built_without_writing_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The location a process builds (a code server, a run worker) is the one the operations layer
    serves there, found as the module holding `durable_jobs`; DURABLE_CODE_LOCATION still wins, a
    location importing another wins over it, and jobs no module holds change nothing."""
    monkeypatch.setattr(registry, "_built", None)
    monkeypatch.delenv("DURABLE_CODE_LOCATION", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    _write_location(tmp_path, "served_postcards", _ONE_JOB.format(name="served_postcards"))
    _write_location(
        tmp_path,
        "served_greetings",
        "import served_postcards  # builds its own location first\n"
        + _ONE_JOB.format(name="served_greetings"),
    )
    environment = dict(os.environ)

    assert registry.code_location() == "durable_assets.definitions"
    importlib.import_module("served_greetings")
    assert registry.code_location() == "served_greetings"  # built last: it wins over what it imported
    assert [job.name for job in registry.durable_jobs()] == ["served_greetings"]
    assert dict(os.environ) == environment  # nothing written for children to inherit

    @durable_asset(label="Loose", partitions_def=PARTS)
    def loose() -> int:
        return 1

    definitions(DurableJobs([DurableJob("loose", assets=[loose], description="d")]))  # held by no module
    assert registry.code_location() == "served_greetings"

    monkeypatch.setenv("DURABLE_CODE_LOCATION", "served_postcards")  # named: always wins
    assert registry.code_location() == "served_postcards"
    for name in ("served_postcards", "served_greetings"):
        sys.modules.pop(name, None)
