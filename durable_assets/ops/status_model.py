"""The status words of docs/contract.md as enums, and the status JSON as typed models.

Why one module: the words were string literals in seven modules (the status fold, the event
stream, metrics, webhooks, retention, the CLI), where a typo compares unequal in silence. Here they
are members, and every producer and comparison names them. The models are why the JSON and its
description cannot drift apart: ``job status --json``, ``GET /runs/{ID}`` and a webhook's ``data``
are a :class:`BatchStatusModel` dumped, and ``/openapi.json`` is generated from the same classes
(ops/openapi.py), so a field added here is documented by being added.

Class docstrings and ``Field`` descriptions of the models and enums are user documentation: they
are the descriptions ``/openapi.json`` serves. Why a field exists is said in ``#`` comments.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from dagster import DagsterRunStatus
from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema
from pydantic.json_schema import JsonDict, SkipJsonSchema

#: docs/contract.md's batch ID: 1-64 characters from A-Z a-z 0-9 _ . -, starting with a letter or digit.
BATCH_ID_REGEX = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


class BatchStatus(StrEnum):
    """A batch's status: its newest run's; `canceling` from a recorded cancel until the run stops."""

    QUEUED = "queued"
    RUNNING = "running"
    CANCELING = "canceling"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"

    @classmethod
    def of_run(cls, status: DagsterRunStatus) -> BatchStatus:
        """The word for a Dagster run status; a status Dagster adds later reads as ``running``."""
        return _OF_RUN.get(status, cls.RUNNING)

    @property
    def terminal(self) -> bool:
        """The batch has ended: nothing changes it but ``job resume``."""
        return self in TERMINAL


TERMINAL = frozenset({BatchStatus.SUCCEEDED, BatchStatus.FAILED, BatchStatus.CANCELED})
_OF_RUN = {
    DagsterRunStatus.QUEUED: BatchStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED: BatchStatus.QUEUED,
    DagsterRunStatus.MANAGED: BatchStatus.QUEUED,
    DagsterRunStatus.STARTING: BatchStatus.RUNNING,
    DagsterRunStatus.STARTED: BatchStatus.RUNNING,
    DagsterRunStatus.CANCELING: BatchStatus.CANCELING,
    DagsterRunStatus.SUCCESS: BatchStatus.SUCCEEDED,
    DagsterRunStatus.FAILURE: BatchStatus.FAILED,
    DagsterRunStatus.CANCELED: BatchStatus.CANCELED,
}


class StepStatus(StrEnum):
    """A step's state, folded over every run of the batch's lineage."""

    PENDING = "pending"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"
    SKIPPED = "skipped"


class StepEventStatus(StrEnum):
    """What a `step` event reports: a step's new state, or `retrying` when Dagster will run it again."""

    # Not StepStatus plus a member: `retrying` is a moment in the stream, never a state that
    # `job status` shows, and a client switching over StepStatus must not meet it.
    IN_PROGRESS = StepStatus.IN_PROGRESS.value
    COMPLETED = StepStatus.COMPLETED.value
    FAILED = StepStatus.FAILED.value
    RETRYING = "retrying"
    SKIPPED = StepStatus.SKIPPED.value


#: An ISO 8601 UTC timestamp as the status JSON writes it (``...Z``). A string, not a datetime:
#: the bytes stay those the status fold formats, whatever pydantic's datetime serialisation does.
Timestamp = Annotated[str, WithJsonSchema({"type": "string", "format": "date-time"})]


def _no_default(schema: JsonDict) -> None:
    """Leave ``default`` out of a field's schema: a default of null would document a null never sent."""
    schema.pop("default", None)


class _Model(BaseModel):
    # Frozen: a status is a snapshot. Extra keys ignored, and none declared forbidden in the
    # schema, so a client validating against an older document accepts a newer field.
    model_config = ConfigDict(frozen=True)


class ProgressModel(_Model):
    """While the batch runs: the step running now (with its latest count when it has one); a report
    left by an earlier step or run is never shown as the running step's. Once the batch has ended:
    its final state (`Succeeded`, or `Failed: <step>` / `Canceled: <step>` with how far that step
    got)."""

    step: int = Field(ge=1, description="step number, 1..total")
    total: int = Field(ge=1)
    label: str
    done: int = Field(ge=0)
    of: int = Field(
        ge=0, description="0 when the step has no count (nothing countable, or none reported yet)"
    )


class BatchFileModel(_Model):
    """A file a step of the batch wrote for people (quarantine, report), and where it is stored."""

    name: str = Field(description="the file's name; `GET /runs/{ID}/files/{name}` serves it")
    label: str = Field(description="what it is, as the end-of-batch summary names it (quarantine, report)")
    step: str = Field(description="the step (asset) that wrote it")
    uri: str = Field(
        description=(
            "where it is stored: a path under DAGSTER_HOME (local storage), `durable://KEY` (the "
            "instance's database) or `s3://BUCKET/KEY`; readable from any host but the first"
        )
    )


class StepModel(_Model):
    """One step of the batch's job, folded over every run of its lineage."""

    step: int = Field(ge=1)
    step_name: str = Field(description="the Dagster step key (asset name)")
    status: StepStatus = Field(description="`skipped`: stopped by a cancel before its end (resume runs it)")
    executions: int = Field(ge=0, description="starts across the lineage")
    input_hash: str | None
    output_ref: str | None
    started_at: Timestamp | None
    finished_at: Timestamp | None
    # Why, in the one line the CLI prints: a status that says only "failed" leaves the operator to
    # dig through the log for the check, the error, or the dead worker.
    error: str | None = Field(
        description=(
            "why the step failed (its error, or the failed blocking check of its asset with up to five "
            "failing items), or why the batch stopped at it (its worker was lost); null otherwise"
        ),
    )


class AutoResumeModel(_Model):
    """The daemon's automatic resumes of the batch after lost workers."""

    attempts: int = Field(ge=1)
    max_attempts: int = Field(ge=0)
    run_ids: list[str]


class ProviderModel(_Model):
    """The provider account the batch's side effects go to; a batch is bound to one account."""

    kind: str = Field(description="`embedded` (inside the instance: no real money moves) or `stripe`")
    account: str = Field(description="the provider's account id (`acct_...`)")
    livemode: bool = Field(description="true only for a live-mode key: real money")


class DecisionModel(_Model):
    """A person's standing decision for one item of the batch's job at its provider account
    (`job decide`): what the job's steps do instead of holding that item again."""

    item: str = Field(description="the item as the job's report names it (e.g. a legacy account id)")
    decision: str = Field(description="one of the words the job declares (`job jobs` lists them)")
    note: str = Field(description="why, as the person who decided wrote it")
    decided_at: str = Field(description="when, ISO 8601 UTC")
    decided_by: str = Field(description="who, as `user@host`")


class GuardrailsModel(_Model):
    """The ceilings and limits the batch runs under: pinned at its first run, kept by every resume,
    re-execution and retry, changed only by `job resume --override-guardrails`."""

    # Why pinned: a ceiling re-read by each process is lost by resuming from another shell.
    pinned: dict[str, dict[str, Any]] = Field(
        description="per guardrail resource (its class name), its fields and the values in force"
    )
    pinned_at: Timestamp = Field(description="when the batch first pinned them")
    overridden_at: Timestamp | None = Field(
        description="when `job resume --override-guardrails` last replaced them; null if never"
    )
    overridden_from: dict[str, dict[str, Any]] | None = Field(
        description="the values that override replaced, per guardrail resource; null if never"
    )
    variables: dict[str, dict[str, str]] = Field(
        default_factory=dict,
        description="per guardrail resource, the environment variable that sets each field it has one "
        "for (DURABLE_MAX_REFUNDS_PER_BATCH for max_refunds_per_batch); empty for a batch run by a "
        "release that did not record them",
    )


class CodeModel(_Model):
    """The code the batch runs on: each step's version pinned at its first run, what is deployed,
    and the steps that differ. A resume across a change in a step with recorded effects is refused
    (exit 2) until the code is back or a person accepts it with `job resume --accept-code-change`."""

    pinned: dict[str, str] = Field(
        description="per step, its declared Dagster `code_version`, else a fingerprint (`fp-...`) of its "
        "definition and its package's source, as the batch first ran"
    )
    deployed: dict[str, str] = Field(
        description="per step, the version deployed as last seen: by a resume that was refused, else by "
        "the batch's newest run"
    )
    changed: list[str] = Field(description="the steps whose deployed version differs from the pinned one")
    accepted: Timestamp | None = Field(
        description="when `job resume --accept-code-change` last accepted a change; null if never"
    )


class BatchStatusModel(_Model):
    """The JSON of `job status --json` (docs/contract.md). `GET /runs` omits `steps`."""

    id: str = Field(pattern=BATCH_ID_REGEX)
    job: str = Field(description="the durable job the batch runs (`job jobs` lists them)")
    status: BatchStatus
    run_ids: list[str] = Field(min_length=1, description="the lineage's Dagster run ids, oldest first")
    percent_complete: float = Field(
        ge=0, le=100, description="completed steps plus the running step's fraction, over all steps"
    )
    progress: ProgressModel | None = Field(description="null when no step has reported progress")
    needs_review: bool = Field(
        description=(
            "items of the batch wait for a person (held_for_review > 0), whatever its status; "
            "`job run`/`job resume` of such a finished batch exit 4"
        )
    )
    held_for_review: int = Field(
        ge=0,
        description=(
            "items held for review: the `held_for_review` materialization metadata of the "
            "last step, in step order, that reports it (refunds: answers that did not match)"
        ),
    )
    auto_resume: AutoResumeModel | None = Field(
        description="the daemon's automatic resumes after lost workers; null if none"
    )
    created_at: str | None = Field(description="when the batch's first run was created, ISO 8601 UTC")
    updated_at: str | None = Field(
        description="when its newest run last changed (started, ended), ISO 8601 UTC"
    )
    provider: ProviderModel | None = Field(
        description="the provider account the batch is bound to; null until its first run binds it",
    )
    guardrails: GuardrailsModel | None = Field(
        description="the batch's pinned ceilings and limits, and their last override; null if it has none",
    )
    code: CodeModel | None = Field(
        description="the code versions the batch runs on; null for a batch from before they were pinned",
    )
    files: list[BatchFileModel] = Field(description="the files its steps wrote for people, in summary order")
    # Read with the steps (one more query): absent from `GET /runs`, as `steps` is.
    decisions: list[DecisionModel] | SkipJsonSchema[None] = Field(
        default=None,
        json_schema_extra=_no_default,
        description="the decisions in force for the batch's job at its provider account, by item",
    )
    # Absent (not null) when not asked for: the schema says array, and `GET /runs` leaves it out.
    steps: list[StepModel] | SkipJsonSchema[None] = Field(default=None, json_schema_extra=_no_default)

    def as_json(self) -> dict[str, Any]:
        """The contract's JSON object: statuses as their words, ``steps`` left out when not read."""
        unread = {name for name in ("steps", "decisions") if getattr(self, name) is None}
        return self.model_dump(mode="json", exclude=unread or None)


class _StreamEvent(_Model):
    run_id: str = Field(description="the run of the lineage whose event log holds the event")
    timestamp: Timestamp


class ProgressEventModel(_StreamEvent, ProgressModel):  # this order puts the progress fields first
    """The `data:` of a `progress` event: a step's progress report."""


class StepEventModel(_StreamEvent):
    """The `data:` of a `step` event: a step started, ended or will be retried."""

    step: int = Field(ge=1)
    step_name: str
    status: StepEventStatus


class StatusEventModel(_StreamEvent):
    """The `data:` of a `status` event: the batch's status changed (the last one ends the stream)."""

    id: str
    status: BatchStatus
    error: str | None = Field(
        default=None,
        description="only on the event that ends the stream of a batch whose worker was lost: why, "
        "and the `job resume` that continues it",
    )


#: Every model of the status JSON and of the event stream, for the API's schema (ops/openapi.py).
STATUS_MODELS: tuple[type[BaseModel], ...] = (
    BatchStatusModel,
    ProgressEventModel,
    StepEventModel,
    StatusEventModel,
)
