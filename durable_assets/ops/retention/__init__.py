"""Retention for every durable job's batches, for the CLI and Dagster (:mod:`.pruning` does the work).

``job prune`` and the daily ``retention`` schedule call the same :func:`prune_batches`, so a
batch's fate never depends on which one ran. Configuration comes from the environment
(``DURABLE_RETENTION_COMPLETED_DAYS``, ``DURABLE_RETENTION_FAILED_DAYS``,
``DURABLE_LEDGER_RETENTION_DAYS``, ``DURABLE_ARCHIVE_DIR``), overridden per call.

The schedule starts RUNNING: its whole point is that nobody has to remember it before the disk
fills, and it deletes nothing it has not archived first. Turn it off in the UI, or start it
stopped with ``DURABLE_RETENTION_SCHEDULE=stopped``.
"""

from pathlib import Path

from dagster import (
    Config,
    DagsterInstance,
    DefaultScheduleStatus,
    OpExecutionContext,
    ScheduleDefinition,
    in_process_executor,
    job,
    op,
)

from durable_assets.kit.runtime import BATCH_TAG, S3_SCHEME, S3Storage, StorageKind, batch_storage
from durable_assets.ops.registry import durable_jobs
from durable_assets.ops.retention.pruning import PruneReport, RetentionPolicy, prune
from durable_assets.ops.retention.stored_data import StoredData
from durable_assets.ops.settings import RetentionSettings
from durable_assets.ops.stored_files import storage_config


def policy_from_env(
    completed_days: float | None = None, failed_days: float | None = None, ledger_days: float | None = None
) -> RetentionPolicy:
    """Explicit values win over the environment, which wins over the defaults (30 / 90 / 365)."""
    env = RetentionSettings.current()

    def pick(value: float | None, configured: float) -> float:
        return value if value is not None else configured

    return RetentionPolicy(
        completed_days=pick(completed_days, env.completed_days),
        failed_days=pick(failed_days, env.failed_days),
        ledger_days=pick(ledger_days, env.ledger_days),
    )


def archive_dir_for(instance: DagsterInstance, archive_dir: str | None = None) -> Path:
    """The folder archives are written in (first, when they go on to an object store)."""
    chosen = archive_dir or RetentionSettings.current().archive_dir
    if chosen and not chosen.startswith(S3_SCHEME):
        return Path(chosen)
    return Path(instance.root_directory) / ("archive-staging" if archive_store_for(chosen) else "archive")


def archive_store_for(archive_dir: str | None = None) -> S3Storage | None:
    """The object store archives go to: ``s3://BUCKET/PREFIX`` given, or the batch storage's bucket
    (``archive/`` under its prefix) when ``DURABLE_STORAGE=s3`` and no folder is given; else None."""
    chosen = archive_dir or RetentionSettings.current().archive_dir
    config = storage_config()
    if chosen and chosen.startswith(S3_SCHEME):
        bucket, _, prefix = chosen[len(S3_SCHEME) :].partition("/")
        return S3Storage(bucket, prefix, endpoint_url=config.s3_endpoint_url, region=config.s3_region)
    if not chosen and config.kind == StorageKind.S3.value:
        prefix = f"{config.s3_prefix.strip('/')}/archive"
        return S3Storage(
            config.s3_bucket or "", prefix, endpoint_url=config.s3_endpoint_url, region=config.s3_region
        )
    return None


def prune_batches(
    instance: DagsterInstance,
    *,
    policy: RetentionPolicy | None = None,
    archive_dir: str | None = None,
    dry_run: bool = False,
) -> PruneReport:
    from durable_assets.ops.status import batch_status

    jobs = durable_jobs()
    stored = StoredData(instance, batch_storage(instance, storage_config()), jobs)
    return prune(
        instance,
        policy or policy_from_env(),
        archive_dir_for(instance, archive_dir),
        archive_store=archive_store_for(archive_dir),
        batch_tag=BATCH_TAG,
        partitions_def_names=sorted({job.partitions_name for job in jobs}),
        status_fn=lambda batch_id: batch_status(instance, batch_id).as_json(),
        dry_run=dry_run,
        delete_stored=stored.delete,
    )


# No ``from __future__ import annotations`` in this module: Dagster resolves the op's config
# class from its real annotation.
class PruneConfig(Config):
    """Unset fields fall back to the environment, then to the defaults (30 / 90 / 365 days)."""

    dry_run: bool = False
    completed_days: float | None = None
    failed_days: float | None = None
    ledger_days: float | None = None
    archive_dir: str | None = None


@op(description="Archive, then delete, finished batches older than the retention policy.")
def prune_old_batches(context: OpExecutionContext, config: PruneConfig) -> None:
    policy = policy_from_env(config.completed_days, config.failed_days, config.ledger_days)
    report = prune_batches(
        context.instance, policy=policy, archive_dir=config.archive_dir, dry_run=config.dry_run
    )
    summary = report.as_dict()
    context.log.info(
        f"{'would prune' if report.dry_run else 'pruned'} {len(report.batches)} batches "
        f"({report.runs} runs) in {report.seconds:.1f} s; {len(report.skipped)} skipped, "
        f"{len(report.in_progress)} in progress; {report.ledger_keys} ledger keys; "
        f"{report.stored.objects} stored objects ({report.stored.bytes} bytes) deleted"
    )
    context.add_output_metadata(
        {
            "batches": len(report.batches),
            "runs": report.runs,
            "skipped": len(report.skipped),
            "ledger_keys": report.ledger_keys,
            "stored_objects_deleted": report.stored.objects,
            "stored_bytes_deleted": report.stored.bytes,
            "seconds": round(report.seconds, 3),
            "archive_dir": summary["archive_dir"],
        }
    )


@job(executor_def=in_process_executor, description="Retention: see durable_assets/ops/retention/__init__.py")
def retention() -> None:
    prune_old_batches()


retention_schedule = ScheduleDefinition(
    name="retention_daily",
    job=retention,
    cron_schedule="30 3 * * *",
    execution_timezone="UTC",
    default_status=DefaultScheduleStatus.STOPPED
    if RetentionSettings.current().schedule == "stopped"
    else DefaultScheduleStatus.RUNNING,
    description="Daily retention at 03:30 UTC (archive, then delete old batches).",
)
