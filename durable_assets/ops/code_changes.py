"""A batch's pinned code at the operator's side: refused or accepted by `job resume`, left alone by
the daemon's automatic resume, shown by `job status`.

The kit pins each step's code version at a batch's first run and stops a changed step at its start
(kit/code_versions.py), whoever launched the run. This module adds what only an operator's tool can:
the refusal *before* a resume launches anything (one line, exit 2, the two ways forward), the
deliberate acceptance (``--accept-code-change``), the same decision for the daemon, and the
status's ``code`` field.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime

from dagster import DagsterRun

from durable_assets.errors import CodeChangedError
from durable_assets.kit import DurableJob
from durable_assets.kit.runtime import (
    CodeChange,
    CodePins,
    DurableDatabase,
    StepCode,
    code_changes,
    effects_recorded,
    refusal,
)
from durable_assets.ops.status_model import CodeModel

ACCEPT_OPTION = "--accept-code-change"


def changes_for_resume(
    db: DurableDatabase, batch_id: str, job: DurableJob, runs: Sequence[DagsterRun], to_run: Iterable[str]
) -> list[CodeChange]:
    """The steps about to run whose deployed code differs from the batch's pin."""
    pins = CodePins(db).get(batch_id)
    if not pins:
        return []  # a batch from a release that did not pin: its first run under this one pins
    scopes = {st.key: st.effect_scope for st in job.steps}
    run_ids = [r.run_id for r in runs]
    return code_changes(
        pins,
        job.code_versions,
        to_run,
        lambda step: effects_recorded(db, batch_id, scopes.get(step), run_ids),
    )


def changes_only_a_person_may_cross(
    db: DurableDatabase, batch_id: str, job: DurableJob, runs: Sequence[DagsterRun], to_run: Iterable[str]
) -> list[CodeChange]:
    """The changes that stop a resume, recorded as seen: from then on the batch's status (and so a
    webhook's body, and ``durable_batches_code_changed``) says the code changed since it started."""
    stopping = [c for c in changes_for_resume(db, batch_id, job, runs, to_run) if c.stops]
    if stopping:
        CodePins(db).note_seen(batch_id, stopping)
    return stopping


def reconcile_code_on_resume(
    db: DurableDatabase,
    batch_id: str,
    job: DurableJob,
    runs: Sequence[DagsterRun],
    to_run: Iterable[str],
    *,
    accept: bool,
) -> str | None:
    """Before a resume launches anything: refuse a change only a person may cross (recorded for the
    status), or with ``accept`` pin the deployed code and say so; the line to print, if any."""
    to_run = list(to_run)
    changes = changes_for_resume(db, batch_id, job, runs, to_run)
    stopping = [c for c in changes if c.stops]
    pins = CodePins(db)
    pins.clear_seen(batch_id, set(to_run) - {c.step for c in changes})  # the batch's own code is back
    if stopping and not accept:
        pins.note_seen(batch_id, stopping)
        raise CodeChangedError(refusal(batch_id, stopping))
    if accept:
        # The batch now runs on the deployed release: every step's pin follows it, the completed
        # ones too (they will not run again, but the status compares them with what is deployed).
        changes = changes_for_resume(db, batch_id, job, runs, [st.key for st in job.steps])
    if accept and changes:
        pins.accept(batch_id, changes)
        return (
            f"code change accepted ({ACCEPT_OPTION}): {', '.join(c.describe() for c in changes)}; "
            "each mutating step still compares every item's key with the batch's record before sending"
        )
    if changes:
        return "resume: " + "; ".join(
            f"step {c.step} runs on new code {c.deployed.version} (started on {c.pinned.version}; "
            "it recorded no effects)"
            for c in changes
        )
    return None


def code_model(db: DurableDatabase, batch_id: str, newest: Mapping[str, StepCode]) -> CodeModel | None:
    """The status JSON's ``code``: the pins, what is deployed as last seen (a refused resume's view,
    else the newest run's code), the steps that differ, and the last acceptance."""
    pins = CodePins(db).get(batch_id)
    if not pins:
        return None
    order = list(newest)
    pins = dict(sorted(pins.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)))
    deployed = {
        step: pin.seen_version or (newest[step].version if step in newest else pin.code.version)
        for step, pin in pins.items()
    }
    accepted = [p.accepted_at for p in pins.values() if p.accepted_at is not None]
    return CodeModel(
        pinned={step: pin.code.version for step, pin in pins.items()},
        deployed=deployed,
        changed=sorted(step for step, pin in pins.items() if deployed[step] != pin.code.version),
        accepted=_iso(max(accepted)) if accepted else None,
    )


def describe_code(model: CodeModel) -> list[str]:
    """`job status`'s lines for the code: one when nothing changed, the changed steps otherwise."""
    if not model.changed:
        accepted = f"; a change accepted at {model.accepted} ({ACCEPT_OPTION})" if model.accepted else ""
        return [f"  code: as the batch started ({len(model.pinned)} steps pinned){accepted}"]
    return [
        f"  code changed since the batch started: {step} {model.pinned[step]} → {model.deployed[step]}"
        for step in model.changed
    ]


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")
