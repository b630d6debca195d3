"""Retention deletes a pruned batch's stored data too, in whichever storage holds it, and nothing else.

A batch's step outputs, files (quarantine, reports, the stored input) and log outlive its rows
unless retention removes them: on shared storage nothing else ever would (``durable_blobs`` would
grow forever on Postgres). Each test stores a pruned batch's data and a kept batch's (whose ID
starts with the pruned one's, so a prefix match would take it), prunes, and reads what is left
from the storage itself: local files (SQLite home), ``durable_blobs`` (a Postgres home, on the real
server) and an S3 bucket (moto). A prune killed just before or just after the data goes is
finished by the next one, which never deletes a batch whose archive is not complete.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from dagster import DagsterInstance

from durable_assets.kit.crashpoints import CrashPoint
from durable_assets.kit.storage import LocalStorage, S3Storage, batch_storage, read_uri
from durable_assets.ops.retention import prune_batches
from durable_assets.ops.retention.pruning import RetentionPolicy
from durable_assets.ops.stored_files import storage_config
from tests.ops.test_retention import (
    REPO,
    add_batch,
    archives,
    instance,  # noqa: F401 (the fixture: a SQLite home, local storage; a Postgres home, the database)
    own_rows,
    run_ids_of,
)
from tests.support.s3 import CREDENTIALS, make_bucket, s3_server

PRUNED = "b-31d"
KEPT = "b-31d0"  # kept: younger; its ID starts with the pruned one's
POLICY = RetentionPolicy(completed_days=30)


def _seed(instance: DagsterInstance, batch_id: str) -> dict[str, bytes]:  # noqa: F811
    """One batch's data where its writers put it; returns it by where it is (key or path)."""
    storage = batch_storage(instance, storage_config())
    run_id = run_ids_of(instance, batch_id)[0]
    values = {
        # a registered asset's output, and one only this batch's events name ("refunds")
        "outputs/invoices/": b"pickled frame",
        "outputs/refunds/": b"pickled refunds",
        "batches/quarantine.csv": b"id,reason\n",
        "batches/input/in.csv": b"invoice_id\nI1\n",
    }
    seeded: dict[str, bytes] = {}
    for name, value in values.items():
        where, _, rest = name.partition("/")
        value = value + batch_id.encode()
        if not storage.shared:  # local storage: Dagster's IO manager files, batch files in the home
            if where == "outputs":
                path = Path(instance.storage_directory()) / rest / batch_id
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(value)
                seeded[str(path)] = value
            else:
                seeded[storage.put(f"batches/{batch_id}/{rest}", value)] = value
        else:
            key = f"outputs/{rest}{batch_id}" if where == "outputs" else f"batches/{batch_id}/{rest}"
            storage.put(key, value)
            seeded[storage.uri(key)] = value
    home = LocalStorage(instance.root_directory)  # on every storage: the log, the run's compute logs
    seeded[home.put(f"logs/{batch_id}.log", b"log")] = b"log"
    compute_log = f"storage/{run_id}/compute_logs/step.out"
    seeded[home.put(compute_log, b"step output")] = b"step output"
    return seeded


def _left(instance: DagsterInstance, seeded: dict[str, bytes]) -> dict[str, bytes]:  # noqa: F811
    """What of ``seeded`` is still stored, read back where it was written."""
    left = {}
    for where in seeded:
        value = read_uri(instance, where, storage_config())
        if value is not None:
            left[where] = value
    return left


def _prune_and_check(instance: DagsterInstance, storage_kind: str) -> None:  # noqa: F811
    """Prune; the pruned batch's data is gone, the kept one's whole; a second prune finds none."""
    add_batch(instance, PRUNED, ("failure", 200), ("success", 31))
    add_batch(instance, KEPT, ("success", 29))
    pruned, kept = _seed(instance, PRUNED), _seed(instance, KEPT)
    assert batch_storage(instance, storage_config()).location.startswith(storage_kind)

    report = prune_batches(instance, policy=POLICY).as_dict()

    assert [b["id"] for b in report["batches"]] == [PRUNED] and report["skipped"] == []
    assert _left(instance, pruned) == {}
    assert _left(instance, kept) == kept
    assert report["stored_objects_deleted"] == len(pruned)
    assert report["stored_bytes_deleted"] == sum(len(v) for v in pruned.values())
    assert not (Path(instance.root_directory) / "batches" / PRUNED).exists()
    again = prune_batches(instance, policy=POLICY).as_dict()
    assert again["batches"] == [] and again["stored_objects_deleted"] == 0


def test_a_pruned_batch_s_outputs_and_files_go_with_it(instance: DagsterInstance) -> None:  # noqa: F811
    """SQLite home: local files (``DAGSTER_HOME``). Postgres home: rows of ``durable_blobs``."""
    postgres = getattr(instance.run_storage, "postgres_url", None)
    _prune_and_check(instance, "durable://" if postgres else instance.root_directory)


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    with s3_server() as url:
        make_bucket(url, "batches")
        yield url


def test_a_pruned_batch_s_objects_go_from_s3_and_its_archive_stays(
    instance: DagsterInstance,  # noqa: F811
    s3_endpoint: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    for name, value in {
        **CREDENTIALS,
        "DURABLE_STORAGE": "s3",
        "DURABLE_S3_BUCKET": "batches",
        "DURABLE_S3_PREFIX": f"t/{tmp_path.name}",
        "DURABLE_S3_ENDPOINT_URL": s3_endpoint,
    }.items():
        monkeypatch.setenv(name, value)
    _prune_and_check(instance, f"s3://batches/t/{tmp_path.name}")
    bucket = S3Storage("batches", f"t/{tmp_path.name}", endpoint_url=s3_endpoint)
    [archive] = bucket.list("archive/")  # archives share the bucket (``archive/``): never purged
    assert archive.startswith(f"archive/{PRUNED}--")
    assert [k for k in bucket.list("") if PRUNED in k.split("/")] == []  # no object of it is left


_DRIVER = """
from dagster import DagsterInstance
from durable_assets.ops.retention import prune_batches
from durable_assets.ops.retention.pruning import RetentionPolicy
with DagsterInstance.get() as instance:
    prune_batches(instance, policy=RetentionPolicy(completed_days=30))
raise SystemExit(7)  # the crash point was never reached
"""


@pytest.mark.slow
@pytest.mark.parametrize("point", [CrashPoint.ARCHIVE_RENAMED, CrashPoint.BATCH_DATA_DELETED])
def test_a_prune_killed_around_the_data_delete_is_finished_by_the_next(
    instance: DagsterInstance,  # noqa: F811
    point: CrashPoint,
) -> None:
    """Killed with an archive renamed (the chunk's data not touched yet) or with the chunk's data
    deleted (its rows not yet): the rows stay until the data is gone, the next prune finishes both."""
    gone = ["b-31d", "c-40d"]
    for batch_id in gone:
        add_batch(instance, batch_id, ("success", 31))
    add_batch(instance, KEPT, ("success", 29))
    seeded = {b: _seed(instance, b) for b in [*gone, KEPT]}
    runs = {b: run_ids_of(instance, b) for b in seeded}
    crashed = subprocess.run(
        [sys.executable, "-c", _DRIVER],
        env={**os.environ, "PYTHONPATH": str(REPO), "DURABLE_CRASH_AT": f"{point.value}:1"},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    archive_dir = Path(instance.root_directory) / "archive"
    for batch_id in gone:  # the rows are all there; the data is gone only where archives are complete
        assert run_ids_of(instance, batch_id) == runs[batch_id] and own_rows(instance, batch_id) == 3
        data_deleted = point is CrashPoint.BATCH_DATA_DELETED
        assert _left(instance, seeded[batch_id]) == ({} if data_deleted else seeded[batch_id])
        assert len(archives(archive_dir, batch_id)) == (1 if data_deleted else int(batch_id == gone[0]))

    report = prune_batches(instance, policy=POLICY).as_dict()
    assert sorted(b["id"] for b in report["batches"]) == gone
    deleted_now = 0 if point is CrashPoint.BATCH_DATA_DELETED else sum(len(seeded[b]) for b in gone)
    assert report["stored_objects_deleted"] == deleted_now
    for batch_id in gone:
        assert run_ids_of(instance, batch_id) == [] and _left(instance, seeded[batch_id]) == {}
        assert len(archives(archive_dir, batch_id)) == 1
    assert _left(instance, seeded[KEPT]) == seeded[KEPT] and run_ids_of(instance, KEPT) == runs[KEPT]
