"""The mutating step split into N shard assets, merged back into the step users know.

Why static assets and not dynamic outputs: each shard is then a step of Dagster's own plan, with
its own checkpoint (the stored output, the materialization event), so re-execution from failure
re-runs only the shards that did not finish, and a shard redelivered to another worker re-runs
only its own rows (the ledger skips what it already confirmed). The merged asset keeps the
original asset's key, so downstream steps, asset checks, the status JSON and the summary read the
same asset as in a single-process run.

Shard ``k`` of ``N`` takes the rows of the step's first input whose shard column value falls to
``k`` (``ShardScheme``): the distinct values in a fixed order, dealt out in turn, so the shards
differ by at most one value. The sharded step lasts as long as its largest shard: CRC-32 of the
value mod N, the first scheme, left 270 rows as 57 to 79 (the step took 17% longer than an even
split). A batch keeps the scheme its first run was tagged with (``SHARD_SCHEME_TAG``; none: CRC-32):
a resume re-runs only the shards that did not finish and merges them with the stored ones, so all of
them must split one way, whatever the deployed code's default. The merged step
concatenates the shards' frames and adds up their materialization metadata (counts summed, maps of
counts summed per key, anything else taken from the first shard), so the step's figures are those
of the whole batch.
"""

# No `from __future__ import annotations`: Dagster reads the shard functions' annotations.

import enum
import inspect
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pandas as pd
from dagster import (
    AssetExecutionContext,
    AssetIn,
    AssetKey,
    AssetRecordsFilter,
    AssetsDefinition,
    DagsterInstance,
    DagsterRun,
    Failure,
    MaterializeResult,
    MetadataValue,
    asset,
)

from durable_assets.errors import DurableError, UnknownShardSchemeError
from durable_assets.kit.frames import frame_digest
from durable_assets.kit.modes import MAX_SHARDS
from durable_assets.kit.resources import BatchRuntime
from durable_assets.kit.shard_names import shard_name
from durable_assets.kit.shard_names import shard_position as shard_position  # re-exported
from durable_assets.kit.shard_names import step_of_shard as step_of_shard  # re-exported
from durable_assets.kit.tags import ROWS_KEY, SHARD_OF_KEY, SHARD_SCHEME_TAG


class ShardScheme(enum.StrEnum):
    """How a shard step's rows are split among its shards (the value of ``SHARD_SCHEME_TAG``)."""

    #: CRC-32 of the value (as text) mod N: stable across processes and hosts, unlike Python's
    #: salted ``hash``, but the shards' sizes vary as a binomial's (every batch started before
    #: ``SHARD_SCHEME_TAG`` existed, and resumed with it).
    CRC32 = "crc32"
    #: The distinct values (as text) ordered by CRC-32, then text, dealt out in turn: sizes within
    #: one value of each other, equal values in one shard, the order independent of the input's.
    BALANCED = "balanced"


#: What a new distributed batch is tagged with.
CURRENT_SCHEME = ShardScheme.BALANCED
#: How a batch whose first run has no ``SHARD_SCHEME_TAG`` splits: it started before the tag existed.
UNTAGGED_SCHEME = ShardScheme.CRC32


def scheme_of_batch(instance: DagsterInstance, run: DagsterRun) -> ShardScheme:
    """The scheme of ``run``'s batch: its lineage's first run's tag (CRC-32 when it has none).

    Not this run's own tag: a resume's run gets the deployed job's tags, and a batch started
    before a change of scheme must still split as its finished shards did. A first run that is
    no longer stored (pruned) leaves this run's tag, the deployed code's choice."""
    first = instance.get_run_by_id(run.root_run_id) if run.root_run_id else run
    tags = (first or run).tags
    value = tags.get(SHARD_SCHEME_TAG, UNTAGGED_SCHEME.value)
    try:
        return ShardScheme(value)
    except ValueError:
        raise UnknownShardSchemeError(
            f"batch run {run.run_id} splits its shards by {value!r} ({SHARD_SCHEME_TAG}), which this "
            "release of durable-assets does not know: resume it with the release that started it"
        ) from None


def _crc(value: object) -> int:
    return zlib.crc32(str(value).encode())


def shard_numbers(column: pd.Series, n: int, scheme: ShardScheme) -> pd.Series:
    """The shard (0 .. n-1) of each row, by its value in the shard column."""
    if scheme is ShardScheme.CRC32:
        return column.map(lambda v: _crc(v) % n)
    values = sorted({str(v) for v in column}, key=lambda text: (_crc(text), text))
    position = {text: i % n for i, text in enumerate(values)}
    return column.map(lambda v: position[str(v)])


def sharded_assets(
    original: AssetsDefinition,
    n: int,
    shard_column: str | None = None,
    guard: Callable[[Any, Mapping[str, Any]], None] | None = None,
) -> list[AssetsDefinition]:
    """``n`` shard assets of ``original`` and the merged asset (which keeps its key), in step order.

    ``guard(whole_input, resources)`` runs in every shard before its rows are selected: per-batch
    ceilings must see the whole batch.
    """
    if not 1 <= n <= MAX_SHARDS:
        raise ValueError(f"shards must be between 1 and {MAX_SHARDS}, not {n}")
    shards = [_shard(original, k, n, shard_column, guard) for k in range(n)]
    return [*shards, _merge(original, shards)]


def _plain(value: Any) -> Any:
    return getattr(value, "value", value)


def _shard(
    original: AssetsDefinition,
    k: int,
    n: int,
    shard_column: str | None,
    guard: Callable[[Any, Mapping[str, Any]], None] | None,
) -> AssetsDefinition:
    key = original.key
    step = key.path[-1]
    fn = original.op.compute_fn.decorated_fn  # type: ignore[union-attr]  # the durable_step wrapper
    inputs: dict[str, AssetKey] = dict(original.keys_by_input_name)
    if not inputs:
        raise ValueError(f"step {step!r} has no input to shard")
    # The first input *parameter* is the one split (a later one may be a lookup table, e.g. emails).
    first = next(name for name in inspect.signature(fn).parameters if name in inputs)
    resources = sorted(original.required_resource_keys - {"io_manager"})
    metadata = dict(original.specs_by_key[key].metadata or {})

    @asset(
        name=shard_name(step, k, n),
        ins={name: AssetIn(key=upstream) for name, upstream in inputs.items()},
        required_resource_keys=set(resources),
        partitions_def=original.partitions_def,
        group_name=original.group_names_by_key.get(key),
        retry_policy=original.op.retry_policy,
        metadata={**metadata, SHARD_OF_KEY: step},
        description=f"Shard {k + 1} of {n} of step {step!r}: the rows whose key falls to it.",
    )
    def _run_shard(context: AssetExecutionContext, **values: Any) -> Any:
        frame = values[first]
        bound = {name: getattr(context.resources, name) for name in resources}
        if guard is not None:
            try:
                guard(frame, bound)
            except DurableError as exc:
                raise Failure(description=f"{type(exc).__name__}: {exc}", allow_retries=False) from exc
        column = shard_column or str(frame.columns[0])
        try:
            scheme = scheme_of_batch(context.instance, context.run)
        except UnknownShardSchemeError as exc:
            raise Failure(description=f"{type(exc).__name__}: {exc}", allow_retries=False) from exc
        numbers = shard_numbers(frame[column], n, scheme)
        values[first] = frame[(numbers == k).to_numpy()].reset_index(drop=True)
        for runtime in (r for r in bound.values() if isinstance(r, BatchRuntime)):
            runtime.expect_shards(step, _counts(numbers, n))
        return fn(context, **values, **bound)

    return _run_shard


def rows_per_shard(column: pd.Series, n: int, scheme: ShardScheme) -> list[int]:
    """How many rows each of the ``n`` shards takes: the count of each shard until it counts its own."""
    return _counts(shard_numbers(column, n, scheme), n)


def _counts(numbers: pd.Series, n: int) -> list[int]:
    counts = numbers.value_counts()
    return [int(counts.get(k, 0)) for k in range(n)]


def _merge(original: AssetsDefinition, shards: Sequence[AssetsDefinition]) -> AssetsDefinition:
    key = original.key
    names = [f"shard_{k}" for k in range(len(shards))]
    metadata = dict(original.specs_by_key[key].metadata or {})

    @asset(
        key=key,
        ins={name: AssetIn(key=s.key) for name, s in zip(names, shards, strict=True)},
        partitions_def=original.partitions_def,
        group_name=original.group_names_by_key.get(key),
        metadata=metadata,
        description=original.descriptions_by_key.get(key),
    )
    def _merged(context: AssetExecutionContext, **frames: pd.DataFrame) -> MaterializeResult:
        parts = [frames[name] for name in names]
        out = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
        figures = [_shard_metadata(context, s.key) for s in shards]
        merged = merge_metadata(figures)
        merged.update({ROWS_KEY: len(out), "shards": len(shards)})
        return MaterializeResult(value=out, data_version=_version(out), metadata=merged)

    return _merged


def _version(df: pd.DataFrame) -> Any:
    from dagster import DataVersion

    return DataVersion(frame_digest(df))


def _shard_metadata(context: AssetExecutionContext, key: AssetKey) -> dict[str, Any]:
    """The newest materialization of this batch's shard (this run's, or the run that committed it)."""
    result = context.instance.fetch_materializations(
        AssetRecordsFilter(asset_key=key, asset_partitions=[context.partition_key]), limit=1, ascending=False
    )
    if not result.records:
        return {}
    mat = result.records[0].asset_materialization
    return {str(k): _plain(v) for k, v in (mat.metadata if mat else {}).items()}


def merge_metadata(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Counts add up, maps of counts add up per key, anything else is the first shard's."""
    out: dict[str, Any] = {}
    for part in parts:
        for name, value in part.items():
            if name == ROWS_KEY:
                continue
            if name not in out:
                out[name] = dict(value) if isinstance(value, Mapping) else value
            elif _is_count(value) and _is_count(out[name]):
                out[name] += value
            elif isinstance(value, Mapping) and isinstance(out[name], dict):
                for k, v in value.items():
                    current = out[name].get(k, 0)
                    out[name][k] = current + v if _is_count(v) and _is_count(current) else current
    return {name: MetadataValue.json(v) if isinstance(v, dict) else v for name, v in out.items()}


def _is_count(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
