"""``job decide`` and ``job decisions``: a person's word on a held item, for any job that declares some.

The words a job honours are its own (``DurableJob(decisions=...)``); this layer checks a word
against them, files it under the provider account the location's jobs talk to now (where the item's
keys live), and lists what is in force. The job's steps read it (``kit.decisions_for``).
"""

from __future__ import annotations

from dataclasses import dataclass

from dagster import DagsterInstance

from durable_assets.errors import UsageError
from durable_assets.kit import DurableJob, ItemDecision
from durable_assets.kit.runtime import (
    DEFAULT_NAMESPACE,
    DurableDatabase,
    ItemDecisions,
    all_decisions,
    who_decides,
)
from durable_assets.ops.registry import durable_jobs
from durable_assets.ops.runner import configured_account

#: ``durable_item_decisions.item``'s width; a note longer than a paragraph belongs in a ticket.
MAX_ITEM, MAX_NOTE = 255, 2000


class UnknownDecisionError(UsageError):
    """A word the job does not honour (or a job that honours none)."""


@dataclass(frozen=True)
class DecisionRequest:
    job: str | None
    item: str
    decision: str | None
    note: str | None
    withdraw: bool


def _job_with_decisions(name: str | None) -> DurableJob:
    jobs = durable_jobs()
    job = jobs.get(name)
    if not job.decisions:
        deciding = [f"--job {j.name}" for j in jobs if j.decisions]
        hint = f"use {' or '.join(deciding)}" if deciding else "no registered job declares any"
        raise UnknownDecisionError(
            f"job {job.name} declares no decisions a person can record for an item "
            f"(DurableJob(decisions=...)): {hint}"
        )
    return job


def check_request(request: DecisionRequest) -> DurableJob:
    """Everything wrong with a ``job decide`` is exit 2 before the database is touched."""
    job = _job_with_decisions(request.job)
    item = request.item.strip()
    if not item or len(item) > MAX_ITEM or item != request.item:
        raise UsageError(f"--item must be 1-{MAX_ITEM} characters with no space at either end")
    if request.withdraw:
        if request.decision is not None or request.note is not None:
            raise UsageError("--withdraw takes no decision and no --note: it withdraws the one in force")
        return job
    if request.decision is None:
        raise UsageError(f"name a decision ({_words(job)}) or --withdraw")
    if request.decision not in job.decisions:
        raise UnknownDecisionError(
            f"job {job.name} has no decision {request.decision!r}; it honours {_words(job)}"
        )
    if not (request.note or "").strip() or len(request.note or "") > MAX_NOTE:
        raise UsageError(
            f"--note is required (1-{MAX_NOTE} characters): why, for whoever reads the report next"
        )
    return job


def _words(job: DurableJob) -> str:
    return ", ".join(job.decisions)


def _namespace(instance: DagsterInstance) -> str:
    account = configured_account(instance)
    return DEFAULT_NAMESPACE if account is None else account.namespace


def decide(instance: DagsterInstance, request: DecisionRequest) -> str:
    """Record or withdraw the decision; the line that tells the person what now holds."""
    job = check_request(request)
    decisions = ItemDecisions(DurableDatabase.for_instance(instance), _namespace(instance))
    where = f"{job.name} item {request.item} at {decisions.account}"
    if request.withdraw:
        gone = decisions.withdraw(job.name, request.item)
        if gone is None:
            return f"{where}: no decision in force; nothing withdrawn"
        return f"{where}: withdrew {gone.decision} (recorded {gone.decided_on}); the next batch decides alone"
    assert request.decision is not None and request.note is not None  # check_request said so
    made = decisions.record(job.name, request.item, request.decision, request.note.strip(), who_decides())
    return f"{where}: {made.decision} — {job.decisions[made.decision]} (from the next batch or resume on)"


def decisions_in_force(instance: DagsterInstance, job: str | None) -> list[ItemDecision]:
    if job is not None:
        durable_jobs().get(job)  # an unknown --job: exit 2
    return all_decisions(DurableDatabase.for_instance(instance), job)
