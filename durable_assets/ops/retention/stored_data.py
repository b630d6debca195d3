"""A pruned batch's stored data: its step outputs, its files and its log, wherever they were kept.

Why: retention deletes a batch's runs, events and rows, but on shared storage its outputs and files
are rows of ``durable_blobs`` or objects in a bucket that nothing else ever deletes, so a Postgres
home would grow forever. A batch's data is found by name, never by pattern: a pattern such as
"every ``outputs/.../<ID>``" would also take another asset's partition, or an op's output that
happens to be called like the batch.

Where one batch's data can be (``<ID>`` the batch, which is its assets' partition):

- the configured storage when it is shared (``DURABLE_STORAGE=database`` or ``s3``): the outputs
  ``outputs/<asset path>/<ID>`` the kit's IO manager wrote, and the folder ``batches/<ID>/``
  (quarantine, reports, the stored ``--input`` copy);
- the instance folder, always: ``batches/<ID>/`` and ``logs/<ID>.log``, then under Dagster's
  ``storage/`` the filesystem IO manager's outputs ``<asset path>/<ID>`` (local storage's, or those
  written before the instance switched to shared storage) and each run's ``<run ID>/`` folder
  (its compute logs).

The asset paths are those of every registered job (batch IDs are unique across jobs, so another
job's path never holds this batch's output) and those the lineage's own events name (planned and
materialized): that also covers a distributed run's shard steps and an asset a job has since lost.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dagster import DagsterInstance

from durable_assets.errors import StorageError
from durable_assets.kit import DurableJobs
from durable_assets.kit.runtime import OUTPUTS_PREFIX, BatchKeys, BatchStorage, LocalStorage, Purged
from durable_assets.ops.batch_log import log_path
from durable_assets.ops.retention.pruning import Lineage, asset_paths_named

AssetPath = tuple[str, ...]


class StoredData:
    """Deletes pruned lineages' data from the configured storage and the instance folder."""

    def __init__(self, instance: DagsterInstance, storage: BatchStorage, jobs: DurableJobs) -> None:
        self.instance = instance
        self.storage = storage
        self.registered: set[AssetPath] = {tuple(a.key.path) for job in jobs for a in job.assets}
        self.root = Path(instance.root_directory)
        self.home = LocalStorage(self.root)
        self.dagster_storage = LocalStorage(instance.storage_directory())

    def asset_paths(self, lineage: Lineage) -> set[AssetPath]:
        """Every asset path whose output of this batch may be stored (read before its events go)."""
        return self.registered | asset_paths_named(self.instance, lineage.run_ids)

    def delete(self, lineages: Sequence[Lineage]) -> Purged:
        """Delete the lineages' data everywhere it may be; absent data is skipped, so a prune run
        again after a crash finishes what the killed one began. Shared storage is purged in one
        call for the whole chunk (one transaction on the database)."""
        shared_keys: list[str] = []
        batch_folders: list[str] = []
        home_keys: list[str] = []
        local_keys: list[str] = []
        run_folders: list[str] = []
        for lineage in lineages:
            batch = lineage.batch_id
            paths = sorted(self.asset_paths(lineage))
            shared_keys.extend("/".join([OUTPUTS_PREFIX, *path, batch]) for path in paths)
            local_keys.extend("/".join([*path, batch]) for path in paths)
            batch_folders.append(BatchKeys(batch).prefix)
            home_keys.append(log_path(self.instance, batch).relative_to(self.root).as_posix())
            run_folders.extend(f"{run_id}/" for run_id in lineage.run_ids)
        purged = Purged()
        if self.storage.shared:
            try:
                purged += self.storage.purge(shared_keys, batch_folders)
            except StorageError as exc:
                raise StorageError(
                    f"{exc}; the batches' rows are all still there, so the next prune deletes them again"
                ) from exc
        purged += self.home.purge(home_keys, batch_folders)
        return purged + self.dagster_storage.purge(local_keys, run_folders)
