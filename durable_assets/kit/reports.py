"""What a batch reports to people: files next to the batch, its summary lines, checks of its outcome.

Part of the author face (``from durable_assets.kit import reports``). Three things a job writes
for the people who run it, over one set of metadata keys, so the writers and the readers cannot
drift apart:

- **Files for people**: the step that splits rows into valid and quarantined writes the
  quarantined rows (:func:`write_quarantine`), the last step writes the report
  (:func:`write_report`). They go to the batch storage (``kit/storage.py``) under
  ``batches/<batch>/``: files in the instance folder on local storage, rows or objects every host
  reaches otherwise. The metadata names each by its URI (a path, ``durable://...`` or
  ``s3://...``), which ``job status`` shows and the HTTP API serves
  (``GET /runs/{ID}/files/{name}``).
- **Summary lines**: the end-of-batch summary is built from lines that name a step and a metadata
  key (:func:`rows_line`, :func:`held_for_review_line`, :func:`quarantine_line`,
  :func:`batch_summary_spec`). Built here, a job names only its steps, and a renamed key cannot
  leave a summary reading nothing. A step reports the items it left for a person as
  :data:`HELD_FOR_REVIEW_KEY`; ``job status`` shows the batch as needing review.
- **Checks of the outcome**: a check of a durable step must be partitioned like the step, or it
  would read every batch's frame instead of this one's, and it reports what it found as counts
  plus a few examples (:func:`batch_check`, :func:`check_result`, :func:`check_examples`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

import pandas as pd
from dagster import (
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetExecutionContext,
    AssetIn,
    AssetsDefinition,
    MetadataValue,
    PartitionsDefinition,
    PreviewWarning,
    asset_check,
)

from durable_assets.kit.frames import csv_bytes
from durable_assets.kit.job import SummaryLine, SummarySpec
from durable_assets.kit.steps import batch_storage_of
from durable_assets.kit.storage import BatchKeys
from durable_assets.kit.tables import reason_counts
from durable_assets.kit.tags import HELD_FOR_REVIEW_KEY, ROWS_KEY

__all__ = [
    "HELD_FOR_REVIEW_KEY",
    "SummaryLine",
    "batch_check",
    "batch_summary_spec",
    "check_examples",
    "check_result",
    "held_for_review_line",
    "quarantine_file",
    "quarantine_line",
    "report_file",
    "rows_line",
    "write_quarantine",
    "write_report",
]

#: The step's metadata: how many rows were quarantined, where the file is, and per reason how many.
QUARANTINED: Final = "quarantined"
QUARANTINE_FILE: Final = "quarantine_file"
QUARANTINE_REASONS: Final = "quarantine_reasons"
#: The report step's metadata: where the report is.
REPORT_FILE: Final = "report_file"
#: Examples listed in a check's metadata: enough to start an investigation, never the whole batch.
EXAMPLES: Final = 10


# Files for people ------------------------------------------------------------------------------


def write_quarantine(context: AssetExecutionContext, quarantined: pd.DataFrame) -> dict[str, Any]:
    """Write ``quarantined`` to the batch's ``quarantine.csv`` (atomically, formulas neutralised)
    and return the step's metadata about it: count, file and reason counts (sorted by code)."""
    uri = _store_batch_file(context, "quarantine.csv", csv_bytes(quarantined))
    return {
        QUARANTINED: len(quarantined),
        QUARANTINE_FILE: MetadataValue.path(uri),
        QUARANTINE_REASONS: MetadataValue.json(reason_counts(quarantined)),
    }


def write_report(context: AssetExecutionContext, report: pd.DataFrame, name: str) -> dict[str, Any]:
    """Write ``report`` as the batch's CSV file ``name`` (atomically, spreadsheet formulas
    neutralised: its fields come from outside) and return the step's metadata naming it."""
    return {REPORT_FILE: MetadataValue.path(_store_batch_file(context, name, csv_bytes(report)))}


def _store_batch_file(context: AssetExecutionContext, name: str, data: bytes) -> str:
    return batch_storage_of(context).put(BatchKeys(context.partition_key).file(name), data)


# Summary lines ---------------------------------------------------------------------------------


def rows_line(label: str, step: str) -> SummaryLine:
    """The row count of the frame ``step`` returned with ``frame_result``."""
    return SummaryLine(label, ((step, ROWS_KEY),))


def held_for_review_line(*steps: str) -> SummaryLine:
    """ "held for review N": the figure of the last of ``steps`` that reported ``HELD_FOR_REVIEW_KEY``."""
    return SummaryLine("held for review", tuple((step, HELD_FOR_REVIEW_KEY) for step in steps))


def quarantine_line(step: str) -> SummaryLine:
    """The summary line "quarantined N (reason n, ...)" of the step that called :func:`write_quarantine`."""
    return SummaryLine(QUARANTINED, ((step, QUARANTINED),), detail=(step, QUARANTINE_REASONS))


def quarantine_file(step: str) -> tuple[str, str, str]:
    """The summary's pointer to that step's quarantine file (a ``SummarySpec.files`` entry)."""
    return ("quarantine", step, QUARANTINE_FILE)


def report_file(step: str) -> tuple[str, str, str]:
    """The summary's pointer to the report that step wrote with :func:`write_report`."""
    return ("report", step, REPORT_FILE)


def batch_summary_spec(
    *, read: tuple[str, str], validated: str, report: str, lines: Sequence[SummaryLine], review_hint: str
) -> SummarySpec:
    """The summary of a job that reads a batch, quarantines its bad rows and writes a report.

    Such a summary always opens with the rows read (``read``: its label and the step) and the
    quarantine line of the ``validated`` step, and points at the ``report`` and the quarantine file;
    the job names those steps and adds the ``lines`` that are its own, and where a person finds the
    held items.
    """
    label, step = read
    return SummarySpec(
        lines=(rows_line(label, step), quarantine_line(validated), *lines),
        files=(report_file(report), quarantine_file(validated)),
        review_hint=review_hint,
    )


# Checks of the outcome -------------------------------------------------------------------------


def batch_check(
    *,
    asset: AssetsDefinition,
    partitions_def: PartitionsDefinition,
    blocking: bool = False,
    reads: Sequence[str] = (),
) -> Callable[[Callable[..., AssetCheckResult]], AssetChecksDefinition]:
    """Dagster's ``asset_check`` on ``asset``, partitioned like it, so it checks one batch's frame.

    ``reads`` names other steps whose frames (of the same batch) the check takes as arguments of
    the same names. ``blocking`` stops the batch's run when the check fails, before any later step.
    Dagster marks a partitioned check as preview; its warning would print on every ``job`` command,
    so it is silenced here, once, where such checks are made.
    """
    warnings.filterwarnings(
        "ignore", message="Specifying a partitions_def on an AssetCheckSpec", category=PreviewWarning
    )
    return asset_check(
        asset=asset,
        partitions_def=partitions_def,
        blocking=blocking,
        additional_ins={name: AssetIn(name) for name in reads} or None,
    )


def check_examples(values: Iterable[Any]) -> MetadataValue:
    """The first :data:`EXAMPLES` of ``values`` as text, for a check's metadata (JSON)."""
    return MetadataValue.json([str(v) for v in list(values)[:EXAMPLES]])


def check_result(problems: Sequence[str], metadata: dict[str, Any]) -> AssetCheckResult:
    """A check that fails (ERROR) for any problem: their count, the first as ``examples``, then
    ``metadata``. For checks whose every finding is a problem of the same weight."""
    if problems:
        metadata["examples"] = check_examples(problems)
    return AssetCheckResult(
        passed=not problems,
        severity=AssetCheckSeverity.ERROR,
        metadata={"problems": len(problems), **metadata},
    )
