"""What a batch's status needs to know about its job, read from the batch's own runs.

``job status`` and ``job list`` fold a lineage's events over the job's steps: their order, their
labels, and which asset step each asset check reports on. Importing the code location to learn
that (its pipelines, pandas, the provider SDK, building ``Definitions``) cost a reading command
more than its whole import floor. Every run already stores it: Dagster keeps the job's snapshot
(whose metadata carries the durable job's ``[key, label]`` steps, ``STEPS_KEY``, its files for
people, ``FILES_KEY``, and its guardrails' variables, ``GUARDRAIL_VARIABLES_KEY``) and the
execution plan's (whose check outputs name the asset they check). So a status is read from those,
and the location is loaded only for runs recorded without them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dagster import DagsterInstance, DagsterRun

from durable_assets.kit.runtime import (
    CODE_VERSIONS_KEY,
    FILES_KEY,
    GUARDRAIL_VARIABLES_KEY,
    STEPS_KEY,
    StepCode,
    versions_from_metadata,
)


@dataclass(frozen=True)
class JobShape:
    """A durable job as a status reads it: name, step keys in order, labels, check steps."""

    name: str
    step_keys: tuple[str, ...]
    labels: Mapping[str, str]
    #: Each asset check's step key -> the step of the asset it checks.
    check_steps: Mapping[str, str]
    #: The files for people: ``(label, step, metadata key)`` of a path the step wrote.
    files: tuple[tuple[str, str, str], ...]
    #: ``{guardrail name: {field: environment variable}}``; empty if the runs did not record them.
    guardrail_variables: Mapping[str, Mapping[str, str]]

    def label(self, step_key: str) -> str:
        return self.labels.get(step_key, step_key)


def job_shape(instance: DagsterInstance, runs: Sequence[DagsterRun]) -> JobShape:
    """The shape of the job the lineage ``runs`` (oldest first) belongs to: from its runs' stored
    snapshots, else (a run recorded without them) from the code location, as before."""
    stored = _from_snapshots(instance, runs) if runs else None
    return stored if stored is not None else _from_location(runs)


@dataclass(frozen=True)
class _Stored:
    """What one job snapshot's metadata says; ``files`` is None when recorded before it was kept."""

    steps: tuple[tuple[str, str], ...]
    files: tuple[tuple[str, str, str], ...] | None
    guardrail_variables: Mapping[str, Mapping[str, str]]
    code_versions: Mapping[str, StepCode]


#: Snapshot IDs are hashes of their content, so what one says never changes: read each once.
_STORED: dict[str, _Stored] = {}
_CHECKS: dict[str, dict[str, str]] = {}


def _stored(instance: DagsterInstance, run: DagsterRun) -> _Stored:
    snapshot_id = run.job_snapshot_id
    if snapshot_id is None:
        return _Stored((), None, {}, {})
    if snapshot_id not in _STORED:
        metadata = instance.get_job_snapshot(snapshot_id).metadata or {}

        def value(key: str) -> Any:  # a snapshot holds metadata values wrapped, or raw
            found = metadata.get(key)
            return getattr(found, "value", found)

        steps, files, variables = value(STEPS_KEY), value(FILES_KEY), value(GUARDRAIL_VARIABLES_KEY)
        _STORED[snapshot_id] = _Stored(
            tuple((str(key), str(label)) for key, label in steps or []),
            None if files is None else tuple((str(lb), str(st), str(key)) for lb, st, key in files),
            {str(n): {str(f): str(v) for f, v in fields.items()} for n, fields in (variables or {}).items()},
            versions_from_metadata(value(CODE_VERSIONS_KEY)),
        )
    return _STORED[snapshot_id]


def stored_steps(instance: DagsterInstance, run: DagsterRun) -> tuple[tuple[str, str], ...]:
    """The ``(key, label)`` steps ``run``'s job snapshot carries; empty for a run recorded without."""
    return _stored(instance, run).steps


def stored_code_versions(instance: DagsterInstance, run: DagsterRun) -> Mapping[str, StepCode]:
    """The steps' code versions ``run`` was created with (its job snapshot); empty if not recorded."""
    return _stored(instance, run).code_versions


def _plan_checks(instance: DagsterInstance, plan_id: str) -> dict[str, str]:
    if plan_id not in _CHECKS:
        found: dict[str, str] = {}
        for step in instance.get_execution_plan_snapshot(plan_id).steps:
            for output in step.outputs:
                check = output.properties.asset_check_key if output.properties else None
                if check is not None:
                    found[step.key] = check.asset_key.path[-1]
        _CHECKS[plan_id] = found
    return _CHECKS[plan_id]


def _from_snapshots(instance: DagsterInstance, runs: Sequence[DagsterRun]) -> JobShape | None:
    first = runs[0]
    stored = _stored(instance, first)
    if not stored.steps or stored.files is None or any(r.execution_plan_snapshot_id is None for r in runs):
        return None  # recorded before the job carried its steps and files
    check_steps: dict[str, str] = {}
    # A resume's plan may hold fewer steps than the first run's: every check step that produced
    # an event is in the plan of the run that produced it.
    for plan_id in dict.fromkeys(r.execution_plan_snapshot_id for r in runs):
        check_steps.update(_plan_checks(instance, plan_id))  # type: ignore[arg-type]
    return JobShape(
        name=first.job_name,
        step_keys=tuple(key for key, _label in stored.steps),
        labels=dict(stored.steps),
        check_steps=check_steps,
        files=stored.files,
        guardrail_variables=stored.guardrail_variables,
    )


def _from_location(runs: Sequence[DagsterRun]) -> JobShape:
    from durable_assets.kit.runtime import guardrail_variables
    from durable_assets.ops.guardrails import job_guardrails
    from durable_assets.ops.registry import job_of_runs

    job = job_of_runs(runs)
    return JobShape(
        name=job.name,
        step_keys=job.step_keys,
        labels={st.key: st.label for st in job.steps},
        check_steps={
            checks.node_def.name: key.asset_key.path[-1] for checks in job.checks for key in checks.check_keys
        },
        files=job.summary.files if job.summary else (),
        guardrail_variables=guardrail_variables(job_guardrails(job)),
    )
