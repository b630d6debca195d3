"""The lines a job's end-of-batch summary is built from, over the metadata keys the kit writes.

Why in the kit: a summary line names a step and a metadata key, and the keys for rows, items held
for review, the quarantine and the report are the kit's (``kit/tags.py``, ``kit/batch_files.py``).
Built here, a job names only its steps, and a renamed key cannot leave a summary reading nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from durable_assets.kit.batch_files import quarantine_file, quarantine_line, report_file
from durable_assets.kit.job import SummaryLine, SummarySpec
from durable_assets.kit.tags import HELD_FOR_REVIEW_KEY, ROWS_KEY


def rows_line(label: str, step: str) -> SummaryLine:
    """The row count of the frame ``step`` returned with ``frame_result``."""
    return SummaryLine(label, ((step, ROWS_KEY),))


def held_for_review_line(*steps: str) -> SummaryLine:
    """ "held for review N": the figure of the last of ``steps`` that reported ``HELD_FOR_REVIEW_KEY``."""
    return SummaryLine("held for review", tuple((step, HELD_FOR_REVIEW_KEY) for step in steps))


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
