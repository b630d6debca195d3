"""Hosts that share only Postgres and RabbitMQ: every process in an instance folder of its own.

The orchestrator (`job run`), each `job worker` and the resuming `job resume` each get a copy of
``dagster_home/distributed``'s config in a different folder, all pointing at one database, so no
process can read a file another wrote under its own ``DAGSTER_HOME``. The input file is deleted and
the orchestrator SIGKILLed while a shard runs; the resume from a third folder still finishes, every
provider effect exactly once, and no instance folder holds a batch file or a step output.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.crash.helpers import EXIT_OK, InstanceReader, JobProcess, resume_until_accepted
from tests.support.credits import ProviderCredits, assert_credits_exact, expected_balances
from tests.support.homes import shipped_home

from .conftest import Cluster
from .test_distributed import status_of
from .test_worker_loss import a_running_shard, slow, step_leases

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

SIZE = 150


def _files_beyond_logs(home: Path) -> list[Path]:
    """What a process left in its instance folder besides its config, locks and its own logs."""
    own = {"dagster.yaml", "durable.db"}
    return [
        p
        for p in home.rglob("*")
        if p.is_file()
        and p.name not in own
        and not p.name.startswith(".")
        and not {"logs", "compute_logs", "history", "schedules"} & set(p.parts)
    ]


def test_processes_in_separate_homes_share_only_the_database(
    cluster: Cluster, reader: InstanceReader, tmp_path: Path
) -> None:
    from durable_assets.credit_migration.synthetic import synthetic_accounts

    slow(cluster)
    for n in (1, 2):
        cluster.worker(DAGSTER_HOME=str(shipped_home(tmp_path, "distributed", name=f"worker{n}_home")))
    batch_id = "dist-homes-1"
    source = tmp_path / "export.csv"
    synthetic_accounts(batch_id, SIZE).to_csv(source, index=False)  # the synthetic batch, as a file
    args = ["run", "--job", "credit_migration", "--id", batch_id, "--input", str(source)]
    run = JobProcess([*args, "--executor", "celery", "--shards", "4"], cluster.env(), cluster.logs)
    with step_leases(cluster) as store:
        a_running_shard(cluster, reader, store, batch_id, run)
    run.sigkill()
    source.unlink()  # only the batch's stored copy is left
    shutil.rmtree(cluster.home / "storage", ignore_errors=True)

    resume_home = shipped_home(tmp_path, "distributed", name="resume_home")
    ends = resume_until_accepted(batch_id, cluster.env(DAGSTER_HOME=str(resume_home)), cluster.logs, reader)
    assert ends[-1].proc.returncode == EXIT_OK, ends[-1].tail()

    status = status_of(cluster, batch_id)
    assert status["status"] == "succeeded", status
    assert all(s["status"] == "completed" for s in status["steps"]), status["steps"]
    stored = f"durable://batches/{batch_id}/"
    assert sorted(f["uri"] for f in status["files"]) == [
        f"{stored}migration_report.csv",
        f"{stored}quarantine.csv",
    ]
    stats = cluster.sim.quiet()
    expected = expected_balances([(batch_id, SIZE)])
    assert stats["customers_created"] == len(expected)
    assert_credits_exact(ProviderCredits.of_store(cluster.sim.db), expected)
    ran_on = {w.pid for w in cluster.workers if "execute_step" in w.stderr}
    assert ran_on, [w.tail() for w in cluster.workers]
    homes = [cluster.home, resume_home, *(tmp_path / f"worker{n}_home" for n in (1, 2))]
    for home in homes:
        assert _files_beyond_logs(home) == [], home
    # Each worker ran its steps in its own folder (its compute logs are there), never under the
    # orchestrator's path that the task's instance ref names: that folder stays without storage.
    assert not (cluster.home / "storage").exists()
    assert any((home / "storage").is_dir() for home in homes[2:])
