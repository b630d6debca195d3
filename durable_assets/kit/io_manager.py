"""Step outputs in the batch storage (kit/storage.py), so a step on any host reads its parent's.

Dagster's default IO manager pickles each output into ``DAGSTER_HOME/storage``: fine on one host,
but a distributed step on another host, or a ``job resume`` from another host, finds nothing there.
This IO manager keeps the same keys (asset key + partition, so re-execution from failure reads the
parent run's outputs; an op's outputs by run, step and output name) and the same pickles, in the
storage the deployment chose. On local storage it *is* Dagster's filesystem IO manager, less its
debug lines (:class:`_WithoutDebugLines`).

Existing batches keep resuming: an output that the database or S3 does not hold is read from the
path the filesystem IO manager wrote it to before the instance switched storage.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any, cast

from dagster import (
    ConfigurableIOManagerFactory,
    FilesystemIOManager,
    InitResourceContext,
    InputContext,
    IOManager,
    MetadataValue,
    OutputContext,
)
from pydantic import Field

from durable_assets.errors import StorageError, StoredOutputIncompatibleError
from durable_assets.kit.storage import BatchStorage, StorageConfig, StorageKind, batch_storage

#: Outputs live under this key prefix; batch files under ``batches/`` (kit/storage.py BatchKeys).
OUTPUTS_PREFIX = "outputs"


class StoredOutputs(IOManager):
    """Pickled outputs in a :class:`BatchStorage`, falling back to the filesystem IO manager's files."""

    def __init__(self, storage: BatchStorage, legacy_dir: Path) -> None:
        self.storage = storage
        self.legacy_dir = legacy_dir

    def handle_output(self, context: OutputContext, obj: Any) -> None:
        if obj is None and context.dagster_type.is_nothing:
            return
        parts = _output_parts(context)
        uri = self.storage.put("/".join([OUTPUTS_PREFIX, *parts]), pickle.dumps(obj, pickle.HIGHEST_PROTOCOL))
        if obj is not None:  # as Dagster's IO manager: no "path" for a None the step did not mean to store
            context.add_output_metadata({"path": MetadataValue.path(uri)})

    def load_input(self, context: InputContext) -> Any:
        if context.dagster_type.is_nothing:
            return None
        parts = _input_parts(context)
        key = "/".join([OUTPUTS_PREFIX, *parts])
        data = self.storage.get(key)
        if data is None:
            legacy = self.legacy_dir.joinpath(*parts)
            if not legacy.is_file():
                raise StorageError(
                    f"no stored output {self.storage.uri(key)} (nor {legacy}): "
                    "the step that makes it has not run in this batch's lineage, or retention removed it"
                )
            data = legacy.read_bytes()  # written before this instance stored outputs in shared storage
        return pickle.loads(data)


def _output_parts(context: OutputContext) -> list[str]:
    if context.has_asset_key:
        return list(context.get_asset_identifier())
    return list(context.get_identifier())


def _input_parts(context: InputContext) -> list[str]:
    if context.has_asset_key:
        if context.has_asset_partitions and len(context.asset_partition_keys) != 1:
            raise StorageError(
                f"{context.asset_key.to_user_string()}: a step reads one batch (partition) at a time, "
                f"not {len(context.asset_partition_keys)}"
            )
        return list(context.get_asset_identifier())
    upstream = context.upstream_output
    if upstream is None:
        raise StorageError("an op input with no upstream output has nothing stored to load")
    return list(upstream.get_identifier())


class DurableIOManager(ConfigurableIOManagerFactory):
    """The kit's IO manager: step outputs where ``storage`` says (``DURABLE_STORAGE``)."""

    storage: StorageConfig = Field(default_factory=StorageConfig)

    def create_io_manager(self, context: InitResourceContext) -> IOManager:
        instance = context.instance
        if instance is None:
            raise StorageError("the durable IO manager needs a Dagster instance")
        legacy_dir = Path(instance.storage_directory())
        inner: IOManager
        if self.storage.resolved(instance) is StorageKind.LOCAL:
            inner = FilesystemIOManager(base_dir=str(legacy_dir)).create_io_manager(context)
        else:
            inner = StoredOutputs(batch_storage(instance, self.storage), legacy_dir)
        return CodeAwareLoads(inner)


#: What unpickling raises for an object whose class moved or whose module is gone.
_OLD_CODE_ERRORS = (pickle.UnpicklingError, ImportError, AttributeError, EOFError)


class CodeAwareLoads(IOManager):
    """Any IO manager, with one line for an output that older code wrote and this code cannot load.

    A batch resumed after a deploy reads outputs its first run stored: a class that moved or a
    module that is gone made that a pickle traceback. The line names the step, the code version the
    batch started on and the one deployed (kit/code_versions.py), and the way forward.
    """

    def __init__(self, inner: IOManager) -> None:
        self.inner = inner

    def handle_output(self, context: OutputContext, obj: Any) -> None:
        self.inner.handle_output(cast(OutputContext, _WithoutDebugLines(context)), obj)

    def load_input(self, context: InputContext) -> Any:
        try:
            return self.inner.load_input(cast(InputContext, _WithoutDebugLines(context)))
        except _OLD_CODE_ERRORS as exc:
            raise StoredOutputIncompatibleError(_incompatible(context, exc)) from exc


class _WithoutDebugLines:
    """An IO context whose ``log.debug`` goes nowhere; everything else is the context's own.

    Dagster's filesystem IO manager logs a debug line for every output written and two for every
    input read ("Writing file at ...", "Loading 1 partitions...", "Loading partition ... from ..."):
    37 event-log writes per refund batch, each a database commit, which no one reads. The path is
    already in the output's ``path`` metadata and in the LOADED_INPUT/HANDLED_OUTPUT events. Its
    warnings and errors still go to the run's log.
    """

    def __init__(self, context: InputContext | OutputContext) -> None:
        self._context = context

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    @property
    def log(self) -> _DebugDropped:
        return _DebugDropped(self._context.log)


class _DebugDropped:
    """A Dagster log manager without its ``debug`` (see :class:`_WithoutDebugLines`)."""

    def __init__(self, log: Any) -> None:
        self._log = log

    def debug(self, *_args: Any, **_kwargs: Any) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)


def _incompatible(context: InputContext, exc: BaseException) -> str:
    from durable_assets.kit.code_versions import CodePins, versions_from_metadata
    from durable_assets.kit.db import DurableDatabase
    from durable_assets.kit.tags import CODE_VERSIONS_KEY

    step = context.asset_key.path[-1] if context.has_asset_key else (context.name or "?")
    batch = context.partition_key if context.has_partition_key else None
    versions = ""
    try:
        deployed = versions_from_metadata(context.step_context.job_def.metadata.get(CODE_VERSIONS_KEY))
        pin = CodePins(DurableDatabase.for_instance(context.instance)).get(batch).get(step) if batch else None
        if pin is not None and step in deployed:
            versions = f" (the batch started on {pin.code.version}; deployed: {deployed[step].version})"
    except Exception:  # the versions only enrich the message; the message must still be said
        versions = ""
    resume = f"`job resume --id {batch}`" if batch else "resume the batch"
    return (
        f"the stored output of step {step} was written by other code and does not load on the code "
        f"deployed now{versions}: {type(exc).__name__}: {exc}. Deploy the code the batch started with "
        f"and {resume}"
    )
