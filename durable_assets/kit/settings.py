"""The kit's knobs: provider pacing, the run's lease, the ledger's key horizon, distributed execution.

Declared here, next to the code they tune, and read where a job is wired (the code location's
``Definitions``, the CLI), never by the kit's own modules: values reach them through resource and
executor config (``BatchRuntime``, ``IdempotencyLedger``, the provider resource's pace, the
``durable_celery`` executor). Two values are read by the process that needs them, each in one
place (tests/test_architecture.py lists the kit's readers): :class:`CrashHooks`, a test hook every
process arms itself from (:mod:`durable_assets.kit.crashpoints`), and the Celery app's broker URL
and queue (``durable_assets.kit.celery_app.app``), on which a worker and an orchestrator meet.
"""

from __future__ import annotations

from typing import Literal

from durable_assets.settings import Section, var


class KitSettings(Section):
    """How fast a step may talk to the provider, and how a worker holds its batch."""

    concurrency: int = var("DURABLE_CONCURRENCY", 16, "concurrent provider requests", ge=1, le=256)
    rate_limit: float | None = var(
        "DURABLE_RATE_LIMIT",
        None,
        "a hard ceiling on requests/s to the provider. Unset, the process learns the provider's "
        "limit from its 429s (shared by every thread and step; `Retry-After` honoured) and runs at "
        "~1.0 of it ([pacing](docs/operations.md#provider-pacing-and-the-down-budget))",
        unset="none",
        gt=0,
    )
    provider_down_budget_s: float = var(
        "DURABLE_PROVIDER_DOWN_BUDGET_S",
        60.0,
        "how long the provider may answer nothing but faults (5xx, timeouts, refused connections) "
        "before the step fails, naming this variable; 429s never count. The step's retry policy "
        "does not add to it",
        gt=0,
    )
    lease_ttl_s: float = var("DURABLE_LEASE_TTL_S", 15.0, "lease timeout", gt=0)
    key_retention_hours: float = var(
        "DURABLE_KEY_RETENTION_HOURS",
        24.0,
        "provider key retention; older intents are reconciled by lookup",
        gt=0,
    )
    step_delay_s: float = var(
        "DURABLE_STEP_DELAY_S", 0.0, "pause before each step (demos and crash tests)", ge=0
    )


class DistributedSettings(Section):
    """Distributed execution (`job worker`, `job run --executor celery`)."""

    broker_url: str = var(
        "DURABLE_BROKER_URL",
        "pyamqp://guest@127.0.0.1:5672//",
        "the Celery broker of `job worker` and `job run --executor celery` (RabbitMQ) "
        "([Scaling out](#scaling-out))",
        secret=True,
    )
    broker_queue: str = var(
        "DURABLE_BROKER_QUEUE",
        "durable_steps",
        "the broker queue steps are sent to and workers consume (one per deployment, or per test)",
    )
    step_lease_ttl_s: float = var(
        "DURABLE_STEP_LEASE_TTL_S",
        15.0,
        "a distributed step's task renews its step lease every TTL/3; a task not renewed within the "
        "TTL is lost and its step is sent again",
        gt=0,
    )
    schedule_executor: Literal["in_process", "celery"] = var(
        "DURABLE_SCHEDULE_EXECUTOR",
        "in_process",
        "how the daily schedules' batches run: `celery` sends their steps to `job worker`s, one task "
        "per step, as a launch from the UI with `execution: {config: {celery: {}}}` "
        "([docs/ui.md](docs/ui.md#running-a-batch-on-the-workers)); a `DailyBatches(executor=...)` "
        "of a job's own wins",
    )
    step_max_attempts: int = var(
        "DURABLE_STEP_MAX_ATTEMPTS",
        3,
        "sends of one step's task in one run before the step fails (then `job resume` finishes it)",
        ge=1,
        le=100,
    )
    #: Two: a pool child runs one step, whose effect threads each hold a connection for one short
    #: statement at a time (docs/scaling.md, "Database connections"); 20 a child was what ran a
    #: stock max_connections=100 out with 2 workers x 2 children.
    worker_db_pool: int = var(
        "DURABLE_WORKER_DB_POOL",
        2,
        "database connections a `job worker` pool child (and a `job run --executor celery` "
        "orchestrator) keeps open for our tables; it opens as many again at a busy moment. With "
        "Dagster's storages, at most 2 x this + 6 per child "
        "([connections](docs/scaling.md#database-connections))",
        ge=1,
        le=32,
    )


class StorageSettings(Section):
    """Where step outputs, batch files and stored inputs live (kit/storage.py)."""

    storage: Literal["auto", "local", "database", "s3"] = var(
        "DURABLE_STORAGE",
        "auto",
        "where step outputs, batch files (quarantine, reports) and `--input` copies live: `local` "
        "(files under `DAGSTER_HOME`), `database` (the instance's Postgres database, table "
        "`durable_blobs`), `s3` (an S3-compatible store); `auto` is `database` on a Postgres "
        "instance, `local` on SQLite ([Scaling out](docs/scaling.md#many-hosts-what-is-shared))",
    )
    s3_bucket: str | None = var(
        "DURABLE_S3_BUCKET", None, "the bucket of `DURABLE_STORAGE=s3` (it must exist)", unset="none"
    )
    s3_prefix: str = var("DURABLE_S3_PREFIX", "durable-assets", "the key prefix under that bucket")
    s3_endpoint_url: str | None = var(
        "DURABLE_S3_ENDPOINT_URL",
        None,
        "an S3-compatible server's URL (MinIO, Ceph, ...); unset is AWS. Credentials: boto3's usual "
        "(`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, profiles, instance roles)",
        unset="AWS",
    )
    s3_region: str = var("DURABLE_S3_REGION", "us-east-1", "the bucket's region")


class CrashHooks(Section):
    """Test hooks, not configuration: kept out of the README."""

    crash_at: str | None = var(
        "DURABLE_CRASH_AT",
        None,
        "tests only: `POINT[:N][:stop]`, SIGKILL (with `:stop`, SIGSTOP) this process the Nth time it "
        "passes that named crash point (durable_assets/kit/crashpoints.py checks the spelling)",
        internal=True,
    )
    crash_counts: str | None = var(
        "DURABLE_CRASH_COUNTS",
        None,
        "tests only: a file to which the process appends, at exit, how often it passed each crash point",
        internal=True,
    )


#: Declared once, above; named for the lease's readers (a store built without a TTL uses it).
DEFAULT_LEASE_TTL_S: float = KitSettings.model_fields["lease_ttl_s"].default
