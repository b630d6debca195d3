"""A failed blocking check names itself, its severity and its failing items (issue #23, item 4).

Before: `job run` printed `... 1 blocking asset check failed with ERROR severity:; full log` (Dagster's
message cut at its newline, before the check's name) and `job status` blamed the step after the
checked one. The job here is the user's own, written with the kit's public API and served through
``DURABLE_CODE_LOCATION``, so the test depends on no pipeline's data: its one check fails on purpose,
on seven items, and the step after it never runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.crash.helpers import EXIT_FAILED, job, job_env
from tests.support.homes import make_home
from tests.support.processes import REPO

AUDIT_MODULE = '''
"""A three-step durable job whose blocking check fails on every odd item."""

import warnings

import pandas as pd
from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    DynamicPartitionsDefinition,
    MaterializeResult,
    MetadataValue,
    PreviewWarning,
    asset_check,
)

from durable_assets.kit import BatchRuntime, DurableJob, DurableJobs, durable_asset, frame_result

warnings.filterwarnings("ignore", category=PreviewWarning)
BATCHES = DynamicPartitionsDefinition(name="audit_batches")


@durable_asset(label="Loading items", partitions_def=BATCHES)
def items(context: AssetExecutionContext, runtime: BatchRuntime) -> MaterializeResult:
    return frame_result(pd.DataFrame({"n": list(range(14))}), {})


@durable_asset(label="Auditing items", partitions_def=BATCHES)
def audited(
    context: AssetExecutionContext, items: pd.DataFrame, runtime: BatchRuntime
) -> MaterializeResult:
    return frame_result(items, {})


@asset_check(asset=audited, partitions_def=BATCHES, blocking=True)
def every_item_even(audited: pd.DataFrame) -> AssetCheckResult:
    odd = [f"item {n} is odd" for n in audited["n"] if n % 2]
    return AssetCheckResult(
        passed=not odd,
        severity=AssetCheckSeverity.ERROR,
        metadata={"problems": len(odd), "examples": MetadataValue.json(odd)},
    )


@durable_asset(label="Publishing items", partitions_def=BATCHES)
def published(
    context: AssetExecutionContext, audited: pd.DataFrame, runtime: BatchRuntime
) -> MaterializeResult:
    return frame_result(audited, {})


durable_jobs = DurableJobs(
    [
        DurableJob(
            "audit",
            assets=[items, audited, published],
            partitions=BATCHES,
            description="Items, audited by a blocking check.",
            checks=[every_item_even],
        )
    ]
)
defs = durable_jobs.definitions(resources={"runtime": BatchRuntime()})
'''

ODD = [f"item {n} is odd" for n in range(1, 14, 2)]  # seven failing items; five are named


@pytest.mark.slow
def test_a_failed_blocking_check_is_named_at_its_assets_step(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "audit_job.py").write_text(AUDIT_MODULE)
    home = make_home(tmp_path)
    env = job_env(home, DURABLE_CODE_LOCATION="audit_job", PYTHONPATH=f"{code}:{REPO}")

    run = job(["run", "--job", "audit", "--id", "au1"], env, tmp_path, timeout=120)
    assert run.proc.returncode == EXIT_FAILED, run.tail()
    [line] = [x for x in run.stderr.splitlines() if x.startswith("error:")]
    named = "; ".join(ODD[:5])
    assert line.startswith(
        f"error: batch au1 failed at step 2 (audited): blocking check every_item_even failed (ERROR): "
        f"{named} (+2 more); full log: "
    ), line
    assert ODD[5] not in line and "Publishing" not in line
    # The help names this location's default job, not the project's (#21 item 6).
    helped = " ".join(job(["run", "--help"], env, tmp_path, timeout=60).stdout.split())
    assert "default audit)" in helped and "refund_batch" not in helped, helped

    st = json.loads(job(["status", "--id", "au1", "--json"], env, tmp_path, timeout=60).stdout)
    assert st["status"] == "failed"
    assert [s["status"] for s in st["steps"]] == ["completed", "failed", "pending"], st["steps"]
    audited = st["steps"][1]
    assert audited["error"] == f"blocking check every_item_even failed (ERROR): {named} (+2 more)"
    assert st["steps"][0]["error"] is None and st["steps"][2]["error"] is None
    assert st["progress"]["step"] == 2
    assert st["progress"]["label"] == "Failed: Auditing items (check every_item_even)"
    assert st["percent_complete"] < 100

    human = job(["status", "--id", "au1"], env, tmp_path, timeout=60).stdout
    assert "ended: step 2/3 Failed: Auditing items (check every_item_even)" in human, human
    assert f"why: blocking check every_item_even failed (ERROR): {named}" in human, human
    assert "Publishing items" not in human
