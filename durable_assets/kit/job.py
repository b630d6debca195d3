"""The durable-job descriptor: everything the operations layer needs to know about one job.

A pipeline describes itself once — its assets in step order, the labels users see, which steps
cause side effects and through which ledger scope, how ``--input``/``--size`` become the first
step's config, which lines its end-of-batch summary shows — and registers the descriptor in the
code location's :class:`DurableJobs`. The CLI, the HTTP API, metrics, webhooks and retention read
only descriptors, so a new job needs no change of theirs.

Labels and effect scopes travel on the assets' definition metadata (set by
:func:`durable_assets.kit.steps.durable_asset`), and the step list on the asset job's metadata, so
a running step and the Dagster UI see the same description the descriptor holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from dagster import (
    AssetChecksDefinition,
    AssetsDefinition,
    AssetSelection,
    Config,
    Definitions,
    DynamicPartitionsDefinition,
    ExecutorDefinition,
    JobDefinition,
    define_asset_job,
)
from pydantic import Field

from durable_assets.errors import StepWiringError, UnknownJobError
from durable_assets.kit.accounts import ProviderAccount
from durable_assets.kit.code_versions import StepCode, job_code_versions
from durable_assets.kit.dagster_internals import UnresolvedAssetJobDefinition
from durable_assets.kit.executor import durable_executor
from durable_assets.kit.schedules import DailyBatches
from durable_assets.kit.settings import DistributedSettings, KitSettings, StorageSettings
from durable_assets.kit.tags import (
    CODE_VERSIONS_KEY,
    EFFECT_SCOPE_KEY,
    EXECUTOR_TAG,
    FILES_KEY,
    GUARDRAIL_VARIABLES_KEY,
    LABEL_KEY,
    SHARD_SCHEME_TAG,
    SHARDS_TAG,
    STEPS_KEY,
)


@dataclass(frozen=True)
class DurableStep:
    """One step as users see it: Dagster's step key, its label, and the effect scope it writes through."""

    key: str
    label: str
    effect_scope: str | None = None

    @property
    def mutates(self) -> bool:
        return self.effect_scope is not None


@dataclass(frozen=True)
class SummaryLine:
    """One labelled figure: the value of the last of ``sources`` (step, key) that a step reported."""

    label: str
    sources: tuple[tuple[str, str], ...]
    detail: tuple[str, str] | None = None  # (step, key) shown after the figure, e.g. a breakdown
    money_detail: bool = False  # the detail maps currency -> minor units


@dataclass(frozen=True)
class SummarySpec:
    """The end-of-batch summary a job asks for; without one, every step's scalar metadata is shown."""

    lines: tuple[SummaryLine, ...] = ()
    files: tuple[tuple[str, str, str], ...] = ()  # (label, step, key) of a path the step wrote
    review_hint: str = ""  # where a person finds the held items


InputConfig = Callable[[str | None, int], Mapping[str, Any]]
#: A whole-batch check of a sharded step (a per-batch ceiling): its full input and its resources.
ShardGuard = Callable[[Any, Mapping[str, Any]], None]


def path_and_size(path: str | None, size: int) -> dict[str, Any]:
    """The usual first-step config: a file to read, or the size of a synthetic batch."""
    return {"size": size, **({"path": path} if path else {})}


class BatchInput(Config):
    """The first step's config that :func:`path_and_size` fills: ``--input`` and ``--size``.

    Why in the kit: the CLI, the HTTP API and the daily schedule all hand a batch its input this
    way, so every job's first step takes the same two fields (subclass it to word ``path`` for
    your input).
    """

    path: str | None = Field(default=None, description="CSV or Parquet file; unset = synthetic batch")
    size: int = Field(default=1000, ge=1, le=10_000_000, description="Synthetic batch size")


class DurableJob:
    """A Dagster asset job made durable: one batch is one partition, run as one run lineage.

    ``assets`` are the steps in the order users see them (a topological order of their deps); the
    first one receives ``input_config(path, size)`` as its run config. Each batch ID becomes a
    partition of ``partitions`` (default: the dynamic partitions every step is partitioned by), so
    two batches never share a stored output. ``daily`` adds a
    schedule (shipped stopped) that starts one batch per day, and ``job backfill`` for past days.
    ``check_input(path)`` reads an input file before a batch is created, so a bad file is a usage
    error (exit 2) that leaves the batch ID unused. ``shard_steps`` (default: the mutating
    steps that read an upstream frame) are the steps a distributed run splits into shards, by
    ``shard_column`` of their first input; ``shard_guards`` are their whole-batch checks.
    ``decisions`` are what a person may record for one held item with ``job decide`` (each word,
    best a ``StrEnum`` member, and what it makes the job do; :mod:`durable_assets.kit.decisions`).
    ``executor_def`` (default: the location's ``durable`` executor, in process unless a run
    selects ``celery`` by config or tag: :mod:`durable_assets.kit.executor`) replaces it.
    """

    def __init__(
        self,
        name: str,
        *,
        assets: Sequence[AssetsDefinition],
        description: str,
        partitions: DynamicPartitionsDefinition | None = None,
        checks: Sequence[AssetChecksDefinition] = (),
        summary: SummarySpec | None = None,
        input_config: InputConfig = path_and_size,
        executor_def: ExecutorDefinition | None = None,
        daily: DailyBatches | None = None,
        check_input: Callable[[str], object] | None = None,
        shard_steps: Sequence[str] | None = None,
        shard_column: str | None = None,
        shard_guards: Mapping[str, ShardGuard] | None = None,
        decisions: Mapping[str, str] | None = None,
    ) -> None:
        if not assets:
            raise ValueError(f"durable job {name!r} needs at least one asset")
        self.name = name
        self.assets = tuple(assets)
        self.partitions = partitions if partitions is not None else _shared_partitions(name, self.assets)
        self.description = description
        self.checks = tuple(checks)
        self.summary = summary
        #: Set by :meth:`DurableJobs.definitions`, which knows the location's resources.
        self.guardrail_variables: dict[str, dict[str, str]] | None = None
        self.input_config = input_config
        self.executor_def = executor_def
        self.daily = daily
        self.check_input = check_input
        #: word -> what it makes the job do; the words ``job decide`` accepts for this job's items.
        self.decisions = {str(word): what for word, what in (decisions or {}).items()}
        _check_step_order(name, self.assets)
        _check_kit_resources(name, self.assets)
        #: The steps a distributed run splits into shards: those named, else every mutating step
        #: that reads an upstream frame (a first step that makes its input has nothing to split).
        self.shard_steps = tuple(
            shard_steps
            if shard_steps is not None
            else (
                st.key
                for a, st in zip(self.assets, self.steps, strict=True)
                if st.mutates and a.keys_by_input_name
            )
        )
        #: The column of a shard step's first input that decides a row's shard (default: its first).
        self.shard_column = shard_column
        #: Checks each shard runs on the step's *whole* input first: a per-batch ceiling checked on
        #: a shard's rows alone would let N shards together exceed it.
        self.shard_guards = dict(shard_guards or {})
        unknown = set(self.shard_steps) - set(self.step_keys)
        if unknown:
            raise ValueError(f"durable job {name!r}: shard steps {sorted(unknown)} are not among its steps")

    def __repr__(self) -> str:
        return f"DurableJob({self.name!r}, steps={[s.key for s in self.steps]})"

    @cached_property
    def steps(self) -> tuple[DurableStep, ...]:
        return tuple(_step_of(a) for a in self.assets)

    @property
    def step_keys(self) -> tuple[str, ...]:
        return tuple(s.key for s in self.steps)

    @cached_property
    def code_versions(self) -> dict[str, StepCode]:
        """Each step's code version as deployed in this process (kit/code_versions.py)."""
        return job_code_versions(self.assets, self.step_keys)

    def label(self, step_key: str) -> str:
        return next((s.label for s in self.steps if s.key == step_key), step_key)

    @property
    def partitions_name(self) -> str:
        return self.partitions.name or self.name

    @property
    def job_metadata(self) -> dict[str, Any]:
        """What every run's job snapshot carries for the operations layer: the steps in order, the
        files for people, the guardrails' variables and the steps' code versions, so a status of
        any batch is read without importing this location (and a running step knows its code)."""
        return {
            STEPS_KEY: [[s.key, s.label] for s in self.steps],
            CODE_VERSIONS_KEY: {step: code.as_json() for step, code in self.code_versions.items()},
            FILES_KEY: [list(f) for f in self.summary.files] if self.summary else [],
            **(
                {GUARDRAIL_VARIABLES_KEY: self.guardrail_variables}
                if self.guardrail_variables is not None
                else {}
            ),
        }

    @cached_property
    def asset_job(self) -> UnresolvedAssetJobDefinition:
        return define_asset_job(
            self.name,
            selection=AssetSelection.assets(*self.assets),
            partitions_def=self.partitions,
            executor_def=self.executor_def,
            description=self.description,
            metadata=self.job_metadata,
        )

    def distributed_assets(self, shards: int) -> tuple[AssetsDefinition, ...]:
        """The job's assets for a distributed run: the shard step as ``shards`` shards and their merge."""
        from durable_assets.kit.sharding import sharded_assets

        out: list[AssetsDefinition] = []
        for a, st in zip(self.assets, self.steps, strict=True):
            out.extend(
                sharded_assets(a, shards, self.shard_column, self.shard_guards.get(st.key))
                if st.key in self.shard_steps
                else [a]
            )
        return tuple(out)

    def run_config(self, input_path: str | None, size: int) -> dict[str, Any]:
        """The run config of a batch's first run: the input, given to the first step."""
        return {"ops": {self.steps[0].key: {"config": dict(self.input_config(input_path, size))}}}


class DurableJobs:
    """The code location's durable jobs (the first is the default) and their ``Definitions``.

    One registration point: ``definitions()`` adds every job's assets, checks and asset job to
    whatever else the location defines (resources, schedules, sensors, other jobs).
    """

    def __init__(
        self,
        jobs: Iterable[DurableJob],
        *,
        provider_account: Callable[[Path], ProviderAccount] | None = None,
    ) -> None:
        #: The provider account the jobs' effects go to, given the instance's directory: asked
        #: before a batch exists (a missing key is a usage error, not a failed batch) and bound to
        #: the batch, so a resume against another account is refused. None: effects need no account.
        self.provider_account = provider_account
        self._jobs = {j.name: j for j in jobs}
        if not self._jobs:
            raise ValueError("register at least one durable job")
        self._defs: Definitions | None = None
        self._settings = KitSettings()
        self._distributed_settings = DistributedSettings()
        self._resources: dict[str, Any] = {}
        self._distributed: dict[tuple[str, int], JobDefinition] = {}

    def __iter__(self) -> Iterator[DurableJob]:
        return iter(self._jobs.values())

    def __len__(self) -> int:
        return len(self._jobs)

    @property
    def default(self) -> DurableJob:
        return next(iter(self._jobs.values()))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._jobs)

    def get(self, name: str | None) -> DurableJob:
        """The job called ``name`` (the default for None); an unknown name is a usage error."""
        if name is None:
            return self.default
        try:
            return self._jobs[name]
        except KeyError:
            raise UnknownJobError(
                f"no durable job {name!r}; registered: {', '.join(self._jobs)} (see `job jobs`)"
            ) from None

    def owning(self, job_name: str) -> DurableJob | None:
        """The durable job a Dagster run of ``job_name`` belongs to, if any."""
        return self._jobs.get(job_name)

    def definitions(
        self,
        *,
        resources: Mapping[str, Any] | None = None,
        jobs: Sequence[Any] = (),
        schedules: Sequence[Any] = (),
        sensors: Sequence[Any] = (),
        settings: KitSettings | None = None,
        distributed: DistributedSettings | None = None,
        storage: StorageSettings | None = None,
    ) -> Definitions:
        """The jobs' ``Definitions`` with ``resources`` over the kit's defaults (``ledger``, ``runtime``).

        ``settings``, ``distributed`` and ``storage`` are the kit's knobs as the location read them
        from its environment (None: the declared defaults): they tune the kit's resources (the IO
        manager's storage among them) and the distributed executor, so no step or task reads a
        variable itself. The operations layer's
        daemon parts (automatic resume, webhooks, retention) are added by
        :func:`durable_assets.location.definitions`, which calls this; a location should use that.
        """
        if self._defs is None:
            self._settings = settings or KitSettings()
            self._distributed_settings = distributed or DistributedSettings()
            from durable_assets.kit.resources import default_resources
            from durable_assets.kit.storage import StorageConfig

            stored = StorageConfig.from_settings(storage or StorageSettings())
            resources = {**default_resources(self._settings, stored), **(resources or {})}
            for j in self:
                _check_kit_resources(j.name, j.assets, resources)
            self._resources = dict(resources)
            from durable_assets.kit.guardrails import guardrail_variables, guardrails_used

            for j in self:  # before each job's Dagster job (and its metadata) is built
                j.guardrail_variables = guardrail_variables(
                    guardrails_used((*j.assets, *j.checks), resources)
                )
            self._defs = Definitions(
                assets=[a for j in self for a in j.assets],
                asset_checks=[c for j in self for c in j.checks],
                jobs=[*(j.asset_job for j in self), *jobs],
                schedules=[
                    *(
                        j.daily.schedule(j, self._distributed_settings.schedule_executor)
                        for j in self
                        if j.daily
                    ),
                    *schedules,
                ],
                sensors=list(sensors),
                resources=dict(resources),
                # The jobs' executor unless one names its own: in process, or on `job worker`s when
                # a run (the launchpad, a schedule, a tag) selects celery.
                executor=durable_executor(self._settings, self._distributed_settings),
            )
        return self._defs

    @property
    def resources(self) -> Mapping[str, Any]:
        """The resources given to :meth:`definitions` (the operations layer reads guardrails here)."""
        return dict(self._resources)

    def job_definition(self, name: str) -> JobDefinition:
        """The resolved Dagster job (needs :meth:`definitions` to have been called)."""
        if self._defs is None:
            raise RuntimeError("DurableJobs.definitions() has not been called in this code location")
        return self._defs.resolve_job_def(self.get(name).name)

    def distributed_job_definition(self, name: str, shards: int) -> JobDefinition:
        """Job ``name`` for the distributed executor, its shard step split into ``shards`` shards.

        Same job name, same partitions, same resources and asset checks as the code location's job,
        so the operations layer reads its runs as it reads any run of the job; built on demand (and
        once per process) in the orchestrator and in every worker, from the same descriptor.
        """
        from durable_assets.kit.distributed import durable_celery_executor, executor_config
        from durable_assets.kit.modes import ExecutorKind
        from durable_assets.kit.sharding import CURRENT_SCHEME

        if self._defs is None:
            raise RuntimeError("DurableJobs.definitions() has not been called in this code location")
        cached = self._distributed.get((name, shards))
        if cached is not None:
            return cached
        job = self.get(name)
        assets = job.distributed_assets(shards)
        asset_job = define_asset_job(
            job.name,
            selection=AssetSelection.assets(*assets),
            partitions_def=job.partitions,
            executor_def=durable_celery_executor.configured(
                executor_config(self._settings, self._distributed_settings), name="durable_celery"
            ),
            description=job.description,
            metadata=job.job_metadata,
            tags={
                EXECUTOR_TAG: ExecutorKind.CELERY.value,
                SHARDS_TAG: str(shards),
                SHARD_SCHEME_TAG: CURRENT_SCHEME.value,
            },
        )
        defs = Definitions(
            assets=list(assets),
            asset_checks=list(job.checks),
            jobs=[asset_job],
            resources=self._resources,
        )
        resolved = defs.resolve_job_def(job.name)
        self._distributed[(name, shards)] = resolved
        return resolved


def _check_kit_resources(
    name: str, assets: Sequence[AssetsDefinition], resources: Mapping[str, Any] | None = None
) -> None:
    """Every step gets ``runtime`` and ``ledger`` (a durable_asset asks for them): one that cannot
    would run without cancel, fence or ledger, so the job is refused when it is defined."""
    from durable_assets.kit.steps import KIT_RESOURCES

    for a in assets:
        for key, kind in KIT_RESOURCES.items():
            step = a.key.to_user_string()
            if key not in a.required_resource_keys:
                raise StepWiringError(
                    f"durable job {name!r}: step {step} does not require the {key!r} resource "
                    f"({kind.__name__}), so it would run without cancel, fence and ledger: define it "
                    "with durable_asset"
                )
            if resources is not None and not isinstance(resources.get(key), kind):
                raise StepWiringError(
                    f"durable job {name!r}: step {step} needs resource {key!r} to be a {kind.__name__}, "
                    f"got {type(resources.get(key)).__name__}; leave {key!r} out to get the kit's"
                )


def _step_of(asset: AssetsDefinition) -> DurableStep:
    key = asset.key
    metadata = asset.specs_by_key[key].metadata or {}
    name = key.path[-1]
    label = _plain(metadata.get(LABEL_KEY)) or name
    scope = _plain(metadata.get(EFFECT_SCOPE_KEY)) or None
    return DurableStep(name, str(label), str(scope) if scope else None)


def _plain(value: Any) -> Any:
    return getattr(value, "value", value)


def _shared_partitions(name: str, assets: Sequence[AssetsDefinition]) -> DynamicPartitionsDefinition:
    """The one dynamic partitions definition all steps share: a batch is one partition of it, so a
    step partitioned otherwise would read or write another batch's outputs."""
    found = assets[0].partitions_def
    if not isinstance(found, DynamicPartitionsDefinition) or any(a.partitions_def != found for a in assets):
        raise ValueError(
            f"durable job {name!r}: its steps must share one DynamicPartitionsDefinition "
            "(durable_asset(partitions_def=...)), or pass partitions="
        )
    return found


def _check_step_order(name: str, assets: Sequence[AssetsDefinition]) -> None:
    """Step numbers are what users read; a step listed before one it depends on would lie."""
    seen: set[Any] = set()
    mine = {a.key for a in assets}
    for a in assets:
        upstream = {dep for deps in a.asset_deps.values() for dep in deps} & mine
        if not upstream <= seen:
            missing = ", ".join(k.to_user_string() for k in upstream - seen)
            raise ValueError(f"durable job {name!r}: step {a.key.to_user_string()} comes before {missing}")
        seen.add(a.key)
