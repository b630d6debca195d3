"""The location's ``durable`` executor: in process by default, celery by config or tag, never sharded.

The celery mode itself is proven with real workers (tests/distributed/test_ui_launch.py); here,
what needs no broker: the default runs in place, and a run of the location's job that asks for
shards is refused before any step runs (its plan is the graph the UI shows, not a sharded one).
"""

from __future__ import annotations

from pathlib import Path

from dagster import DagsterEventType, DagsterInstance, execute_job, reconstructable

from durable_assets.definitions import refund_batch_job
from durable_assets.kit.executor import EXECUTOR_NAME, execution_config, selects_celery
from durable_assets.kit.modes import ExecutorKind
from durable_assets.kit.tags import BATCH_TAG, EXECUTOR_TAG, PARTITION_TAG, SHARDS_TAG

CONFIG = {"ops": {"invoices": {"config": {"size": 20}}}}


def _run(instance: DagsterInstance, batch: str, **tags: str):  # type: ignore[no-untyped-def]
    instance.add_dynamic_partitions("batches", [batch])
    return execute_job(
        reconstructable(refund_batch_job),
        instance,
        run_config=CONFIG,
        tags={BATCH_TAG: batch, PARTITION_TAG: batch, **tags},
        raise_on_error=False,
    )


def test_the_locations_jobs_run_in_process_by_default(dagster_home: Path) -> None:
    assert refund_batch_job().executor_def.name == EXECUTOR_NAME
    with DagsterInstance.get() as instance, _run(instance, "exec-default") as result:
        assert result.success
        run = instance.get_run_by_id(result.run_id)
        assert run is not None and EXECUTOR_TAG not in run.tags


def test_a_run_of_the_locations_job_that_asks_for_shards_is_refused_before_any_step(
    dagster_home: Path,
) -> None:
    tags = {EXECUTOR_TAG: ExecutorKind.CELERY.value, SHARDS_TAG: "4"}
    with DagsterInstance.get() as instance:
        # (not entered: its context would build the run's resources, which a refused run never had)
        result = _run(instance, "exec-shards", **tags)
        assert not result.success
        assert not instance.all_logs(result.run_id, of_type=DagsterEventType.STEP_START)
        (ended,) = instance.all_logs(result.run_id, of_type=DagsterEventType.RUN_FAILURE)
        error = ended.dagster_event.event_specific_data.error  # type: ignore[union-attr]
        assert error is not None and error.cls_name == "ShardsFromLocationError", error
        assert "job run --executor celery --shards N" in error.message, error.message


def test_the_launcher_tags_a_run_whose_config_selects_celery() -> None:
    """What the run launcher asks before it launches: only the celery selection counts."""
    assert selects_celery(execution_config(ExecutorKind.CELERY))
    assert not selects_celery(execution_config(ExecutorKind.IN_PROCESS))
    assert not selects_celery(CONFIG) and not selects_celery({"execution": None})
