"""Guardrails pinned at `job run` (issue #21 item 4): a ceiling survives a shell without its variable.

Before: a batch stopped by ``DURABLE_MAX_REFUNDS_PER_BATCH=5`` and resumed from a shell without that
variable sent every refund. Now the batch's ceilings are stored when it first runs; a resume keeps
them (and says so), only ``--override-guardrails`` replaces them (recorded, shown by `job status`),
and a re-execution that does not go through the CLI (the daemon's) uses them too. Refunds are
counted in the embedded provider's file, which outlives every worker.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.crash.helpers import EXIT_FAILED, EXIT_OK, EmbeddedProvider, Expected, job, job_env
from tests.support.homes import make_home, open_instance

SIZE = 100  # 18 refund candidates: above a ceiling of 5
KEPT = (
    "guardrails pinned at job run are kept: DURABLE_MAX_REFUNDS_PER_BATCH=5 (this shell: unset → 100000); "
    "pass --override-guardrails to use this shell's"
)


def _refunds(home: Path, expected: Expected) -> list[dict[str, object]]:
    return expected.mine(EmbeddedProvider(home).refunds())


@pytest.fixture(params=["sqlite", "postgres"])
def home(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    pg = str(request.getfixturevalue("pg_database")) if request.param == "postgres" else None
    return make_home(tmp_path / "home", pg)


@pytest.mark.slow
def test_a_resume_keeps_the_pinned_ceiling_until_it_is_overridden(home: Path, tmp_path: Path) -> None:
    expected = Expected.of("g1", SIZE)
    assert expected.n > 5
    low = job(
        ["run", "--id", "g1", "--size", str(SIZE)], job_env(home, DURABLE_MAX_REFUNDS_PER_BATCH=5), tmp_path
    )
    assert low.proc.returncode == EXIT_FAILED, low.tail()
    assert "per-batch ceiling of 5" in low.stderr and "--override-guardrails" in low.stderr
    assert _refunds(home, expected) == []

    # Another shell, without the variable: the batch's 5 is kept, said in one line, nothing sent.
    plain = job(["resume", "--id", "g1"], job_env(home), tmp_path)
    assert plain.proc.returncode == EXIT_FAILED, plain.tail()
    assert KEPT in plain.stderr.splitlines()
    assert "per-batch ceiling of 5" in plain.stderr
    assert _refunds(home, expected) == []
    st = json.loads(job(["status", "--id", "g1", "--json"], job_env(home), tmp_path).stdout)
    assert st["guardrails"]["pinned"]["RefundLimits"]["max_refunds_per_batch"] == 5
    assert st["guardrails"]["overridden_at"] is None and st["guardrails"]["overridden_from"] is None

    # On purpose: this shell's ceiling replaces the pinned one, recorded; every refund exactly once.
    high = job_env(home, DURABLE_MAX_REFUNDS_PER_BATCH=1000)
    over = job(["resume", "--id", "g1", "--override-guardrails"], high, tmp_path)
    assert over.proc.returncode == EXIT_OK, over.tail()
    assert "guardrails overridden with this shell's: DURABLE_MAX_REFUNDS_PER_BATCH 5 → 1000" in over.stderr
    refunds = _refunds(home, expected)
    keys = [r["metadata"]["idempotency_key"] for r in refunds]  # type: ignore[index]
    assert len(refunds) == expected.n and len(set(keys)) == expected.n
    st = json.loads(job(["status", "--id", "g1", "--json"], high, tmp_path).stdout)
    guard = st["guardrails"]
    assert st["status"] == "succeeded"
    assert guard["pinned"]["RefundLimits"]["max_refunds_per_batch"] == 1000
    assert guard["overridden_at"].endswith("Z")
    assert guard["overridden_from"]["RefundLimits"]["max_refunds_per_batch"] == 5
    human = job(["status", "--id", "g1"], high, tmp_path).stdout
    assert "DURABLE_MAX_REFUNDS_PER_BATCH=1000" in human
    assert "overridden at" in human and "max_refunds_per_batch 5 → 1000" in human

    # A later resume from the first shell changes nothing: the batch is done.
    again = job(["resume", "--id", "g1"], job_env(home, DURABLE_MAX_REFUNDS_PER_BATCH=5), tmp_path)
    assert again.proc.returncode == EXIT_OK and len(_refunds(home, expected)) == expected.n


@pytest.mark.slow
def test_a_reexecution_outside_the_cli_uses_the_pinned_ceiling(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the daemon's run retry or a UI re-execution does: re-execute the failed run in a process
    whose environment has no ceiling variable; the batch's pinned 5 still stops it."""
    from dagster import ReexecutionOptions, execute_job

    from durable_assets.ops.reexecution import batch_tags
    from durable_assets.ops.registry import durable_jobs, reconstructable_job
    from durable_assets.ops.status import batch_runs

    expected = Expected.of("g2", SIZE)
    low = job(
        ["run", "--id", "g2", "--size", str(SIZE)], job_env(home, DURABLE_MAX_REFUNDS_PER_BATCH=5), tmp_path
    )
    assert low.proc.returncode == EXIT_FAILED, low.tail()

    monkeypatch.delenv("DURABLE_MAX_REFUNDS_PER_BATCH", raising=False)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    assert durable_jobs().resources["limits"].configured_values()["max_refunds_per_batch"] == 100_000
    instance = open_instance(home)
    try:
        failed = batch_runs(instance, "g2")[-1]
        result = execute_job(
            reconstructable_job(durable_jobs().get("refund_batch")),
            instance,
            reexecution_options=ReexecutionOptions.from_failure(failed.run_id, instance),
            tags=batch_tags("g2"),
            raise_on_error=False,
        )
        assert not result.success
        errors = [
            str(e.event_specific_data.error.message)  # type: ignore[union-attr]
            for e in result.all_events
            if e.is_step_failure
        ]
        assert any("per-batch ceiling of 5" in m for m in errors), errors
    finally:
        instance.dispose()
    assert _refunds(home, expected) == []
