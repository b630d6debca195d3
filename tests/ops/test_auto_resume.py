"""The automatic resume's decisions, without a daemon: one resume per lost run however many ticks
(or daemons) look at it, bounded attempts, and never beside a `job resume` (the batch lease decides).

The lost run is created as the daemon path creates one (code origins, a FAILURE tagged
``durable/worker_lost``); the resume it gets is submitted to the queued run coordinator, where it
waits (no daemon dequeues it here), which is exactly the window a human's `job resume` could race.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, RunsFilter, reconstructable

from durable_assets.definitions import refund_batch_job
from durable_assets.errors import LeaseHeldError
from durable_assets.kit.cancel import CancelStore
from durable_assets.kit.db import DurableDatabase
from durable_assets.kit.executor import execution_config
from durable_assets.kit.leases import LeaseStore
from durable_assets.kit.modes import ExecutorKind
from durable_assets.kit.tags import (
    AUTO_RESUME_ATTEMPT_TAG,
    AUTO_RESUME_MAX_TAG,
    AUTO_RESUME_OF_TAG,
    AUTO_RESUMED_BY_TAG,
    BATCH_TAG,
    EXECUTOR_TAG,
    SHARDS_TAG,
    WILL_RETRY_TAG,
    WORKER_LOST_TAG,
    worker_lost_reason,
)
from durable_assets.ops import cli, runner
from durable_assets.ops.auto_resume import (
    AutoResumeSettings,
    resume_lost_batches,
    resume_lost_run,
    resume_run_id,
)
from durable_assets.ops.status import batch_runs, batch_status

BATCH = "lost-1"
DUE = AutoResumeSettings(max_attempts=3, after_s=0.0, interval_s=1, lease_ttl_s=30.0)


@pytest.fixture
def instance(dagster_home: Path) -> Iterator[DagsterInstance]:
    with DagsterInstance.get() as inst:
        inst.add_dynamic_partitions("batches", [BATCH])
        yield inst


def _lost_run(instance: DagsterInstance, execution: dict | None = None, **tags: str) -> DagsterRun:
    """A UI-launched run of the batch that run monitoring failed because its worker was lost
    (``execution``: the launchpad's executor choice)."""
    from dagster._core.execution.api import create_execution_plan
    from dagster._core.remote_origin import (
        GrpcServerCodeLocationOrigin,
        RemoteJobOrigin,
        RemoteRepositoryOrigin,
    )

    job = refund_batch_job()
    config = {"ops": {"invoices": {"config": {"size": 50}}}, **(execution or {})}
    run_tags = {BATCH_TAG: BATCH, "dagster/partition": BATCH, **tags}
    location = GrpcServerCodeLocationOrigin(host="127.0.0.1", port=1, location_name="durable_assets")
    run = instance.create_run_for_job(
        job_def=job,
        execution_plan=create_execution_plan(job, config, tags=run_tags),
        run_config=config,
        tags=run_tags,
        remote_job_origin=RemoteJobOrigin(RemoteRepositoryOrigin(location, "__repository__"), job.name),
        job_code_origin=reconstructable(refund_batch_job).get_python_origin(),
    )
    instance.add_run_tags(run.run_id, {WORKER_LOST_TAG: "lease_expired"})
    instance.report_run_failed(run, message="lease lapsed (test)")
    return _get(instance, run.run_id)


def _get(instance: DagsterInstance, run_id: str) -> DagsterRun:
    run = instance.get_run_by_id(run_id)
    assert run is not None
    return run


def _tick(instance: DagsterInstance, settings: AutoResumeSettings = DUE) -> list[str]:
    job = refund_batch_job()
    return resume_lost_batches(instance, lambda name: job if name == job.name else None, settings)


def _children(instance: DagsterInstance, run_id: str) -> list[DagsterRun]:
    return list(instance.get_runs(RunsFilter(tags={"dagster/parent_run_id": run_id})))


def test_a_lost_run_is_resumed_from_failure_once_however_many_ticks(
    instance: DagsterInstance, capsys: pytest.CaptureFixture[str]
) -> None:
    lost = _lost_run(instance)
    lines = _tick(instance)
    assert any("attempt 1 of 3" in line for line in lines), lines
    for _ in range(3):
        _tick(instance)
    (resumed,) = _children(instance, lost.run_id)
    assert resumed.run_id == resume_run_id(lost.run_id)  # a second daemon would collide on it
    assert resumed.status == DagsterRunStatus.QUEUED  # handed to the run queue
    assert resumed.parent_run_id == lost.run_id and resumed.root_run_id == lost.run_id
    assert resumed.tags[AUTO_RESUME_ATTEMPT_TAG] == "1" and resumed.tags[AUTO_RESUME_MAX_TAG] == "3"
    assert resumed.tags[AUTO_RESUME_OF_TAG] == lost.run_id and resumed.tags[BATCH_TAG] == BATCH
    assert not worker_lost_reason(resumed.tags)
    assert resumed.remote_job_origin == lost.remote_job_origin
    assert _get(instance, lost.run_id).tags[AUTO_RESUMED_BY_TAG] == resumed.run_id
    status = batch_status(instance, BATCH)
    assert status.as_json()["auto_resume"] == {"attempts": 1, "max_attempts": 3, "run_ids": [resumed.run_id]}
    assert status.as_json()["status"] == "queued"
    cli._print_status(status, as_json=False)  # what `job status --id ID` prints
    assert "automatically resumed (attempt 1 of 3)" in capsys.readouterr().out
    # The lease was only held while deciding: the resumed run's worker can take it.
    lease = LeaseStore(DurableDatabase.for_instance(instance)).get(BATCH)
    assert lease is not None and not lease.is_live()


def test_dagsters_own_retry_gets_the_grace_period_first(instance: DagsterInstance) -> None:
    lost = _lost_run(instance)
    patient = AutoResumeSettings(max_attempts=3, after_s=3600.0, interval_s=1)
    assert _tick(instance, patient) == []
    assert not _children(instance, lost.run_id)


def test_concurrent_ticks_start_one_resume(instance: DagsterInstance) -> None:
    lost = _lost_run(instance)
    job = refund_batch_job()
    barrier = threading.Barrier(4)
    results: list[str] = []

    def tick() -> None:
        barrier.wait()
        results.append(resume_lost_run(instance, job, lost, DUE))

    threads = [threading.Thread(target=tick) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(_children(instance, lost.run_id)) == 1, results
    assert sum("attempt 1 of 3" in r for r in results) == 1, results


def test_job_resume_refuses_while_the_automatic_resume_is_queued(instance: DagsterInstance) -> None:
    lost = _lost_run(instance)
    _tick(instance)
    with pytest.raises(LeaseHeldError, match="has not started"):
        runner.resume_batch(instance, BATCH)
    assert len(batch_runs(instance, BATCH)) == 2, "no second run beside the queued resume"
    assert len(_children(instance, lost.run_id)) == 1


def test_automatic_resume_backs_off_while_job_resume_holds_the_batch(instance: DagsterInstance) -> None:
    lost = _lost_run(instance)
    # `job resume` takes the lease before it creates its run (run id "pending" until then).
    leases = LeaseStore(DurableDatabase.for_instance(instance), ttl_s=30.0)
    lease = leases.acquire(BATCH, "pending", owner="operator-host:4242")
    lines = _tick(instance)
    assert any("someone else holds it" in line for line in lines), lines
    assert not _children(instance, lost.run_id)
    assert AUTO_RESUMED_BY_TAG not in _get(instance, lost.run_id).tags  # decided later, not never
    leases.release(lease)


def test_job_resume_that_loses_the_race_to_the_automatic_resume_starts_nothing(
    instance: DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`job resume` looked at the batch (newest run: the lost one); before it took the lease the
    sensor resumed the batch. Under the lease it sees the newer run and backs off."""
    lost = _lost_run(instance)
    holding = runner._holding_lease

    def sensor_first(inst: DagsterInstance, batch_id: str):  # type: ignore[no-untyped-def]
        _tick(inst)
        return holding(inst, batch_id)

    monkeypatch.setattr(runner, "_holding_lease", sensor_first)
    with pytest.raises(LeaseHeldError, match="was just resumed by run"):
        runner.resume_batch(instance, BATCH)
    assert [r.run_id for r in batch_runs(instance, BATCH)] == [lost.run_id, resume_run_id(lost.run_id)]


def test_attempts_are_bounded(instance: DagsterInstance) -> None:
    lost = _lost_run(instance, **{AUTO_RESUME_ATTEMPT_TAG: "3"})  # the third automatic resume, lost too
    lines = _tick(instance)
    assert any("3 automatic resumes spent" in line for line in lines), lines
    assert not _children(instance, lost.run_id)
    assert _get(instance, lost.run_id).tags[AUTO_RESUMED_BY_TAG].startswith("none: 3 automatic resumes")
    assert _tick(instance) == []  # decided once


def test_a_canceled_batch_is_not_resumed(instance: DagsterInstance) -> None:
    lost = _lost_run(instance)
    CancelStore(DurableDatabase.for_instance(instance)).request(BATCH)
    lines = _tick(instance)
    assert any("cancel" in line for line in lines), lines
    assert not _children(instance, lost.run_id)


def test_off_when_max_attempts_is_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DURABLE_AUTO_RESUME_MAX_ATTEMPTS", "0")
    monkeypatch.setenv("DURABLE_AUTO_RESUME_AFTER_S", "5")
    settings = AutoResumeSettings.from_env()
    assert settings.max_attempts == 0 and settings.after_s == 5.0


def test_a_resume_created_but_never_submitted_is_submitted_by_a_later_tick(instance: DagsterInstance) -> None:
    """The code server died between creating the resume and queueing it: the next tick queues it."""
    from durable_assets.kit.db import now
    from durable_assets.ops.reexecution import create_from_failure_run

    lost = _lost_run(instance)
    created = create_from_failure_run(
        instance,
        refund_batch_job(),
        lost,
        run_id=resume_run_id(lost.run_id),
        tags={BATCH_TAG: BATCH, AUTO_RESUME_ATTEMPT_TAG: "1", AUTO_RESUME_MAX_TAG: "3"},
    )
    assert created.status == DagsterRunStatus.NOT_STARTED
    job = refund_batch_job()
    lines = resume_lost_batches(instance, lambda name: job, DUE, at=now() + 60)
    assert any("submitted automatic resume" in line for line in lines), lines
    assert _get(instance, created.run_id).status == DagsterRunStatus.QUEUED
    assert _get(instance, lost.run_id).tags[AUTO_RESUMED_BY_TAG] == created.run_id
    assert len(_children(instance, lost.run_id)) == 1


def test_a_run_launched_distributed_is_resumed_distributed(instance: DagsterInstance) -> None:
    """Launched from the UI with the celery executor: the resume keeps the run config and the tag,
    so the run queue's worker orchestrates it on the `job worker`s again, as `job resume` would."""
    celery = execution_config(ExecutorKind.CELERY)
    lost = _lost_run(instance, celery, **{EXECUTOR_TAG: ExecutorKind.CELERY.value})
    lines = _tick(instance)
    assert any("attempt 1 of 3" in line for line in lines), lines
    (resumed,) = _children(instance, lost.run_id)
    assert resumed.tags[EXECUTOR_TAG] == ExecutorKind.CELERY.value
    assert resumed.run_config["execution"] == celery["execution"]


def test_a_sharded_batch_is_left_to_job_resume(instance: DagsterInstance) -> None:
    """A sharded plan is the CLI's job, which the code location does not serve: `job resume` only."""
    lost = _lost_run(instance, **{EXECUTOR_TAG: ExecutorKind.CELERY.value, SHARDS_TAG: "4"})
    lines = _tick(instance)
    assert any("a sharded batch" in line and "job resume --id" in line for line in lines), lines
    assert not _children(instance, lost.run_id)
    assert _get(instance, lost.run_id).tags[AUTO_RESUMED_BY_TAG] == "none: a sharded batch"


def _started_on_the_release_before(instance: DagsterInstance) -> None:
    """The batch pinned another refund step than the one deployed, and that step recorded an item."""
    from durable_assets.definitions import durable_jobs
    from durable_assets.kit.code_versions import CodePins, StepCode
    from durable_assets.kit.db import batch_items, now

    db = DurableDatabase.for_instance(instance)
    deployed = durable_jobs.get("refund_batch").code_versions
    CodePins(db).pin(BATCH, {**deployed, "issued_refunds": StepCode("fp-the-release-before")})
    with db.transaction() as conn:
        conn.execute(
            batch_items.insert().values(
                batch_id=BATCH, scope="refund", item="invoice:INV-1:duplicate", key="k", created_at=now()
            )
        )


def _metric(instance: DagsterInstance, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    from durable_assets.ops.metrics import render_metrics

    [family] = [f for f in text_string_to_metric_families(render_metrics(instance)) if f.name == name]
    return sum(sample.value for sample in family.samples)


def test_a_batch_whose_code_changed_in_a_step_with_effects_is_left_for_a_person(
    instance: DagsterInstance, capsys: pytest.CaptureFixture[str]
) -> None:
    """The daemon never crosses a deploy by itself: the batch stays failed, and its status says why."""
    from durable_assets.definitions import durable_jobs

    lost = _lost_run(instance)
    deployed = durable_jobs.get("refund_batch").code_versions
    _started_on_the_release_before(instance)
    job = refund_batch_job()
    lines = resume_lost_batches(
        instance, lambda name: job if name == job.name else None, DUE, durable_jobs=durable_jobs
    )
    assert any("code changed since the batch started" in line and "issued_refunds" in line for line in lines)
    assert not _children(instance, lost.run_id)
    status = batch_status(instance, BATCH)
    code = status.as_json()["code"]
    assert code["changed"] == ["issued_refunds"], code
    assert code["deployed"]["issued_refunds"] == deployed["issued_refunds"].version
    assert status.status.value == "failed"
    cli._print_status(status, as_json=False)
    out = capsys.readouterr().out
    assert "code changed since the batch started: issued_refunds fp-the-release-before →" in out
    assert "why: code changed since the batch started (issued_refunds)" in out
    assert _metric(instance, "durable_batches_code_changed") == 1


def test_the_failures_webhook_waits_for_the_decision_and_carries_the_code_change(
    instance: DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lost run's failure is not the batch's end while the automatic resume may still continue it
    (#35: the daemon path sent `batch.failed`, then `batch.succeeded`). Declined because the code
    changed, the decision enqueues the failure itself, and its body says why no resume follows."""
    import json

    from durable_assets.definitions import durable_jobs
    from durable_assets.ops.webhooks.batch import note_code_changed, terminal_event

    monkeypatch.setenv("DURABLE_WEBHOOK_URLS", "http://127.0.0.1:9/hook")  # refused: the row stays pending
    monkeypatch.setenv("DURABLE_WEBHOOK_SECRET", "whsec_" + "k" * 32)
    lost = _lost_run(instance)
    instance.add_run_tags(lost.run_id, {WILL_RETRY_TAG: "false"})  # the location was down: retry dropped
    _started_on_the_release_before(instance)
    note_code_changed(instance, lost, durable_jobs)
    event, why = terminal_event(instance, lost.run_id)
    assert event is None and "automatic resume has not decided yet" in why, why

    job = refund_batch_job()
    [line] = resume_lost_batches(
        instance, lambda name: job if name == job.name else None, DUE, durable_jobs=durable_jobs
    )
    assert "not resumed automatically: code changed" in line and "batch.failed" in line, line
    event, why = terminal_event(instance, lost.run_id)
    assert event is not None and event.event_type == "batch.failed", why
    data = json.loads(event.body)["data"]
    assert data["code"]["changed"] == ["issued_refunds"], data["code"]
    assert any("code changed since the batch started" in (s.get("error") or "") for s in data["steps"])


def test_a_lost_run_resumed_automatically_is_never_announced_as_failed(
    instance: DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    from durable_assets.ops.webhooks.batch import terminal_event

    monkeypatch.setenv("DURABLE_WEBHOOK_URLS", "http://127.0.0.1:9/hook")
    lost = _lost_run(instance)
    instance.add_run_tags(lost.run_id, {WILL_RETRY_TAG: "false"})
    assert terminal_event(instance, lost.run_id)[0] is None
    _tick(instance)
    event, why = terminal_event(instance, lost.run_id)
    assert event is None and "superseded" in why, why


def test_with_automatic_resume_off_a_lost_runs_failure_is_the_end_at_once(
    instance: DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    from durable_assets.ops.webhooks.batch import terminal_event

    monkeypatch.setenv("DURABLE_WEBHOOK_URLS", "http://127.0.0.1:9/hook")
    monkeypatch.setenv("DURABLE_AUTO_RESUME_MAX_ATTEMPTS", "0")
    lost = _lost_run(instance)
    instance.add_run_tags(lost.run_id, {WILL_RETRY_TAG: "false"})
    event, why = terminal_event(instance, lost.run_id)
    assert event is not None and event.event_type == "batch.failed", why


def test_a_changed_step_without_effects_does_not_stop_the_automatic_resume(instance: DagsterInstance) -> None:
    from durable_assets.definitions import durable_jobs
    from durable_assets.kit.code_versions import CodePins, StepCode

    lost = _lost_run(instance)
    deployed = durable_jobs.get("refund_batch").code_versions
    CodePins(DurableDatabase.for_instance(instance)).pin(
        BATCH, {**deployed, "batch_report": StepCode("fp-the-release-before")}
    )
    job = refund_batch_job()
    lines = resume_lost_batches(
        instance, lambda name: job if name == job.name else None, DUE, durable_jobs=durable_jobs
    )
    assert any("attempt 1 of 3" in line for line in lines), lines
    assert len(_children(instance, lost.run_id)) == 1
