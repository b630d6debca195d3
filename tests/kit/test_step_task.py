"""A `job worker`'s pool child opens its instance before its first task (step_task.warm_up)."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from dagster import DagsterInstance

from durable_assets.kit import step_task
from tests.support.homes import shipped_home


@pytest.mark.postgres
def test_a_warmed_up_child_s_first_read_opens_nothing_and_asks_no_catalog(
    tmp_path: Path, pg_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a child's first task paid (the instance, its storages' connections and schema checks)
    is paid by the warm-up: the task then finds the instance open and sends its read alone."""
    monkeypatch.setenv("DAGSTER_PG_URL", pg_database)
    monkeypatch.setattr(step_task, "_own_home", str(shipped_home(tmp_path, "distributed")))
    monkeypatch.setattr(step_task, "_instances", {})
    step_task.warm_up()
    own = step_task._instances[step_task._OWN]
    assert isinstance(own, DagsterInstance)
    try:
        seen: list[str] = []

        def record(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
            seen.append(statement)

        sa.event.listen(sa.engine.Engine, "before_cursor_execute", record)
        try:
            assert step_task._own_instance() is own  # the same instance, not a second one
            assert own.get_run_by_id("no-such-run") is None
        finally:
            sa.event.remove(sa.engine.Engine, "before_cursor_execute", record)
        assert seen, "the read sent nothing: it did not reach the database"
        assert not [s for s in seen if "pg_catalog" in s or "information_schema" in s], seen
    finally:
        own.dispose()


def test_a_warm_up_without_a_home_of_its_own_leaves_the_ref_to_the_task(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No instance of its own (a worker started without a home, or before its database): nothing
    is raised and nothing kept; the first task asks again, and falls back to the orchestrator's ref
    as it always did."""
    monkeypatch.setattr(step_task, "_instances", {})

    def no_instance() -> DagsterInstance:
        raise RuntimeError("no dagster.yaml here")

    monkeypatch.setattr(step_task, "_open_own", no_instance)
    step_task.warm_up()
    assert step_task._instances == {}
    assert step_task._own_instance() is None  # the task's answer is final for the process
    assert step_task._instances == {step_task._OWN: None}
