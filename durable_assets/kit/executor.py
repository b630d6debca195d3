"""The durable jobs' executor: in process (the default) or on `job worker`s, chosen per run.

Why one executor with a choice, and not two jobs: a run launched from the Dagster UI, a schedule
tick or the daemon's automatic resume executes the code location's job, whatever process it
starts in; the CLI's ``--executor celery`` builds its own. So the location's job carries
Dagster's config-selector executor, in the shape of its ``multi_or_in_process_executor``:

.. code-block:: yaml

    execution:
      config:
        celery: {}        # or in_process: {} (the default)

and, for a launch that can add tags but not config (the launchpad's tag editor, a sensor), the run
tag ``durable/executor=celery`` selects it as well. Either way the run ends up tagged, so the
batch runtime, the provider's shared rate bucket, `job status`, `job resume` and the automatic
resume read it as they read a CLI-distributed run.

What a launch from the location cannot get is shards: they change the asset graph, and the
location's job is the graph the UI shows. Its steps run one Celery task each; a run that asks for
``durable/shards`` is refused before any step runs, naming `job run --executor celery --shards N`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dagster import (
    DagsterEvent,
    Executor,
    ExecutorDefinition,
    ExecutorRequirement,
    Field,
    InitExecutorContext,
    Selector,
    executor,
    in_process_executor,
    multiple_process_executor_requirements,
)

from durable_assets.errors import DurableError
from durable_assets.kit.dagster_internals import RetryMode, get_retries_config
from durable_assets.kit.modes import ExecutorKind
from durable_assets.kit.settings import DEFAULT_LEASE_TTL_S, DistributedSettings, KitSettings
from durable_assets.kit.tags import EXECUTOR_TAG, SHARDS_TAG

if TYPE_CHECKING:
    from durable_assets.kit.dagster_internals import ExecutionPlan, PlanOrchestrationContext

#: The executor's name in a run's config (``execution: {config: {celery: {}}}``) and in the UI.
EXECUTOR_NAME = "durable"

_DISTRIBUTED = DistributedSettings()


class ShardsFromLocationError(DurableError):
    """A run of the code location's job asked for shards, which only the CLI's sharded job has."""


def celery_config_fields(
    lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
    step_lease_ttl_s: float = _DISTRIBUTED.step_lease_ttl_s,
    step_max_attempts: int = _DISTRIBUTED.step_max_attempts,
) -> dict[str, Field]:
    """The distributed executor's config, with the defaults a code location's environment gives."""
    return {
        "retries": get_retries_config(),
        "lease_ttl_s": Field(float, default_value=lease_ttl_s, description="DURABLE_LEASE_TTL_S"),
        "step_lease_ttl_s": Field(
            float, default_value=step_lease_ttl_s, description="DURABLE_STEP_LEASE_TTL_S"
        ),
        "step_max_attempts": Field(
            int, default_value=step_max_attempts, description="DURABLE_STEP_MAX_ATTEMPTS"
        ),
    }


def execution_config(kind: ExecutorKind) -> dict[str, Any]:
    """The run config that selects ``kind`` (what a schedule or a launchpad adds)."""
    return {"execution": {"config": {kind.value: {}}}}


def selects_celery(run_config: Mapping[str, Any]) -> bool:
    """Whether a run's config selects the celery mode (``execution: {config: {celery: ...}}``)."""
    execution = run_config.get("execution") or {}
    config = execution.get("config") if isinstance(execution, Mapping) else None
    return isinstance(config, Mapping) and ExecutorKind.CELERY.value in config


def executor_kind_of_run(tags: Mapping[str, str]) -> ExecutorKind | None:
    """The executor a run's tags ask for, if any."""
    value = tags.get(EXECUTOR_TAG)
    return ExecutorKind(value) if value in set(ExecutorKind) else None


def durable_executor(
    settings: KitSettings | None = None, distributed: DistributedSettings | None = None
) -> ExecutorDefinition:
    """The location's executor: ``in_process`` by default, ``celery`` by config or run tag.

    ``settings`` and ``distributed`` are the location's environment (None: declared defaults):
    they are the ``celery`` mode's defaults, so ``celery: {}`` runs as `job run --executor celery`.
    """
    kit = settings or KitSettings()
    dist = distributed or DistributedSettings()
    celery_fields = celery_config_fields(kit.lease_ttl_s, dist.step_lease_ttl_s, dist.step_max_attempts)

    def requirements(config: Mapping[str, Any]) -> Sequence[ExecutorRequirement]:
        return multiple_process_executor_requirements() if ExecutorKind.CELERY.value in config else []

    @executor(
        name=EXECUTOR_NAME,
        config_schema=Field(
            Selector(
                {
                    ExecutorKind.IN_PROCESS.value: in_process_executor.config_schema.as_field(),
                    ExecutorKind.CELERY.value: Field(celery_fields, is_required=False),
                }
            ),
            default_value={ExecutorKind.IN_PROCESS.value: {}},
            description=(
                "in_process: the run's process runs every step (default). celery: `job worker`s run "
                "each step as a Celery task (also chosen by the run tag durable/executor=celery)."
            ),
        ),
        requirements=requirements,
    )
    def _durable(init_context: InitExecutorContext) -> DurableExecutor:
        config: dict[str, Any] = dict(init_context.executor_config)
        if ExecutorKind.CELERY.value in config:
            celery_config = config[ExecutorKind.CELERY.value]
            return DurableExecutor(ExecutorKind.CELERY, None, lambda: _celery(celery_config))
        in_process = in_process_executor.executor_creation_fn(  # type: ignore[misc]
            init_context._replace(
                executor_def=in_process_executor, executor_config=config[ExecutorKind.IN_PROCESS.value]
            )
        )
        # A run tagged celery with config left at its default: the celery mode's defaults.
        defaults = {"retries": config[ExecutorKind.IN_PROCESS.value].get("retries", {"enabled": {}})}
        defaults |= {k: f.default_value for k, f in celery_fields.items() if k != "retries"}
        return DurableExecutor(ExecutorKind.IN_PROCESS, in_process, lambda: _celery(defaults))

    return _durable


def _celery(config: Mapping[str, Any]) -> Executor:
    from durable_assets.kit.distributed import DurableCeleryExecutor, ExecutorKnobs

    retries = RetryMode.from_config(config["retries"])
    return DurableCeleryExecutor(
        retries if retries is not None else RetryMode.ENABLED,
        ExecutorKnobs(config["lease_ttl_s"], config["step_lease_ttl_s"], config["step_max_attempts"]),
    )


class DurableExecutor(Executor):
    """Runs the plan in process or on the workers: the config's choice, unless the run's tag says celery."""

    def __init__(
        self, configured: ExecutorKind, in_process: Executor | None, celery: Callable[[], Executor]
    ) -> None:
        self._configured = configured
        self._in_process = in_process
        self._make_celery = celery

    @functools.cached_property
    def _celery(self) -> Executor:
        """Built when a run goes to the workers: an in-process run never imports Celery (~40 ms)."""
        return self._make_celery()

    @property
    def _default(self) -> Executor:
        return self._in_process if self._in_process is not None else self._celery

    @property
    def retries(self) -> RetryMode:
        return self._default.retries

    @property
    def step_dependency_config(self) -> Any:
        return self._default.step_dependency_config

    def execute(
        self, plan_context: PlanOrchestrationContext, execution_plan: ExecutionPlan
    ) -> Iterator[DagsterEvent]:
        run = plan_context.dagster_run
        tagged = executor_kind_of_run(run.tags)
        if self._configured != ExecutorKind.CELERY and tagged != ExecutorKind.CELERY:
            yield from self._default.execute(plan_context, execution_plan)
            return
        if SHARDS_TAG in run.tags:
            raise ShardsFromLocationError(
                f"run {run.run_id} asks for {SHARDS_TAG}={run.tags[SHARDS_TAG]}, but the code location's "
                f"job {run.job_name!r} runs its steps as shown, one Celery task each; a sharded batch "
                "starts with `job run --executor celery --shards N` (and `job resume` continues it)"
            )
        if tagged != ExecutorKind.CELERY:
            # Chosen by config: tag the run before any step is sent, so each task's runtime, the
            # provider's shared bucket, `job status` and resumes see a distributed run.
            plan_context.instance.add_run_tags(run.run_id, {EXECUTOR_TAG: ExecutorKind.CELERY.value})
        yield from self._celery.execute(plan_context, execution_plan)
