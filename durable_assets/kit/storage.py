"""Bytes every host of a deployment reaches: step outputs, batch files, stored inputs, archives.

Why: with several hosts (``job worker`` on each, ``job resume`` from anywhere), a step on host B
must read what host A's step returned, and a person must open the quarantine file whichever host
wrote it. The local filesystem of ``DAGSTER_HOME`` cannot give that; the database every host
already shares can (no new server to run), and an S3-compatible store can for outputs too large
for a database row.

One small interface, :class:`BatchStorage` (put, get, list, delete bytes by key, and purge many
keys and folders at once, for retention), three backends:

- :class:`LocalStorage`: files under the instance folder, the SQLite home's default;
- :class:`DatabaseStorage`: rows of ``durable_blobs`` in the instance's own database (Postgres or
  the SQLite home's ``durable.db``), migrated with the kit's other tables;
- :class:`S3Storage`: objects under a prefix of a bucket (boto3; any S3-compatible server).

Every ``put`` is atomic: a reader sees the whole new value or the old one (a temporary file
renamed, one transaction, one PUT of a whole object), so a crash never leaves half a file. Each
stored thing is named by a URI (:meth:`BatchStorage.uri`): the local path, ``durable://KEY`` for
the database, ``s3://BUCKET/PREFIX/KEY``; :func:`read_uri` reads one back from any host without
knowing which backend the writer was configured with.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

import sqlalchemy as sa
from dagster import Config

from durable_assets.errors import StorageError
from durable_assets.kit.db import DurableDatabase, blobs, now

if TYPE_CHECKING:
    from dagster import DagsterInstance

    from durable_assets.kit.settings import StorageSettings

#: The URI scheme of a value kept in the instance's database.
DATABASE_SCHEME: Final = "durable://"
S3_SCHEME: Final = "s3://"
#: Keys per ``DELETE ... IN`` of a database purge: far below SQLite's 32766 bound parameters.
PURGE_KEYS_PER_STATEMENT: Final = 1000
#: The most keys one S3 ``DeleteObjects`` request may name (the S3 API's own limit).
S3_DELETE_BATCH: Final = 1000
#: Key lookups of an S3 purge in flight at once: each is one round trip (~10-30 ms), and a chunk of
#: 200 batches has ~2,000 keys (42 s one at a time against a local moto server); boto3's client is
#: thread-safe and pools 10 connections, so more threads than that would only queue.
S3_LOOKUP_THREADS: Final = 10


class StorageKind(StrEnum):
    """``DURABLE_STORAGE``: ``auto`` is the database on a Postgres instance, local files on SQLite."""

    AUTO = "auto"
    LOCAL = "local"
    DATABASE = "database"
    S3 = "s3"


class StorageConfig(Config):
    """Which storage a process uses, as resource config (the kit reads no variable itself).

    Built from ``DURABLE_STORAGE`` and ``DURABLE_S3_*`` where a code location is wired
    (:meth:`from_settings`); the IO manager and :class:`~durable_assets.kit.resources.BatchRuntime`
    carry the same value, so a step's outputs and its files go to one place.
    """

    kind: str = StorageKind.AUTO.value
    s3_bucket: str | None = None
    s3_prefix: str = "durable-assets"
    s3_endpoint_url: str | None = None
    s3_region: str = "us-east-1"

    @classmethod
    def from_settings(cls, settings: StorageSettings) -> StorageConfig:
        return cls(
            kind=settings.storage,
            s3_bucket=settings.s3_bucket,
            s3_prefix=settings.s3_prefix,
            s3_endpoint_url=settings.s3_endpoint_url,
            s3_region=settings.s3_region,
        )

    def resolved(self, instance: DagsterInstance) -> StorageKind:
        """The backend for ``instance``: ``auto`` follows where the instance keeps its runs."""
        kind = StorageKind(self.kind)
        if kind is StorageKind.AUTO:
            postgres = getattr(instance.run_storage, "postgres_url", None)
            return StorageKind.DATABASE if postgres else StorageKind.LOCAL
        return kind


@dataclass(frozen=True)
class Purged:
    """What a purge removed: stored objects (files, rows, S3 objects) and their bytes.

    Only what was there counts, so a purge repeated after a crash reports what it really freed.
    """

    objects: int = 0
    bytes: int = 0

    def __add__(self, other: Purged) -> Purged:
        return Purged(self.objects + other.objects, self.bytes + other.bytes)


class BatchStorage(Protocol):
    """Bytes by key (``/``-separated, e.g. ``batches/b1/quarantine.csv``); ``put`` is atomic."""

    def put(self, key: str, data: bytes) -> str:
        """Store ``data`` at ``key`` whole (replacing any value) and return its URI."""
        ...

    def get(self, key: str) -> bytes | None:
        """The value at ``key``, or None when nothing is stored there."""
        ...

    def list(self, prefix: str) -> list[str]:
        """The keys that start with ``prefix``, sorted."""
        ...

    def delete(self, key: str) -> None:
        """Remove ``key`` (nothing happens when it is absent)."""
        ...

    def purge(self, keys: Sequence[str], folders: Sequence[str] = ()) -> Purged:
        """Remove every one of ``keys`` and everything under each of ``folders`` (prefixes that end
        in ``/``, so ``batches/b1/`` never reaches ``batches/b10/``); what is absent is skipped."""
        ...

    def uri(self, key: str) -> str:
        """Where ``key`` is, for people and for :func:`read_uri` on any host."""
        ...

    @property
    def location(self) -> str:
        """Where its keys are, for people: the folder, ``durable://`` or ``s3://BUCKET/PREFIX``."""
        ...

    @property
    def shared(self) -> bool:
        """Whether another host reaches it (the local folder does not)."""
        ...


def _check_key(key: str) -> str:
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise StorageError(
            f"invalid storage key {key!r}: relative, '/'-separated, no empty, '.' or '..' part"
        )
    return key


def _check_folder(folder: str) -> str:
    """A purge's folder is a key prefix ending in ``/``: without it, a prefix ``batches/b1`` would
    also take ``batches/b10/...``, another batch's files."""
    if not folder.endswith("/"):
        raise StorageError(f"invalid storage folder {folder!r}: it must end with '/'")
    _check_key(folder[:-1])
    return folder


class LocalStorage:
    """Files under ``root`` (the instance folder): a key is a relative path.

    A put writes a temporary file beside the target, fsyncs it and renames it over the target, so
    a reader (or a crash) sees the old file or the new one, never a half.
    """

    shared = False

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def path(self, key: str) -> Path:
        return self.root / _check_key(key)

    def put(self, key: str, data: bytes) -> str:
        target = self.path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return self.uri(key)

    def get(self, key: str) -> bytes | None:
        try:
            return self.path(key).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def list(self, prefix: str) -> list[str]:
        if not self.root.is_dir():
            return []
        found = (
            p.relative_to(self.root).as_posix()
            for p in self.root.rglob("*")
            if p.is_file() and not p.name.startswith(".")
        )
        return sorted(k for k in found if k.startswith(prefix))

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path(key).unlink()

    def purge(self, keys: Sequence[str], folders: Sequence[str] = ()) -> Purged:
        """Files unlinked, folders removed whole (a put's leftover temporary files with them)."""
        objects = size = 0
        for key in keys:
            path = self.path(key)
            try:
                found = path.lstat()
            except (FileNotFoundError, NotADirectoryError):
                continue
            if stat.S_ISREG(found.st_mode):  # a folder at a key's place is nobody's value
                path.unlink(missing_ok=True)
                objects, size = objects + 1, size + found.st_size
        for folder in folders:
            top = self.path(_check_folder(folder)[:-1])
            if not top.is_dir():
                continue
            for dirpath, _dirs, files in os.walk(top):
                for name in files:
                    with contextlib.suppress(FileNotFoundError):
                        size += os.lstat(os.path.join(dirpath, name)).st_size
                        objects += 1
            with contextlib.suppress(FileNotFoundError):  # removed meanwhile: a re-run finishes it
                shutil.rmtree(top)
        return Purged(objects, size)

    def uri(self, key: str) -> str:
        return str(self.path(key))

    @property
    def location(self) -> str:
        return str(self.root)


class DatabaseStorage:
    """Rows of ``durable_blobs`` in the instance's database: every host of a deployment reaches it.

    A put is one upsert in one transaction. Values are whole (no chunking): Postgres ``bytea``
    holds up to 1 GB, more than a batch's frame should be; larger outputs belong in S3.
    """

    shared = True

    def __init__(self, db: DurableDatabase) -> None:
        self.db = db

    def put(self, key: str, data: bytes) -> str:
        values = {"key": _check_key(key), "data": data, "size": len(data), "stored_at": now()}
        with self.db.transaction() as conn:
            conn.execute(self.db.upsert(blobs, ["key"], values))
        return self.uri(key)

    def get(self, key: str) -> bytes | None:
        with self.db.read() as conn:
            found = conn.execute(sa.select(blobs.c.data).where(blobs.c.key == key)).scalar()
        return None if found is None else bytes(found)

    def list(self, prefix: str) -> list[str]:
        with self.db.read() as conn:
            rows = conn.execute(
                sa.select(blobs.c.key)
                .where(sa.func.substr(blobs.c.key, 1, len(prefix)) == prefix)
                .order_by(blobs.c.key)
            )
            return [str(k) for (k,) in rows]

    def delete(self, key: str) -> None:
        with self.db.transaction() as conn:
            conn.execute(sa.delete(blobs).where(blobs.c.key == key))

    def purge(self, keys: Sequence[str], folders: Sequence[str] = ()) -> Purged:
        """One transaction: the rows go together or not at all. Keys are matched in statements of
        :data:`PURGE_KEYS_PER_STATEMENT` (SQLite's bound-parameter limit), folders by an escaped
        ``LIKE 'folder/%'``; ``RETURNING`` counts exactly what each statement removed."""
        matches: list[sa.ColumnElement[bool]] = [
            blobs.c.key.in_(keys[i : i + PURGE_KEYS_PER_STATEMENT])
            for i in range(0, len(keys), PURGE_KEYS_PER_STATEMENT)
        ]
        if folders:
            checked = [_check_folder(f) for f in folders]
            matches.append(sa.or_(*(blobs.c.key.startswith(f, autoescape=True) for f in checked)))
        sizes: list[int] = []
        with self.db.transaction() as conn:
            for match in matches:
                sizes.extend(conn.execute(sa.delete(blobs).where(match).returning(blobs.c.size)).scalars())
        return Purged(len(sizes), sum(sizes))

    def uri(self, key: str) -> str:
        return f"{DATABASE_SCHEME}{key}"

    @property
    def location(self) -> str:
        return DATABASE_SCHEME


class S3Storage:
    """Objects under ``prefix`` in ``bucket`` of an S3-compatible store.

    A PUT of a whole object is atomic at S3 (readers see the old object or the new one), so a put
    needs no temporary key; archives, which must also be checked before anything is deleted, read
    their object back (ops/retention).
    """

    shared = True

    def __init__(
        self,
        bucket: str,
        prefix: str = "durable-assets",
        *,
        endpoint_url: str | None = None,
        region: str = "us-east-1",
        client: Any = None,
    ) -> None:
        if not bucket:
            raise StorageError("DURABLE_STORAGE=s3 needs a bucket: set DURABLE_S3_BUCKET")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint_url = endpoint_url
        if client is None:
            import boto3

            client = boto3.client("s3", endpoint_url=endpoint_url, region_name=region)
        self.client = client

    def _object(self, key: str) -> str:
        _check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def put(self, key: str, data: bytes) -> str:
        try:
            self.client.put_object(Bucket=self.bucket, Key=self._object(key), Body=data)
        except Exception as exc:
            raise StorageError(f"cannot store {self.uri(key)}: {exc}") from exc
        return self.uri(key)

    def get(self, key: str) -> bytes | None:
        try:
            answer = self.client.get_object(Bucket=self.bucket, Key=self._object(key))
        except self.client.exceptions.NoSuchKey:
            return None
        except Exception as exc:
            raise StorageError(f"cannot read {self.uri(key)}: {exc}") from exc
        return bytes(answer["Body"].read())

    def list(self, prefix: str) -> list[str]:
        base = f"{self.prefix}/" if self.prefix else ""
        keys: list[str] = []
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=base + prefix
        )
        for page in pages:
            keys.extend(str(o["Key"])[len(base) :] for o in page.get("Contents", []))
        return sorted(keys)

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._object(key))

    def purge(self, keys: Sequence[str], folders: Sequence[str] = ()) -> Purged:
        """Folders listed, keys looked up (:data:`S3_LOOKUP_THREADS` at a time), then everything
        found removed in ``DeleteObjects`` calls of up to 1000 keys; an object the store
        refuses to delete is a :class:`StorageError` (the caller prunes again)."""
        found: dict[str, int] = {}
        try:
            pages = self.client.get_paginator("list_objects_v2")
            for folder in folders:
                for page in pages.paginate(
                    Bucket=self.bucket, Prefix=self._object(_check_folder(folder)[:-1]) + "/"
                ):
                    found.update((str(o["Key"]), int(o["Size"])) for o in page.get("Contents", []))
            with ThreadPoolExecutor(S3_LOOKUP_THREADS) as pool:
                for name, size in pool.map(self._size_of, [self._object(k) for k in keys]):
                    if size is not None:
                        found[name] = size
            names = sorted(found)
            for i in range(0, len(names), S3_DELETE_BATCH):
                batch = [{"Key": n} for n in names[i : i + S3_DELETE_BATCH]]
                answer = self.client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True}
                )
                if answer.get("Errors"):
                    first_error = answer["Errors"][0]
                    raise StorageError(
                        f"{S3_SCHEME}{self.bucket}/{first_error.get('Key')} was not deleted: "
                        f"{first_error.get('Code')} {first_error.get('Message')}"
                    )
        except StorageError:
            raise
        except Exception as exc:
            raise StorageError(f"cannot purge from {self.location}: {exc}") from exc
        return Purged(len(found), sum(found.values()))

    def _size_of(self, name: str) -> tuple[str, int | None]:
        """The object's size, or None when absent: a listing of one, so an absent key costs no
        error (the key itself sorts before any longer key it is a prefix of)."""
        answer = self.client.list_objects_v2(Bucket=self.bucket, Prefix=name, MaxKeys=1)
        first = (answer.get("Contents") or [{}])[0]
        return name, int(first["Size"]) if first.get("Key") == name else None

    def uri(self, key: str) -> str:
        return f"{S3_SCHEME}{self.bucket}/{self._object(key)}"

    @property
    def location(self) -> str:
        return f"{S3_SCHEME}{self.bucket}/{self.prefix}"


def batch_storage(instance: DagsterInstance, config: StorageConfig | None = None) -> BatchStorage:
    """The storage ``config`` chooses for ``instance`` (default: ``auto``)."""
    config = config or StorageConfig()
    kind = config.resolved(instance)
    if kind is StorageKind.DATABASE:
        return DatabaseStorage(DurableDatabase.for_instance(instance))
    if kind is StorageKind.S3:
        return S3Storage(
            config.s3_bucket or "",
            config.s3_prefix,
            endpoint_url=config.s3_endpoint_url,
            region=config.s3_region,
        )
    return LocalStorage(instance.root_directory)


def is_stored_uri(value: str) -> bool:
    """Whether ``value`` names something in shared storage rather than a local path."""
    return value.startswith((DATABASE_SCHEME, S3_SCHEME))


def read_uri(instance: DagsterInstance, uri: str, config: StorageConfig | None = None) -> bytes | None:
    """The bytes a URI of :meth:`BatchStorage.uri` names, read from this host; None when absent.

    ``config`` gives the S3 endpoint and region (the bucket and key are in the URI).
    """
    if uri.startswith(DATABASE_SCHEME):
        return DatabaseStorage(DurableDatabase.for_instance(instance)).get(uri[len(DATABASE_SCHEME) :])
    if uri.startswith(S3_SCHEME):
        config = config or StorageConfig()
        bucket, _, key = uri[len(S3_SCHEME) :].partition("/")
        s3 = S3Storage(bucket, "", endpoint_url=config.s3_endpoint_url, region=config.s3_region)
        return s3.get(key)
    try:
        return Path(uri).read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        return None


@contextlib.contextmanager
def local_copy(
    instance: DagsterInstance, path_or_uri: str, config: StorageConfig | None = None
) -> Iterator[Path]:
    """A local file with the bytes ``path_or_uri`` names, for readers that need a path (pandas).

    A local path is yielded as is; a stored value is copied into a temporary file with the same
    name (so its suffix still says CSV or Parquet), removed afterwards.
    """
    if not is_stored_uri(path_or_uri):
        yield Path(path_or_uri)
        return
    data = read_uri(instance, path_or_uri, config)
    if data is None:
        raise StorageError(f"{path_or_uri} is not stored (was it deleted by retention?)")
    with tempfile.TemporaryDirectory(prefix="durable-input-") as tmp:
        target = Path(tmp) / path_or_uri.rsplit("/", 1)[-1]
        target.write_bytes(data)
        yield target


@dataclass(frozen=True)
class BatchKeys:
    """The keys of one batch's things, so writers and readers spell them once."""

    batch_id: str

    @property
    def prefix(self) -> str:
        return f"batches/{self.batch_id}/"

    def file(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def input(self, name: str) -> str:
        return f"{self.prefix}input/{name}"
