"""A batch's files as the operations layer reaches them: the stored input, the files for people.

On shared storage (``DURABLE_STORAGE=database`` or ``s3``; the default of a Postgres instance)
nothing a batch needs or writes stays on one host: ``job run --input`` stores the file's bytes
with the batch before its first run, so a first step on any worker, and every resume, reads the
same bytes; the quarantine and reports are read back by the URI their step's metadata names, from
whichever host asks (``job status``, ``GET /runs/{ID}/files/{name}``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dagster import DagsterInstance

from durable_assets.errors import StorageError
from durable_assets.kit.runtime import BatchKeys, StorageConfig, StorageSettings, batch_storage, read_uri


def storage_config() -> StorageConfig:
    """This process's storage (``DURABLE_STORAGE``, ``DURABLE_S3_*``), as the code location wires it."""
    return StorageConfig.from_settings(StorageSettings.current())


def store_input(instance: DagsterInstance, batch_id: str, input_path: str | None) -> str | None:
    """What the first step's ``path`` is: the stored copy's URI on shared storage, else the
    file's absolute path (local storage: every step runs on this host's files)."""
    if not input_path:
        return None
    path = Path(input_path).resolve()
    storage = batch_storage(instance, storage_config())
    if not storage.shared:
        return str(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise StorageError(f"cannot read {path} to store it with batch {batch_id!r}: {exc}") from exc
    return storage.put(BatchKeys(batch_id).input(path.name), data)


@dataclass(frozen=True)
class BatchFile:
    """One file a batch's step wrote for people: its name, label, step and where it is."""

    name: str
    label: str
    step: str
    uri: str


def batch_files(
    metadata: dict[str, dict[str, object]], files: Sequence[tuple[str, str, str]]
) -> list[BatchFile]:
    """The files the job's summary names (``(label, step, key)``, ``SummarySpec.files``) that the
    batch's steps wrote."""
    found: list[BatchFile] = []
    for label, step, key in files:
        uri = metadata.get(step, {}).get(key)
        if uri:
            text = str(uri)
            found.append(BatchFile(text.rsplit("/", 1)[-1], label, step, text))
    return found


def read_batch_file(instance: DagsterInstance, file: BatchFile) -> bytes:
    """The file's bytes, from whichever storage its URI names."""
    data = read_uri(instance, file.uri, storage_config())
    if data is None:
        raise StorageError(f"{file.uri} is gone (retention removes a batch's files with the batch)")
    return data
