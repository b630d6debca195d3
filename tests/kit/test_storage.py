"""The batch storage's backends keep the same promises: whole values by key, listed, deleted, by URI.

Local files, the database (SQLite and the real Postgres) and S3 (a moto server started here, on a
free port, spoken to over HTTP by boto3 as any S3-compatible server would be).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_assets.errors import StorageError
from durable_assets.kit.db import DurableDatabase
from durable_assets.kit.storage import (
    BatchStorage,
    DatabaseStorage,
    LocalStorage,
    Purged,
    S3Storage,
    StorageConfig,
    StorageKind,
    read_uri,
)
from tests.support.s3 import CREDENTIALS, make_bucket, s3_server

BUCKET = "durable-test"


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    with s3_server() as endpoint:
        yield endpoint


@pytest.fixture
def s3_env(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Credentials boto3 reads (moto accepts any) and the bucket."""
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    make_bucket(s3_endpoint, BUCKET)
    return s3_endpoint


@pytest.fixture(params=["local", "sqlite", "postgres", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> BatchStorage:
    if request.param == "local":
        return LocalStorage(tmp_path / "home")
    if request.param == "sqlite":
        return DatabaseStorage(DurableDatabase(f"sqlite:///{tmp_path / 'durable.db'}"))
    if request.param == "postgres":
        return DatabaseStorage(DurableDatabase(str(request.getfixturevalue("pg_database"))))
    endpoint = request.getfixturevalue("s3_env")
    return S3Storage(BUCKET, f"t-{tmp_path.name}", endpoint_url=endpoint)


def test_a_value_is_stored_whole_replaced_listed_and_deleted(storage: BatchStorage) -> None:
    assert storage.get("batches/b1/quarantine.csv") is None
    uri = storage.put("batches/b1/quarantine.csv", b"a,b\n1,2\n")
    assert storage.get("batches/b1/quarantine.csv") == b"a,b\n1,2\n"
    assert storage.put("batches/b1/quarantine.csv", b"new") == uri  # same key, same URI
    assert storage.get("batches/b1/quarantine.csv") == b"new"
    storage.put("batches/b1/input/invoices.csv", b"\x00\xffbinary")
    storage.put("batches/b10/report.csv", b"other batch")
    assert storage.list("batches/b1/") == ["batches/b1/input/invoices.csv", "batches/b1/quarantine.csv"]
    storage.delete("batches/b1/quarantine.csv")
    storage.delete("batches/b1/quarantine.csv")  # absent: nothing happens
    assert storage.get("batches/b1/quarantine.csv") is None
    assert storage.get("batches/b1/input/invoices.csv") == b"\x00\xffbinary"


def test_an_empty_value_is_a_value(storage: BatchStorage) -> None:
    storage.put("outputs/x/b1", b"")
    assert storage.get("outputs/x/b1") == b""


def test_a_purge_removes_the_keys_and_folders_named_and_counts_only_what_was_there(
    storage: BatchStorage,
) -> None:
    storage.put("outputs/refunds/b_1", b"12345")
    storage.put("outputs/nested/asset/b_1", b"67")
    storage.put("batches/b_1/quarantine.csv", b"abc")
    storage.put("batches/b_1/input/in.csv", b"de")
    kept = {
        "outputs/refunds/b_10": b"other batch's output",  # the key it purges is a prefix of this one
        "outputs/refunds/bx1": b"'_' in a folder is no LIKE wildcard",
        "batches/b_10/quarantine.csv": b"other batch's file",
        "batches/bx1/quarantine.csv": b"x",
    }
    for key, value in kept.items():
        storage.put(key, value)
    keys = ["outputs/refunds/b_1", "outputs/nested/asset/b_1", "outputs/never/b_1"]
    assert storage.purge(keys, ["batches/b_1/"]) == Purged(objects=4, bytes=12)
    assert storage.purge(keys, ["batches/b_1/"]) == Purged()  # a re-run finds nothing left to count
    assert storage.list("batches/b_1/") == [] and storage.list("outputs/nested/") == []
    assert {k: storage.get(k) for k in kept} == kept
    with pytest.raises(StorageError, match="must end with '/'"):
        storage.purge([], ["batches/b_1"])


@pytest.mark.parametrize("key", ["", "/abs", "a/../b", "a//b", "./a"])
def test_a_key_that_could_escape_its_place_is_refused(storage: BatchStorage, key: str) -> None:
    with pytest.raises(StorageError, match="invalid storage key"):
        storage.put(key, b"x")


def test_each_backend_names_its_values_by_a_uri_any_host_reads(tmp_path: Path, s3_env: str) -> None:
    from dagster import DagsterInstance

    home = tmp_path / "home"
    home.mkdir()
    instance = DagsterInstance.local_temp(str(home))
    local = LocalStorage(instance.root_directory)
    database = DatabaseStorage(DurableDatabase.for_instance(instance))
    s3 = S3Storage(BUCKET, "uris", endpoint_url=s3_env)
    uris = {
        "local": local.put("batches/b/f.csv", b"L"),
        "database": database.put("batches/b/f.csv", b"D"),
        "s3": s3.put("batches/b/f.csv", b"S"),
    }
    assert uris["local"] == str(home / "batches" / "b" / "f.csv")
    assert uris["database"] == "durable://batches/b/f.csv"
    assert uris["s3"] == f"s3://{BUCKET}/uris/batches/b/f.csv"
    config = StorageConfig(s3_endpoint_url=s3_env)
    assert [read_uri(instance, u, config) for u in uris.values()] == [b"L", b"D", b"S"]
    assert read_uri(instance, "durable://batches/b/none.csv") is None


def test_a_local_put_leaves_no_temporary_file(tmp_path: Path) -> None:
    local = LocalStorage(tmp_path)
    local.put("batches/b/f.csv", b"x" * 100_000)
    assert [p.name for p in (tmp_path / "batches" / "b").iterdir()] == ["f.csv"]


def test_auto_is_the_database_on_postgres_and_files_on_sqlite(tmp_path: Path, pg_database: str) -> None:
    from dagster import DagsterInstance

    from tests.support.homes import make_home

    sqlite_home = make_home(tmp_path / "a")
    pg_home = make_home(tmp_path / "b", pg_database)
    auto = StorageConfig()
    assert auto.resolved(DagsterInstance.from_config(str(sqlite_home))) is StorageKind.LOCAL
    assert auto.resolved(DagsterInstance.from_config(str(pg_home))) is StorageKind.DATABASE
    assert StorageConfig(kind="s3").resolved(DagsterInstance.from_config(str(sqlite_home))) is StorageKind.S3


def test_s3_without_a_bucket_says_which_variable_to_set() -> None:
    with pytest.raises(StorageError, match="DURABLE_S3_BUCKET"):
        S3Storage("", endpoint_url="http://127.0.0.1:1")
