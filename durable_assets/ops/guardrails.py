"""A batch's pinned guardrails at the CLI: pinned by `job run`, kept (and said so) or overridden by
`job resume`, shown by `job status`.

The values "this shell asks for" are the code location's guardrail resources (``Guardrails``
subclasses in the resources given to ``DurableJobs.definitions``) as a run started now would
configure them; the kit's resources pin and load the batch's values inside every run, so what this
module adds is only the operator's side: the one line when they differ, and the deliberate override.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from durable_assets.kit import DurableJob, Guardrails
from durable_assets.kit.runtime import (
    DurableDatabase,
    GuardrailPin,
    PinnedGuardrails,
    guardrail_variables,
    guardrails_used,
)
from durable_assets.ops.registry import durable_jobs
from durable_assets.ops.status_model import GuardrailsModel

OVERRIDE_OPTION = "--override-guardrails"


def job_guardrails(job: DurableJob) -> dict[str, Guardrails]:
    """The guardrail resources the job's steps and checks use, by guardrail name."""
    return guardrails_used((*job.assets, *job.checks), durable_jobs().resources)


def pin_at_run(db: DurableDatabase, batch_id: str, job: DurableJob) -> None:
    """`job run`: the values in force now become the batch's, before its first step (a run whose
    first steps do not use a guardrail still pins it when the batch starts, not when it is reached)."""
    store = PinnedGuardrails(db)
    for name, guardrail in job_guardrails(job).items():
        store.pin(batch_id, name, guardrail.configured_values())


def reconcile_on_resume(db: DurableDatabase, batch_id: str, job: DurableJob, *, override: bool) -> str | None:
    """Before a resume runs anything: keep the batch's pinned values (the line to print when this
    shell asks for others), or with ``override`` re-pin this shell's and record it."""
    store = PinnedGuardrails(db)
    pinned = {p.name: p for p in store.get(batch_id)}
    kept: list[str] = []
    changed: list[str] = []
    for name, guardrail in job_guardrails(job).items():
        current = guardrail.configured_values()
        pin = pinned.get(name)
        if pin is None:
            store.pin(batch_id, name, current)  # a batch from before pinning: pinned from now on
            continue
        differing = [k for k in current if k in pin.values and pin.values[k] != current[k]]
        if not differing:
            continue
        if override:
            store.override(batch_id, name, {**pin.values, **current})
            changed += [f"{guardrail.variable(k) or k} {pin.values[k]} → {current[k]}" for k in differing]
        else:
            kept += [_kept(guardrail, k, pin.values[k], current[k]) for k in differing]
    if changed:
        return f"guardrails overridden with this shell's: {', '.join(changed)}"
    if kept:
        return (
            f"guardrails pinned at job run are kept: {', '.join(kept)}; "
            f"pass {OVERRIDE_OPTION} to use this shell's"
        )
    return None


def _kept(guardrail: Guardrails, field: str, pinned: Any, current: Any) -> str:
    variable = guardrail.variable(field)
    shell = f"unset → {current}" if variable and not guardrail.variable_is_set(field) else f"{current}"
    return f"{variable or field}={pinned} (this shell: {shell})"


def _iso(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def guardrails_model(
    db: DurableDatabase, batch_id: str, variables: Mapping[str, Mapping[str, str]]
) -> GuardrailsModel | None:
    """The status JSON's ``guardrails``: what the batch runs under, its last override, and the
    variable that sets each field (``variables``, from the job's snapshot)."""
    pins: list[GuardrailPin] = PinnedGuardrails(db).get(batch_id)
    if not pins:
        return None
    overridden = [p for p in pins if p.overridden_at is not None]
    last = max(overridden, key=lambda p: p.overridden_at or 0.0) if overridden else None
    return GuardrailsModel(
        pinned={p.name: p.values for p in pins},
        pinned_at=_iso(min(p.pinned_at for p in pins)) or "",
        overridden_at=_iso(last.overridden_at) if last else None,
        overridden_from={p.name: p.overridden_from or {} for p in overridden} if overridden else None,
        variables={p.name: dict(variables[p.name]) for p in pins if p.name in variables},
    )


def describe_pinned(model: GuardrailsModel) -> list[str]:
    """`job status`'s lines for the guardrails: the values (named by their variables), and the
    override if there was one."""
    variables = dict(model.variables)
    if any(name not in variables for name in model.pinned):  # a batch run before its job kept them
        here = guardrail_variables({n: g for j in durable_jobs() for n, g in job_guardrails(j).items()})
        variables = {**here, **variables}
    lines = []
    for name, values in model.pinned.items():
        named = variables.get(name, {})
        text = ", ".join(f"{named.get(k, k)}={v}" for k, v in values.items())
        lines.append(f"  guardrails ({name}, pinned at {model.pinned_at}): {text}")
    if model.overridden_at:
        old = "; ".join(
            f"{name}: "
            + ", ".join(
                f"{k} {v} → {model.pinned.get(name, {}).get(k)}"
                for k, v in prev.items()
                if model.pinned.get(name, {}).get(k) != v
            )
            for name, prev in (model.overridden_from or {}).items()
        )
        lines.append(f"  guardrails overridden at {model.overridden_at} ({OVERRIDE_OPTION}): {old}")
    return lines
