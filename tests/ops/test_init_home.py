"""An instance is made on purpose (#35 item 2): `job init-home` writes any folder's dagster.yaml, and
an instance the shell contradicts is refused before a batch exists, never quietly SQLite.

Every command is a real `job` process started in a folder outside the repository, with an
environment that holds none of our settings but the ones each test names (``clean_env``).
"""

from __future__ import annotations

import json
from pathlib import Path

import psycopg2
import pytest
import yaml

from tests.conftest import job_cli
from tests.support.homes import SHIPPED, clean_env

PG_URL = "DAGSTER_PG_URL"


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def _config(path: Path) -> object:
    return yaml.safe_load(path.read_text())


def _no_batches(home: Path, cwd: Path) -> None:
    """Read through the CLI, with nothing contradicting: the instance holds no batch at all."""
    listed = job_cli("list", "--json", env=clean_env(home), cwd=cwd)
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == []


def test_init_home_sqlite_from_a_relative_path_then_a_batch_runs(tmp_path: Path) -> None:
    made = job_cli("init-home", "instance", env=clean_env(tmp_path / "unused"), cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    home = tmp_path / "instance"
    assert f"export DAGSTER_HOME={home}" in made.stdout, made.stdout
    assert _config(home / "dagster.yaml") == _config(SHIPPED / "dagster.yaml")  # the committed one's

    run = job_cli("run", "--id", "ih-1", "--size", "20", env=clean_env(home), cwd=tmp_path, timeout=180)
    assert run.returncode in (0, 4), run.stderr
    status = json.loads(job_cli("status", "--id", "ih-1", "--json", env=clean_env(home), cwd=tmp_path).stdout)
    assert status["status"] == "succeeded"
    assert (home / "durable.db").is_file()  # our tables beside Dagster's files, in that folder
    assert not (tmp_path / "unused").exists()  # init-home opened no instance


@pytest.mark.postgres
def test_init_home_postgres_from_env_stores_the_batch_in_that_database(
    tmp_path: Path, pg_database: str
) -> None:
    home = tmp_path / "pg-instance"
    made = job_cli(
        "init-home", str(home), "--postgres-from-env", env=clean_env(tmp_path / "unused"), cwd=tmp_path
    )
    assert made.returncode == 0, made.stderr
    assert f"export DAGSTER_HOME={home}" in made.stdout and f"export {PG_URL}=" in made.stdout, made.stdout
    assert _config(home / "dagster.yaml") == _config(SHIPPED / "postgres" / "dagster.yaml")

    env = clean_env(home, DAGSTER_PG_URL=pg_database)
    run = job_cli("run", "--id", "ih-pg", "--size", "20", env=env, cwd=tmp_path, timeout=180)
    assert run.returncode in (0, 4), run.stderr
    with psycopg2.connect(pg_database) as conn, conn.cursor() as cur:
        cur.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        tables = {r[0] for r in cur.fetchall()}
        cur.execute("SELECT count(*) FROM durable_leases WHERE batch_id = 'ih-pg'")
        leases = cur.fetchone()[0]
    assert {"runs", "event_logs", "durable_idempotency", "durable_leases"} <= tables
    assert leases == 1
    assert not (home / "durable.db").exists() and not (home / "runs.db").exists()  # nothing on SQLite


def test_init_home_distributed_is_the_committed_distributed_folder(tmp_path: Path) -> None:
    made = job_cli("init-home", "dist", "--distributed", env=clean_env(tmp_path / "unused"), cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert _config(tmp_path / "dist" / "dagster.yaml") == _config(SHIPPED / "distributed" / "dagster.yaml")
    assert "DURABLE_BROKER_QUEUE" in made.stdout


def test_a_written_in_url_is_kept_out_of_sight(tmp_path: Path) -> None:
    url = "postgresql://app:s3cret@db.internal:5433/batches"
    made = job_cli("init-home", "lit", "--postgres", url, env=clean_env(tmp_path / "unused"), cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    path = tmp_path / "lit" / "dagster.yaml"
    assert _config(path)["storage"] == {"postgres": {"postgres_url": url}}  # type: ignore[index]
    assert "s3cret" not in made.stdout and path.stat().st_mode & 0o077 == 0
    bad = job_cli("init-home", "other", "--postgres", "mysql://x/y", env=clean_env(tmp_path), cwd=tmp_path)
    assert bad.returncode == 2 and "not a Postgres database URL" in _one_line(bad.stderr)
    assert not (tmp_path / "other").exists()


def test_an_existing_different_dagster_yaml_is_replaced_only_with_force(tmp_path: Path) -> None:
    env = clean_env(tmp_path / "unused")
    assert job_cli("init-home", "h", env=env, cwd=tmp_path).returncode == 0
    path = tmp_path / "h" / "dagster.yaml"
    before = path.read_text()

    refused = job_cli("init-home", "h", "--postgres-from-env", env=env, cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr
    line = _one_line(refused.stderr)
    assert str(path) in line and "--force" in line, line
    assert path.read_text() == before

    again = job_cli("init-home", "h", env=env, cwd=tmp_path)  # the same configuration: nothing to do
    assert again.returncode == 0 and again.stdout.startswith("kept"), again.stdout
    forced = job_cli("init-home", "h", "--postgres-from-env", "--force", env=env, cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert _config(path) == _config(SHIPPED / "postgres" / "dagster.yaml")


def test_dagster_pg_url_beside_a_sqlite_instance_is_refused_before_a_batch_exists(tmp_path: Path) -> None:
    assert job_cli("init-home", "sq", env=clean_env(tmp_path), cwd=tmp_path).returncode == 0
    home = tmp_path / "sq"
    env = clean_env(home, DAGSTER_PG_URL="postgresql://postgres@127.0.0.1:5432/nowhere")
    for argv in (["run", "--id", "c-1", "--size", "5"], ["status", "--id", "c-1"], ["resume", "--id", "c-1"]):
        p = job_cli(*argv, env=env, cwd=tmp_path)
        assert p.returncode == 2, p.stderr
        line = _one_line(p.stderr)
        assert f"{PG_URL} is set but {home / 'dagster.yaml'} stores on SQLite" in line, line
        assert f"job init-home {home} --postgres-from-env" in line, line
    assert sorted(f.name for f in home.iterdir()) == ["dagster.yaml"]  # nothing opened, nothing made
    _no_batches(home, tmp_path)


def test_dagster_pg_url_with_a_new_folder_makes_nothing(tmp_path: Path) -> None:
    """Before #35 this wrote a SQLite dagster.yaml and ran the batch there."""
    home = tmp_path / "brand-new"
    p = job_cli(
        "run",
        "--id",
        "c-2",
        "--size",
        "5",
        env=clean_env(home, DAGSTER_PG_URL="postgresql://x@h/db"),
        cwd=tmp_path,
    )
    assert p.returncode == 2, p.stderr
    line = _one_line(p.stderr)
    assert f"{home} has no dagster.yaml, and a new one would store on SQLite" in line, line
    assert not home.exists()


def test_dagster_pg_url_naming_another_database_than_the_file(tmp_path: Path) -> None:
    written = "postgresql://postgres@127.0.0.1:5432/written_in"
    assert (
        job_cli("init-home", "lit", "--postgres", written, env=clean_env(tmp_path), cwd=tmp_path).returncode
        == 0
    )
    home = tmp_path / "lit"
    p = job_cli("status", "--id", "x", env=clean_env(home, DAGSTER_PG_URL=written + "_other"), cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    line = _one_line(p.stderr)
    assert f"{PG_URL}=" in line and "written_in_other" in line and str(home / "dagster.yaml") in line, line


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["run", "--id", "c-3", "--size", "5", "--executor", "celery"], "--executor celery"),
        (["worker"], "`job worker`"),
    ],
)
def test_the_distributed_executor_on_a_sqlite_instance_is_refused(
    tmp_path: Path, argv: list[str], names: str
) -> None:
    assert job_cli("init-home", "sq", env=clean_env(tmp_path), cwd=tmp_path).returncode == 0
    home = tmp_path / "sq"
    p = job_cli(*argv, env=clean_env(home), cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    line = _one_line(p.stderr)
    assert names in line and f"{home / 'dagster.yaml'} stores on SQLite" in line, line
    assert "job init-home DIR --distributed" in line, line
    _no_batches(home, tmp_path)


def test_a_schedule_executor_of_celery_on_a_sqlite_instance_is_refused(tmp_path: Path) -> None:
    assert job_cli("init-home", "sq", env=clean_env(tmp_path), cwd=tmp_path).returncode == 0
    home = tmp_path / "sq"
    p = job_cli("list", env=clean_env(home, DURABLE_SCHEDULE_EXECUTOR="celery"), cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    assert "DURABLE_SCHEDULE_EXECUTOR=celery" in _one_line(p.stderr)


def test_the_resume_of_a_distributed_batch_on_a_sqlite_instance_is_refused(tmp_path: Path) -> None:
    """A batch that ran on the workers (as a SQLite instance let one before #35) is not resumed there
    in process or on workers that cannot share the file: exit 2, and its run is left as it was."""
    from dagster import DagsterRun, DagsterRunStatus

    from durable_assets.kit.modes import ExecutorKind
    from durable_assets.kit.tags import BATCH_TAG, EXECUTOR_TAG
    from tests.support.homes import open_instance

    assert job_cli("init-home", "sq", env=clean_env(tmp_path), cwd=tmp_path).returncode == 0
    home = tmp_path / "sq"
    instance = open_instance(home)
    run = DagsterRun(
        job_name="refund_batch",
        run_id="0f0f0f0f-0000-4000-8000-000000000001",
        tags={BATCH_TAG: "dist-1", EXECUTOR_TAG: ExecutorKind.CELERY.value},
        status=DagsterRunStatus.FAILURE,
    )
    instance.add_run(run)
    p = job_cli("resume", "--id", "dist-1", env=clean_env(home), cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    line = _one_line(p.stderr)
    assert "batch dist-1 ran with --executor celery" in line and "stores on SQLite" in line, line
    runs = instance.get_runs()
    assert [r.run_id for r in runs] == [run.run_id] and runs[0].status == DagsterRunStatus.FAILURE
