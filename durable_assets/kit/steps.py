"""What a durable step wraps around a user's asset function.

Before the body runs: the step reports itself ("step n of N, <label>"), then refuses to start if
the batch was canceled or this worker was superseded. While it runs: side effects go through an
:class:`EffectRunner` bound to the step (ledger, fence, cancel guard, pacing, progress). When it
fails: our own errors become a Dagster ``Failure`` the UI shows plainly, and only transient ones
may be retried by the asset's ``RetryPolicy``.
"""

# No `from __future__ import annotations`: Dagster reads the wrapped functions' annotations.
import functools
import inspect
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from inspect import Parameter, Signature
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import pandas as pd
from dagster import (
    AssetExecutionContext,
    Backoff,
    DagsterRunStatus,
    DataVersion,
    DynamicPartitionsDefinition,
    Failure,
    Jitter,
    MaterializeResult,
    RetryPolicy,
    RunsFilter,
    asset,
)

from durable_assets.errors import (
    BatchCanceledError,
    CodeChangedError,
    DurableError,
    StepWiringError,
    TransientProviderError,
)
from durable_assets.kit.account_bindings import AccountBindings
from durable_assets.kit.accounts import ProviderAccount
from durable_assets.kit.code_versions import (
    CodePins,
    code_changes,
    effects_recorded,
    refusal,
    versions_from_metadata,
)
from durable_assets.kit.crashpoints import CrashPoint, crash_point
from durable_assets.kit.effects import EffectRunner
from durable_assets.kit.frames import frame_digest
from durable_assets.kit.ledger import Intent, LedgerEntry
from durable_assets.kit.pacing import Backoff as PacingBackoff
from durable_assets.kit.pacing import PacedProvider, RateLimiter
from durable_assets.kit.progress import Progress, ShardOf
from durable_assets.kit.resources import BatchRuntime, IdempotencyLedger
from durable_assets.kit.shard_names import shard_position, step_of_shard
from durable_assets.kit.storage import BatchStorage, batch_storage, local_copy
from durable_assets.kit.tags import (
    BATCH_TAG,
    CANCELED_KEY,
    CODE_VERSIONS_KEY,
    EFFECT_SCOPE_KEY,
    LABEL_KEY,
    PARTITION_TAG,
    ROWS_KEY,
    STEPS_KEY,
)

#: Whole-step retries for transient faults that escape a step (the ledger makes a retried step
#: resume where it stopped). A provider down for its whole down budget is not one of them:
#: ProviderUnavailableError fails the step at once, so the budget is the whole wait, not 4 times it.
TRANSIENT_RETRY = RetryPolicy(max_retries=3, delay=2, backoff=Backoff.EXPONENTIAL, jitter=Jitter.PLUS_MINUS)

P = ParamSpec("P")
R = TypeVar("R")


#: The kit resources every durable step gets, whether or not its function names them: cancel, fence
#: and progress come from ``runtime``, the ledger from ``ledger``. The kit supplies both by default.
KIT_RESOURCES: dict[str, type] = {"runtime": BatchRuntime, "ledger": IdempotencyLedger}


def durable_step(fn: Callable[P, R]) -> Callable[P, R]:
    """Report, check cancel and fence, run; our errors become a plain ``Failure`` (transient ones retry).

    The asset takes ``context`` first. It need not name the ``runtime`` and ``ledger`` resources:
    the wrapper asks Dagster for them anyway (a step that forgot ``runtime`` used to lose its
    cancel and fence checks silently), and :func:`effect_runner` finds them on ``context.resources``.
    """
    signature = inspect.signature(fn, eval_str=True)
    added = [name for name in KIT_RESOURCES if name not in signature.parameters]

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        # A step need not take ``context`` either: the running step's is Dagster's current one.
        context = args[0] if args else AssetExecutionContext.get()
        runtime = kwargs.get("runtime")
        for name in added:
            kwargs.pop(name, None)
        if isinstance(context, AssetExecutionContext) and isinstance(runtime, BatchRuntime):
            # First the step's own report (no count yet: of=0), so progress never names the step before.
            runtime.report(step_progress(context, 0, 0), force=True, shard=_shard(context))
            if runtime.step_delay_s:
                time.sleep(runtime.step_delay_s)  # demos and crash tests: a visibly slow batch
            _check_step_boundary(context, runtime)
            _check_step_code(context, runtime)
        crash_point(CrashPoint.STEP_START)
        try:
            output = fn(*args, **kwargs)
        except TransientProviderError:
            raise
        except DurableError as exc:
            raise step_failure(exc) from exc
        if isinstance(context, AssetExecutionContext) and isinstance(runtime, BatchRuntime):
            _report_shard_done(context, runtime)
        crash_point(CrashPoint.STEP_BODY_DONE)
        return output

    # Dagster reads resource parameters from the signature: advertise the kit's ones too.
    params = list(signature.parameters.values())
    at = next((i for i, p in enumerate(params) if p.kind == Parameter.VAR_KEYWORD), len(params))
    params[at:at] = [Parameter(n, Parameter.KEYWORD_ONLY, annotation=KIT_RESOURCES[n]) for n in added]
    wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {
        **{p.name: p.annotation for p in params if p.annotation is not Parameter.empty},
        **(
            {"return": signature.return_annotation}
            if signature.return_annotation is not Signature.empty
            else {}
        ),
    }
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
    none); it is what ``job jobs`` shows as the step's effect, and what :func:`effect_runner`
    uses, so it is written once.
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
        raise step_failure(BatchCanceledError("the run was asked to stop"))
    try:
        runtime.check_may_continue()
    except DurableError as exc:
        raise step_failure(exc) from exc


def _check_step_code(context: AssetExecutionContext, runtime: BatchRuntime) -> None:
    """Pin the batch's code at its first step; stop a step whose code changed since, if that change
    needs a person (kit/code_versions.py). Every run of a batch passes here, whoever launched it:
    `job resume` checks before launching, and this is what holds for the daemon and the UI."""
    db = runtime.database
    deployed = versions_from_metadata(context.job_def.metadata.get(CODE_VERSIONS_KEY))
    if db is None or not runtime.has_batch or not deployed:
        return
    batch_id = runtime.batch_id
    store = CodePins(db)
    pins = store.pin(batch_id, deployed)
    step = step_of_shard(context.asset_key.path[-1])
    scope = _declared_scope(context)

    def has_effects(_step: str) -> bool:
        # A run launched from the UI may carry only the partition tag: a batch's runs are either.
        runs = {
            r.run_id
            for tag in (BATCH_TAG, PARTITION_TAG)
            for r in context.instance.get_runs(RunsFilter(tags={tag: batch_id}))
        }
        return effects_recorded(db, batch_id, scope, sorted(runs))

    pin = pins.get(step)
    if pin is not None and pin.seen_version and step in deployed and pin.code == deployed[step]:
        store.clear_seen(batch_id, [step])  # a refused release was replaced by the batch's own code
    for change in code_changes(pins, deployed, [step], has_effects):
        if change.stops:
            store.note_seen(batch_id, [change])
            raise step_failure(CodeChangedError(refusal(batch_id, [change])))
        context.log.warning(
            f"step {step} runs on code {change.deployed.version}; the batch started on "
            f"{change.pinned.version} (the step had recorded no effects, so it runs on the new code)"
        )


def step_failure(exc: DurableError) -> Failure:
    """The plain ``Failure`` the UI shows for one of our errors; never retried by a RetryPolicy.

    A step stopped by a cancel carries :data:`~durable_assets.kit.tags.CANCELED_KEY` in the
    failure's metadata: the status reads that typed marker to show the step as stopped on request
    rather than failed, instead of searching the error's text for the class name.
    """
    canceled = isinstance(exc, BatchCanceledError)
    return Failure(
        description=f"{type(exc).__name__}: {exc}",
        metadata={CANCELED_KEY: True} if canceled else None,
        allow_retries=False,
    )


def _shard(context: AssetExecutionContext) -> ShardOf | None:
    """The shard of a sharded step this is (its reports are counts of one shard), else None."""
    return shard_position(context.asset_key.path[-1])


def _report_shard_done(context: AssetExecutionContext, runtime: BatchRuntime) -> None:
    """A shard whose body returned did all its work: the step's sum says so, whatever it counted last."""
    shard = _shard(context)
    if shard is not None:
        runtime.report(step_progress(context, 0, 0), force=True, shard=replace(shard, finished=True))


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


def report_progress(context: AssetExecutionContext, done: int, of: int) -> None:
    """Progress of a step that sends no effects (a long read, a listing, a check of every row).

    An effect runner reports its own; any other long step calls this as it goes, and users see
    ``step n/N <label> done/of`` in ``job status``, the event stream and the UI like any other step's.
    Reports are throttled as the runner's are; the first (``done == 0``) and the last
    (``done == of``) always land. A shard reports its own count and the step shows their sum.
    """
    runtime = kit_resource(context, "runtime", BatchRuntime)
    runtime.report(step_progress(context, done, of), force=done in (0, of), shard=_shard(context))


def effect_runner(
    context: AssetExecutionContext,
    runtime: BatchRuntime | None = None,
    ledger: IdempotencyLedger | None = None,
    *,
    perform: Callable[[Intent], Mapping[str, Any]],
    scope: str | None = None,
    verify: Callable[[Intent, Mapping[str, Any]], str | None] | None = None,
    lookup: Callable[[LedgerEntry], Mapping[str, Any] | None] | None = None,
    concurrency: int | None = None,
    limiter: RateLimiter | None = None,
    backoff: PacingBackoff | None = None,
    account: ProviderAccount | None = None,
    lookup_first: bool = False,
    provider: PacedProvider | None = None,
) -> EffectRunner:
    """An :class:`EffectRunner` for this step: its run owns the claims, the lease's fence guards every
    send, a cancel stops the next one, and progress counts settled intents.

    ``runtime`` and ``ledger`` default to the step's own (every durable step has them), ``scope``
    to the step's ``durable_asset(effect_scope=...)``; ``concurrency``, ``limiter`` and ``backoff``
    to the ledger resource's pace (``DURABLE_CONCURRENCY``, ``DURABLE_RATE_LIMIT``, ...).
    ``verify(intent, answer)`` returns why an answer does not match what was asked (None when it
    does): a mismatch is recorded and the step fails
    with :class:`ProviderResponseMismatchError` instead of trusting it. ``perform`` raises
    :class:`TransientProviderError` for a fault worth retrying with the same key and
    :class:`ProviderRejectedError` for an answer that will not change.

    ``account`` is the provider account the effects go to: the batch is bound to it on first use
    (another account later is :class:`ProviderAccountMismatchError`) and the keys live in its
    namespace. Without one, the effects share the ledger's default namespace (one foreign system).

    ``provider`` is the usual way to give all of that at once: the effects go to that provider at
    its concurrency, its shared limiter and its down budget, in its account's namespace (each of
    ``concurrency``, ``limiter``, ``backoff`` and ``account`` given too wins over the provider's).
    An effect that goes elsewhere (a mailbox) passes only what of the provider's pace it shares.
    """
    if provider is not None:
        concurrency = provider.concurrency if concurrency is None else concurrency
        limiter = limiter or provider.limiter()
        backoff = backoff or provider.backoff()
        account = account or provider.account
    runtime = runtime or kit_resource(context, "runtime", BatchRuntime)
    ledger = ledger or kit_resource(context, "ledger", IdempotencyLedger)
    scope = _effect_scope(context, scope)
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
    optional["concurrency"] = ledger.concurrency if concurrency is None else concurrency
    return EffectRunner(
        ledger=keys,
        scope=scope,
        owner=context.run_id,
        perform=perform,
        fence=runtime.fence,
        guard=runtime.check_may_continue,
        limiter=limiter or RateLimiter(ledger.rate_limit_per_second),
        backoff=backoff or ledger.backoff(),
        key_retention_s=ledger.key_retention_s,
        lookup_first=lookup_first,
        batch_id=runtime.batch_id if runtime.has_batch else None,
        on_progress=lambda done, of: runtime.report(
            step_progress(context, done, of), force=done == of, shard=_shard(context)
        ),
        **optional,
    )


T = TypeVar("T")


def kit_resource(context: AssetExecutionContext, key: str, kind: type[T]) -> T:
    """The step's kit resource ``key``, or an error saying how to wire it (a plain asset has none)."""
    found = getattr(context.resources, key, None)
    if not isinstance(found, kind):
        raise StepWiringError(
            f"step {context.asset_key.to_user_string()} has no {kind.__name__} resource {key!r}: make it "
            "a durable_asset, or pass it to effect_runner"
        )
    return found


def _declared_scope(context: AssetExecutionContext) -> str:
    """The ledger scope the running step declared (``durable_asset(effect_scope=...)``), or ""."""
    assets_def = context.assets_def
    spec = assets_def.specs_by_key.get(context.asset_key) if assets_def is not None else None
    if spec is None or not spec.metadata:
        return ""
    value = spec.metadata.get(EFFECT_SCOPE_KEY)
    return str(getattr(value, "value", value) or "")


def _effect_scope(context: AssetExecutionContext, scope: str | None) -> str:
    """The scope the step declared; an explicit one must agree with it (the ledger's keys live in it)."""
    declared = _declared_scope(context)
    step = context.asset_key.to_user_string()
    if scope and declared and scope != declared:
        raise StepWiringError(
            f"step {step} declares effect_scope={declared!r} but sends through scope {scope!r}: "
            "drop scope= from effect_runner (it reads the step's)"
        )
    if not (scope or declared):
        raise StepWiringError(f"step {step} sends effects but declares no durable_asset(effect_scope=...)")
    return scope or declared


def frame_result(df: pd.DataFrame, metadata: Mapping[str, Any]) -> MaterializeResult:
    """A step's output frame with its row count, and a data version that is its content hash."""
    return MaterializeResult(
        value=df,
        data_version=DataVersion(frame_digest(df)),
        metadata={ROWS_KEY: len(df), **metadata},
    )


def batch_dir(context: AssetExecutionContext) -> Path:
    """The batch's folder in the instance folder: where local storage keeps its files for people.
    On shared storage they are elsewhere (:func:`batch_storage_of`); use that to write them."""
    return Path(context.instance.root_directory) / "batches" / context.partition_key


def batch_storage_of(context: AssetExecutionContext) -> BatchStorage:
    """The storage the step's batch files go to: the ``runtime`` resource's (``DURABLE_STORAGE``)."""
    runtime = getattr(context.resources, "runtime", None)
    config = runtime.storage if isinstance(runtime, BatchRuntime) else None
    return batch_storage(context.instance, config)


@contextmanager
def batch_input(context: AssetExecutionContext, path: str) -> Iterator[Path]:
    """The first step's input file as a local path, wherever the launcher stored it.

    ``job run --input`` on shared storage stores the file's bytes with the batch and passes their
    URI (``durable://batches/<id>/input/<name>``), so a step on another host, and every resume,
    reads the same bytes; a local path (local storage, the UI's launchpad) is read as it is.
    """
    runtime = getattr(context.resources, "runtime", None)
    config = runtime.storage if isinstance(runtime, BatchRuntime) else None
    with local_copy(context.instance, path, config) as local:
        yield local
