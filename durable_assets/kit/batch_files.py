"""The files a batch writes for people, next to the batch: its quarantine and its report.

They go to the batch storage (kit/storage.py) under ``batches/<batch>/``: files in the instance
folder on local storage, rows or objects every host reaches otherwise. The metadata names each by
its URI (a path, ``durable://...`` or ``s3://...``), which ``job status`` shows and the HTTP API
serves (``GET /runs/{ID}/files/{name}``).

Why one module: the step that splits rows into valid and quarantined writes the quarantined rows
and reports how many and why under three metadata keys, the last step writes the report and names
its path; the end-of-batch summary reads the same keys. Declared here once, the writers and the
reader cannot drift apart, and a new pipeline gets the files, their metadata and their summary
lines by naming its steps.
"""

from __future__ import annotations

from typing import Any, Final

import pandas as pd
from dagster import AssetExecutionContext, MetadataValue

from durable_assets.kit.frames import csv_bytes
from durable_assets.kit.job import SummaryLine
from durable_assets.kit.steps import batch_storage_of
from durable_assets.kit.storage import BatchKeys
from durable_assets.kit.tables import reason_counts

#: The step's metadata: how many rows were quarantined, where the file is, and per reason how many.
QUARANTINED: Final = "quarantined"
QUARANTINE_FILE: Final = "quarantine_file"
QUARANTINE_REASONS: Final = "quarantine_reasons"
#: The report step's metadata: where the report is.
REPORT_FILE: Final = "report_file"


def write_quarantine(context: AssetExecutionContext, quarantined: pd.DataFrame) -> dict[str, Any]:
    """Write ``quarantined`` to the batch's ``quarantine.csv`` (atomically, formulas neutralised)
    and return the step's metadata about it: count, file and reason counts (sorted by code)."""
    uri = store_batch_file(context, "quarantine.csv", csv_bytes(quarantined))
    return {
        QUARANTINED: len(quarantined),
        QUARANTINE_FILE: MetadataValue.path(uri),
        QUARANTINE_REASONS: MetadataValue.json(reason_counts(quarantined)),
    }


def quarantine_line(step: str) -> SummaryLine:
    """The summary line "quarantined N (reason n, ...)" of the step that called :func:`write_quarantine`."""
    return SummaryLine(QUARANTINED, ((step, QUARANTINED),), detail=(step, QUARANTINE_REASONS))


def quarantine_file(step: str) -> tuple[str, str, str]:
    """The summary's pointer to that step's quarantine file (a ``SummarySpec.files`` entry)."""
    return ("quarantine", step, QUARANTINE_FILE)


def write_report(context: AssetExecutionContext, report: pd.DataFrame, name: str) -> dict[str, Any]:
    """Write ``report`` as the batch's CSV file ``name`` (atomically, spreadsheet formulas
    neutralised: its fields come from outside) and return the step's metadata naming it."""
    return {REPORT_FILE: MetadataValue.path(store_batch_file(context, name, csv_bytes(report)))}


def report_file(step: str) -> tuple[str, str, str]:
    """The summary's pointer to the report that step wrote with :func:`write_report`."""
    return ("report", step, REPORT_FILE)


def store_batch_file(context: AssetExecutionContext, name: str, data: bytes) -> str:
    """Store ``data`` as the batch's file ``name`` (atomically) and return its URI."""
    return batch_storage_of(context).put(BatchKeys(context.partition_key).file(name), data)
