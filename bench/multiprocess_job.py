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

from dagster import multiprocess_executor

from durable_assets.definitions import defs
from durable_assets.kit import DurableJob, DurableJobs, leases
from durable_assets.ops import runner
from durable_assets.ops.registry import CODE_LOCATION_ENV
from durable_assets.refunds.job import refund_batch

OWNER_ENV = "BENCH_LEASE_OWNER"

if os.environ.get(OWNER_ENV):
    _owner = os.environ[OWNER_ENV]
    leases.process_owner = lambda: _owner
    runner.process_owner = lambda: _owner

#: This module is a code location of its own (DURABLE_CODE_LOCATION): the refund job, one executor changed.
durable_jobs = DurableJobs(
    [
        DurableJob(
            refund_batch.name,
            assets=refund_batch.assets,
            partitions=refund_batch.partitions,
            description=refund_batch.description,
            executor_def=multiprocess_executor,
        )
    ]
)
multiprocess_defs = durable_jobs.definitions(resources=defs.resources)


def main() -> None:
    batch_id, size = sys.argv[1], int(sys.argv[2])
    if not os.environ.get(OWNER_ENV):  # set before the step processes are spawned: they inherit it
        os.environ[OWNER_ENV] = f"{socket.gethostname()}:{os.getpid()}"
        leases.process_owner = runner.process_owner = lambda: os.environ[OWNER_ENV]
    os.environ[CODE_LOCATION_ENV] = __name__ if __name__ != "__main__" else "bench.multiprocess_job"
    from durable_assets.ops.cli import _instance

    run = runner.start_batch(_instance(False), batch_id, size=size)
    print(f"batch {batch_id}: {run.status.value}")
    sys.exit(0 if run.status.value == "SUCCESS" else 1)
