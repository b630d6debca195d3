"""Retention into an object store (``DURABLE_ARCHIVE_DIR=s3://BUCKET/PREFIX``): cold storage.

Each archive is written and fsynced locally first, stored whole (one PUT), read back and checked
complete, and only then are the lineage's rows deleted. A prune SIGKILLed after the PUT, or after
every archive is stored but before any delete, loses nothing: the rerun finds the stored archive,
does not store it twice, and finishes the delete. A store that refuses the archive deletes nothing.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from dagster import DagsterInstance

from durable_assets.errors import ArchiveError
from durable_assets.kit.storage import S3Storage
from durable_assets.ops.retention import prune_batches
from tests.ops.test_retention import (
    _DRIVER,
    AGES,
    REPO,
    add_batch,
    instance,  # noqa: F401 (the fixture)
    run_ids_of,
    snapshot,
)
from tests.support.s3 import CREDENTIALS, make_bucket, s3_server

BUCKET = "cold"
PREFIX = "archives"


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with s3_server() as url:
        make_bucket(url, BUCKET)
        yield url


@pytest.fixture
def cold(endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> S3Storage:
    """This test's prefix of the bucket, set as the archive destination of every prune it starts."""
    prefix = f"{PREFIX}/{tmp_path.name}"
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("DURABLE_ARCHIVE_DIR", f"s3://{BUCKET}/{prefix}")
    monkeypatch.setenv("DURABLE_S3_ENDPOINT_URL", endpoint)
    return S3Storage(BUCKET, prefix, endpoint_url=endpoint)


def _stored(cold: S3Storage, batch_id: str) -> list[str]:
    return [k for k in cold.list("") if k.startswith(f"{batch_id}--")]


def _records(cold: S3Storage, key: str) -> list[dict[str, object]]:
    data = cold.get(key)
    assert data is not None
    return [json.loads(line) for line in gzip.decompress(data).splitlines()]


AGED = {b: AGES[b] for b in ("ok-31d", "failed-91d", "retried-ok-31d", "ok-29d", "running")}
GONE = {b for b, (_, pruned) in AGED.items() if pruned}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("point", "nth"),
    [("_stored_complete", 2), ("_delete_event_logs", 1)],
    ids=["stored-not-checked", "all-stored-nothing-deleted"],
)
def test_a_prune_killed_after_storing_loses_nothing_and_stores_nothing_twice(
    instance: DagsterInstance,  # noqa: F811
    cold: S3Storage,
    point: str,
    nth: int,
) -> None:
    for batch_id, (runs, _) in AGED.items():
        add_batch(instance, batch_id, *runs)
    before = {b: snapshot(instance, b) for b in AGED}
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    crashed = subprocess.run(
        [sys.executable, "-c", _DRIVER, point, str(nth), "200"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert crashed.returncode == -9, crashed.stderr
    for batch_id in AGED:  # nothing deleted yet; whatever is stored is whole
        assert run_ids_of(instance, batch_id) == before[batch_id].run_ids
        for key in _stored(cold, batch_id):
            assert _records(cold, key)[-1]["kind"] == "end"
    assert _stored(cold, "ok-31d") or _stored(cold, "failed-91d") or _stored(cold, "retried-ok-31d")

    report = prune_batches(instance).as_dict()
    assert report["skipped"] == [] and report["archive_dir"] == cold.location
    assert {b["id"] for b in report["batches"]} == GONE
    for batch_id in AGED:
        stored = _stored(cold, batch_id)
        if batch_id in GONE:
            assert run_ids_of(instance, batch_id) == [] and len(stored) == 1
            records = _records(cold, stored[0])
            assert records[0]["run_ids"] == before[batch_id].run_ids
            assert records[-1]["events"] == sum(len(v) for v in before[batch_id].events.values())
        else:
            assert snapshot(instance, batch_id) == before[batch_id] and stored == []
    staging = Path(instance.root_directory) / "archive-staging"
    assert not [p for p in staging.iterdir() if p.name != ".prune.lock"]  # no local copy is left


def test_a_store_that_refuses_the_archive_deletes_nothing(
    instance: DagsterInstance,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.support.network import free_port

    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("DURABLE_ARCHIVE_DIR", f"s3://{BUCKET}/nowhere")
    monkeypatch.setenv("DURABLE_S3_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens
    add_batch(instance, "ok-31d", *AGES["ok-31d"][0])
    before = snapshot(instance, "ok-31d")
    with pytest.raises(ArchiveError, match="Nothing was deleted"):
        prune_batches(instance)
    assert snapshot(instance, "ok-31d") == before
