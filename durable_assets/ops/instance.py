"""The Dagster instance a command uses is never Dagster's bare default.

A ``DAGSTER_HOME`` folder without our ``dagster.yaml`` is Dagster's default instance: no lease-aware
launcher, so run monitoring cannot see a dead worker; no run monitoring, so nothing fails its run;
no run retries, so nothing resumes it. Every guarantee the daemon gives a UI-launched batch would
silently be gone. So when the CLI picks an instance: a folder with no ``dagster.yaml`` gets the
project's (SQLite storage in the folder, as ``dagster_home/dagster.yaml``); one whose ``dagster.yaml``
lacks these parts is refused (exit 2), naming each missing line, never quietly patched: the file
may be someone's deliberate configuration.

Nor is it one the shell contradicts. ``DAGSTER_PG_URL`` set beside a folder whose ``dagster.yaml``
stores on SQLite (or a folder without one, which would get SQLite) used to run there quietly: the
batches then lived in files nobody looked in. The distributed executor on SQLite sent steps to
workers that cannot share the file. Both are refused (exit 2) with one line naming the variable or
option and the file, before anything is written; ``job init-home`` (ops/init_home.py) makes the
folder the user meant.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

from durable_assets.errors import (
    ExecutorContradictionError,
    InstanceConfigError,
    PostgresUrlContradictionError,
    UsageError,
)

LAUNCHER_MODULE, LAUNCHER_CLASS = "durable_assets.kit.launcher", "LeaseAwareRunLauncher"

#: The parts every instance of ours has, whatever its storage: the launcher, run monitoring and run
#: retries that let the daemon fail and resume a batch whose worker died (``missing_parts``).
REQUIRED_PARTS = f"""\
run_launcher:
  module: {LAUNCHER_MODULE}
  class: {LAUNCHER_CLASS}
run_monitoring:
  enabled: true
  poll_interval_seconds: 5
  start_timeout_seconds: 180
  max_resume_run_attempts: 0
run_retries:
  enabled: true
  max_retries: 3
  retry_on_asset_or_op_failure: false
telemetry:
  enabled: false
nux:
  enabled: false
"""

#: What a folder without a dagster.yaml gets; the same parts as ``dagster_home/dagster.yaml``
#: (tests/test_location.py holds the two together).
INSTANCE_YAML = (
    "# Written by durable-assets on first use (durable_assets/ops/instance.py): SQLite storage in this\n"
    "# folder, with the launcher, run monitoring and run retries that let the daemon fail and resume a\n"
    "# batch whose worker died. Keep these three sections if you edit this file.\n" + REQUIRED_PARTS
)

#: The variable our committed Postgres instances read their database from.
PG_URL_VARIABLE = "DAGSTER_PG_URL"


class StorageKind(StrEnum):
    SQLITE = "SQLite"
    POSTGRES = "Postgres"
    OTHER = "another storage"


@dataclass(frozen=True)
class InstanceStorage:
    """Where a ``dagster.yaml`` keeps runs and events (and so our tables): what a contradiction is
    judged against. ``url`` is the Postgres URL when the file says it (literally, or through an
    ``{env: NAME}`` that is set), ``variable`` the NAME it reads it from."""

    kind: StorageKind
    url: str | None = None
    variable: str | None = None


def storage_of(config: dict[str, Any]) -> InstanceStorage:
    """The storage a parsed ``dagster.yaml`` selects: ``storage: {postgres|sqlite: ...}``, or the
    older per-storage ``run_storage: {module: ...}`` form; neither is Dagster's default, SQLite."""
    storage = config.get("storage")
    if isinstance(storage, dict) and storage:
        if "postgres" in storage:
            return _postgres(storage.get("postgres") or {})
        return InstanceStorage(StorageKind.SQLITE if "sqlite" in storage else StorageKind.OTHER)
    run_storage = config.get("run_storage")
    if isinstance(run_storage, dict) and run_storage.get("module"):
        module = str(run_storage["module"])
        if "postgres" in module:
            return _postgres(run_storage.get("config") or {})
        return InstanceStorage(StorageKind.SQLITE if "sqlite" in module else StorageKind.OTHER)
    return InstanceStorage(StorageKind.SQLITE)


def _postgres(section: dict[str, Any]) -> InstanceStorage:
    url = section.get("postgres_url")
    if isinstance(url, dict) and isinstance(url.get("env"), str):
        return InstanceStorage(StorageKind.POSTGRES, os.environ.get(url["env"]) or None, url["env"])
    # ``postgres_db`` (host, user, ... fields): the database is not one URL to compare; trusted.
    return InstanceStorage(StorageKind.POSTGRES, str(url) if isinstance(url, str) and url else None)


def shown_url(url: str) -> str:
    """A database URL fit for a message or a terminal: its password hidden."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy reads: shown without what follows a colon before '@'
        return url.split("@")[-1]


def same_database(a: str, b: str) -> bool:
    """Whether two Postgres URLs name one database (user, host, port, name), whatever the driver
    spelling (``postgresql+psycopg2://``) or the options after ``?``."""
    try:
        from sqlalchemy.engine import make_url

        ua, ub = make_url(a), make_url(b)
    except Exception:
        return a.strip() == b.strip()
    return (ua.username, ua.host, ua.port or 5432, ua.database) == (
        ub.username,
        ub.host,
        ub.port or 5432,
        ub.database,
    )


def _has_data(home: Path) -> bool:
    """Whether an instance folder holds anything but its dagster.yaml and our lock files: then it
    may hold batches, and replacing its configuration would hide them."""
    return home.is_dir() and any(
        not p.name.startswith(".") and p.name != "dagster.yaml" for p in home.iterdir()
    )


def check_environment_agrees(home: Path, config: dict[str, Any], *, written: bool) -> None:
    """Refuse a shell that names another storage than ``home``'s ``dagster.yaml`` (``written``: the
    file is not there yet, and ``config`` is what the CLI would write)."""
    from durable_assets.settings import InstanceSettings

    path = home / "dagster.yaml"
    storage = storage_of(config)
    pg_url = InstanceSettings.current().dagster_pg_url
    if pg_url and storage.kind != StorageKind.POSTGRES:
        if written:
            what = f"{home} has no dagster.yaml, and a new one would store on SQLite"
            fix = f"make the folder with `job init-home {home} --postgres-from-env`"
        elif _has_data(home):
            what = f"{path} stores on {storage.kind.value} (and keeps its batches there)"
            fix = "point DAGSTER_HOME at a Postgres instance (`job init-home NEW_DIR --postgres-from-env`)"
        else:
            what = f"{path} stores on {storage.kind.value}"
            fix = f"make the folder with `job init-home {home} --postgres-from-env --force`"
        raise PostgresUrlContradictionError(
            f"{PG_URL_VARIABLE} is set but {what}: {fix}, or unset {PG_URL_VARIABLE}"
        )
    if (
        pg_url
        and storage.url
        and storage.variable != PG_URL_VARIABLE
        and not same_database(pg_url, storage.url)
    ):
        source = (
            f"{storage.variable}={shown_url(storage.url)}" if storage.variable else shown_url(storage.url)
        )
        raise PostgresUrlContradictionError(
            f"{PG_URL_VARIABLE}={shown_url(pg_url)} but {path} stores in {source}: unset "
            f"{PG_URL_VARIABLE}, or point DAGSTER_HOME at that database's folder "
            f"(`job init-home DIR --postgres-from-env`)"
        )
    if storage.kind == StorageKind.SQLITE and _schedule_executor() == "celery":
        raise ExecutorContradictionError(
            f"DURABLE_SCHEDULE_EXECUTOR=celery but {path if not written else home} "
            f"{'stores' if not written else 'would store'} on SQLite, which `job worker`s on other "
            f"hosts cannot share: make a distributed instance with `job init-home DIR --distributed`, "
            f"or unset DURABLE_SCHEDULE_EXECUTOR"
        )


def _schedule_executor() -> str | None:
    """``DURABLE_SCHEDULE_EXECUTOR``, or None while its section is malformed: a reading command
    (`job status`) does not fail on a distributed knob it never uses; the commands that run batches
    name the bad variable themselves (cli.check_worker_env)."""
    from durable_assets.kit.runtime import DistributedSettings

    try:
        return DistributedSettings.current().schedule_executor
    except UsageError:
        return None


def check_shared_storage(home: Path, what: str, otherwise: str) -> None:
    """Refuse the distributed executor (``what``: the option or command that asks for it) on an
    instance that stores on SQLite: the workers share nothing but the database and the broker."""
    path = home / "dagster.yaml"
    try:
        config = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return  # resolve_dagster_home has read it already; a file that vanished since is Dagster's to say
    storage = storage_of(config if isinstance(config, dict) else {})
    if storage.kind != StorageKind.POSTGRES:
        raise ExecutorContradictionError(
            f"{what} needs an instance whose database every worker shares (Postgres), but {path} "
            f"stores on {storage.kind.value}: make a distributed instance with "
            f"`job init-home DIR --distributed` (Postgres from {PG_URL_VARIABLE}) and point DAGSTER_HOME "
            f"at it, or {otherwise}"
        )


def missing_parts(config: dict[str, Any]) -> list[str]:
    """The required lines a parsed ``dagster.yaml`` lacks, as the user would write them."""
    missing = []
    launcher = config.get("run_launcher") or {}
    if (launcher.get("module"), launcher.get("class")) != (LAUNCHER_MODULE, LAUNCHER_CLASS):
        missing.append(f"run_launcher: {{module: {LAUNCHER_MODULE}, class: {LAUNCHER_CLASS}}}")
    for section in ("run_monitoring", "run_retries"):
        if (config.get(section) or {}).get("enabled") is not True:
            missing.append(f"{section}: {{enabled: true}}")
    return missing


def env_references(config: Any, where: str = "") -> list[tuple[str, str]]:
    """Every ``{env: NAME}`` value of a parsed ``dagster.yaml``, with where it stands
    (``storage.postgres.postgres_url``): Dagster reads them when the instance opens, and an unset
    one is a wall of config errors there instead of one line here."""
    if isinstance(config, dict):
        if set(config) == {"env"} and isinstance(config["env"], str):
            return [(where, config["env"])]
        return [
            ref for k, v in config.items() for ref in env_references(v, f"{where}.{k}" if where else str(k))
        ]
    if isinstance(config, list):
        return [ref for i, v in enumerate(config) for ref in env_references(v, f"{where}[{i}]")]
    return []


def ensure_instance_config(home: Path) -> Path:
    """``home``, with the project's ``dagster.yaml`` written if it has none; raises
    :class:`InstanceConfigError` when its own ``dagster.yaml`` lacks a required part, and
    :class:`InstanceContradictionError` when the shell names another storage (nothing written)."""
    if home.exists() and not home.is_dir():
        raise InstanceConfigError(
            f"DAGSTER_HOME={home} is a file, not a folder: point DAGSTER_HOME at the instance's folder "
            "(the one that holds dagster.yaml), or at a new path to make one there"
        )
    path = home / "dagster.yaml"
    if not path.exists():
        check_environment_agrees(home, yaml.safe_load(INSTANCE_YAML), written=True)
        try:
            home.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InstanceConfigError(
                f"cannot make the instance folder DAGSTER_HOME={home}: {exc.strerror or exc}; point "
                "DAGSTER_HOME at a folder you can write"
            ) from exc
        write_atomically(path, INSTANCE_YAML)
        return home
    try:
        config = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise InstanceConfigError(f"cannot read {path}: {exc}") from exc
    unset = [(where, name) for where, name in env_references(config) if not os.environ.get(name)]
    if unset:
        where, name = unset[0]
        raise InstanceConfigError(
            f"{name} is not set, and {path} reads {where} from it: export {name} (for Postgres, "
            f"{name}=postgresql://USER@HOST:5432/DATABASE), or use an instance folder that does not need it"
        )
    config = config if isinstance(config, dict) else {}
    check_environment_agrees(home, config, written=False)
    missing = missing_parts(config)
    if missing:
        raise InstanceConfigError(
            f"{path} lacks {'; '.join(missing)}: without them the daemon never fails nor resumes a batch "
            "whose worker died; add them (see dagster_home/dagster.yaml), or move the file away to get "
            "the project's"
        )
    return home


def write_atomically(path: Path, text: str, mode: int = 0o644) -> None:
    """Two commands starting together on a new folder write the same text; a rename is atomic."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
