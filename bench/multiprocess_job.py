"""Scenario 5's baseline: the same refund assets and resources under Dagster's default
``multiprocess_executor`` (one process per step), started like ``job run`` starts a batch.

The only difference from ``durable_assets.definitions`` is the executor. One adjustment keeps the
batch lease meaningful: every step of a multiprocess run is a separate process, so they share one
lease-holder identity (the run's launching process) instead of each looking like a rival worker.

    python -c "from bench.multiprocess_job import main; main()" BATCH_ID SIZE
"""

from __future__ import annotations

import os
import socket
import sys

from dagster import AssetSelection, Definitions, JobDefinition, define_asset_job, multiprocess_executor

from durable_assets.definitions import REFUND_JOB, defs
from durable_assets.kit import leases
from durable_assets.ops import runner
from durable_assets.refunds.assets import ALL_ASSETS, BATCHES

OWNER_ENV = "BENCH_LEASE_OWNER"

if os.environ.get(OWNER_ENV):
    _owner = os.environ[OWNER_ENV]
    leases.process_owner = lambda: _owner
    runner.process_owner = lambda: _owner

multiprocess_defs = Definitions(
    assets=ALL_ASSETS,
    jobs=[
        define_asset_job(
            REFUND_JOB,
            selection=AssetSelection.assets(*ALL_ASSETS),
            partitions_def=BATCHES,
            executor_def=multiprocess_executor,
        )
    ],
    resources=defs.resources,
)


def refund_batch_job_multiprocess() -> JobDefinition:
    """Module-level, so ``reconstructable`` can rebuild it in every step process."""
    return multiprocess_defs.resolve_job_def(REFUND_JOB)


def main() -> None:
    batch_id, size = sys.argv[1], int(sys.argv[2])
    if not os.environ.get(OWNER_ENV):  # set before the step processes are spawned: they inherit it
        os.environ[OWNER_ENV] = f"{socket.gethostname()}:{os.getpid()}"
        leases.process_owner = runner.process_owner = lambda: os.environ[OWNER_ENV]
    from durable_assets.ops.cli import _instance

    runner.refund_batch_job = refund_batch_job_multiprocess  # start_batch's reconstructable target
    run = runner.start_batch(_instance(False), batch_id, size=size)
    print(f"batch {batch_id}: {run.status.value}")
    sys.exit(0 if run.status.value == "SUCCESS" else 1)
