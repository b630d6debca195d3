"""What a durable step wraps around a user's asset function.

Before the body runs: the step reports itself ("step n of N, <label>"), then refuses to start if
the batch was canceled or this worker was superseded. While it runs: side effects go through an
:class:`EffectRunner` bound to the step (ledger, fence, cancel guard, pacing, progress). When it
fails: our own errors become a Dagster ``Failure`` the UI shows plainly, and only transient ones
may be retried by the asset's ``RetryPolicy``.
"""

# No `from __future__ import annotations`: Dagster reads the wrapped functions' annotations.
import functools
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import pandas as pd
from dagster import (
    AssetExecutionContext,
    Backoff,
    DataVersion,
    DynamicPartitionsDefinition,
    Failure,
    Jitter,
    MaterializeResult,
    RetryPolicy,
    asset,
)
from dagster._core.storage.dagster_run import DagsterRunStatus

from durable_assets.kit.account_bindings import AccountBindings
from durable_assets.kit.accounts import ProviderAccount
from durable_assets.kit.crashpoints import CrashPoint, crash_point
from durable_assets.kit.effects import EffectRunner
from durable_assets.kit.errors import DurableError, TransientProviderError
from durable_assets.kit.frames import frame_digest
from durable_assets.kit.job import EFFECT_SCOPE_KEY, LABEL_KEY, STEPS_KEY
from durable_assets.kit.ledger import Intent, LedgerEntry
from durable_assets.kit.pacing import Backoff as PacingBackoff
from durable_assets.kit.pacing import RateLimiter
from durable_assets.kit.progress import Progress
from durable_assets.kit.resources import BatchRuntime, IdempotencyLedger
from durable_assets.kit.sharding import step_of_shard

#: Whole-step retries for transient faults that escape a step (the ledger makes a retried step
#: resume where it stopped). A provider down for its whole down budget is not one of them:
#: ProviderUnavailableError fails the step at once, so the budget is the whole wait, not 4 times it.
TRANSIENT_RETRY = RetryPolicy(max_retries=3, delay=2, backoff=Backoff.EXPONENTIAL, jitter=Jitter.PLUS_MINUS)

P = ParamSpec("P")
R = TypeVar("R")


def durable_step(fn: Callable[P, R]) -> Callable[P, R]:
    """Report, check cancel and fence, run; our errors become a plain ``Failure`` (transient ones retry).

    The asset must take ``context`` first and a ``runtime: BatchRuntime`` resource.
    """

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        context = args[0]
        runtime = kwargs.get("runtime")
        if isinstance(context, AssetExecutionContext) and isinstance(runtime, BatchRuntime):
            # First the step's own report (no count yet: of=0), so progress never names the step before.
            runtime.report(step_progress(context, 0, 0), force=True)
            if runtime.step_delay_seconds:
                time.sleep(runtime.step_delay_seconds)  # demos and crash tests: a visibly slow batch
            _check_step_boundary(context, runtime)
        crash_point(CrashPoint.STEP_START)
        try:
            output = fn(*args, **kwargs)
        except TransientProviderError:
            raise
        except DurableError as exc:
            raise Failure(description=f"{type(exc).__name__}: {exc}", allow_retries=False) from exc
        crash_point(CrashPoint.STEP_BODY_DONE)
        return output

    return wrapper


def durable_asset(
    *,
    label: str,
    partitions_def: DynamicPartitionsDefinition,
    effect_scope: str | None = None,
    retry_policy: RetryPolicy | None = TRANSIENT_RETRY,
    metadata: Mapping[str, Any] | None = None,
    **asset_kwargs: Any,
) -> Callable[[Callable[..., Any]], Any]:
    """``@asset`` plus :func:`durable_step`, labelled for users.

    ``effect_scope`` names the ledger scope the step's side effects go through (None: it causes
    none); it is what ``job jobs`` shows as the step's effect, and documentation for the UI.
    """

    def decorate(fn: Callable[..., Any]) -> Any:
        return asset(
            partitions_def=partitions_def,
            retry_policy=retry_policy,
            metadata={**(metadata or {}), LABEL_KEY: label, EFFECT_SCOPE_KEY: effect_scope or ""},
            **asset_kwargs,
        )(durable_step(fn))

    return decorate


def _check_step_boundary(context: AssetExecutionContext, runtime: BatchRuntime) -> None:
    run = context.instance.get_run_by_id(context.run_id)
    if run is not None and run.status == DagsterRunStatus.CANCELING:
        raise Failure(description="BatchCanceledError: the run was asked to stop", allow_retries=False)
    try:
        runtime.check_may_continue()
    except DurableError as exc:
        raise Failure(description=f"{type(exc).__name__}: {exc}", allow_retries=False) from exc


def step_progress(context: AssetExecutionContext, done: int, of: int) -> Progress:
    """``step n/N <label> done/of`` for the running step, numbered as its durable job lists it."""
    name = step_of_shard(context.asset_key.path[-1])  # a shard counts as its step
    listed: Any = context.job_def.metadata.get(STEPS_KEY)
    steps = [tuple(pair) for pair in getattr(listed, "value", listed) or []]
    keys = [k for k, _label in steps]
    if name in keys:
        n = keys.index(name)
        return Progress(n + 1, len(steps), str(steps[n][1]), done, of)
    # Materialized outside its durable job (an ad-hoc run of a few assets): no step numbers to give.
    return Progress(1, 1, name, done, of)


def effect_runner(
    context: AssetExecutionContext,
    runtime: BatchRuntime,
    ledger: IdempotencyLedger,
    *,
    scope: str,
    perform: Callable[[Intent], Mapping[str, Any]],
    verify: Callable[[Intent, Mapping[str, Any]], str | None] | None = None,
    lookup: Callable[[LedgerEntry], Mapping[str, Any] | None] | None = None,
    concurrency: int = 16,
    limiter: RateLimiter | None = None,
    backoff: PacingBackoff | None = None,
    account: ProviderAccount | None = None,
    lookup_first: bool = False,
) -> EffectRunner:
    """An :class:`EffectRunner` for this step: its run owns the claims, the lease's fence guards every
    send, a cancel stops the next one, and progress counts settled intents.

    ``account`` is the provider account the effects go to: the batch is bound to it on first use
    (another account later is :class:`ProviderAccountMismatchError`) and the keys live in its
    namespace. Without one, the effects share the ledger's default namespace (one foreign system).
    """
    keys = ledger.ledger
    if account is not None:
        if runtime.has_batch:
            AccountBindings(keys.db).bind(runtime.batch_id, account)
        keys = keys.for_account(account.namespace)
    optional: dict[str, Any] = {}
    if verify is not None:
        optional["verify"] = verify
    if lookup is not None:
        optional["lookup"] = lookup
    return EffectRunner(
        ledger=keys,
        scope=scope,
        owner=context.run_id,
        perform=perform,
        fence=runtime.fence,
        guard=runtime.check_may_continue,
        concurrency=concurrency,
        limiter=limiter or RateLimiter(None),
        backoff=backoff or PacingBackoff(),
        key_retention_s=ledger.key_retention_s,
        lookup_first=lookup_first,
        on_progress=lambda done, of: runtime.report(step_progress(context, done, of), force=done == of),
        **optional,
    )


def frame_result(df: pd.DataFrame, metadata: Mapping[str, Any]) -> MaterializeResult:
    """A step's output frame with its row count, and a data version that is its content hash."""
    return MaterializeResult(
        value=df,
        data_version=DataVersion(frame_digest(df)),
        metadata={"rows": len(df), **metadata},
    )


def batch_dir(context: AssetExecutionContext) -> Path:
    """Where a step writes files for people (quarantine, report): one directory per batch."""
    return Path(context.instance.root_directory) / "batches" / context.partition_key
