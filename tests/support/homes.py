"""Throwaway Dagster instances: a ``DAGSTER_HOME`` folder per test or benchmark, never the user's.

Three kinds: a bare one (SQLite files in the folder, telemetry off), one whose every storage is a
fresh Postgres database of its own, and one with the ``dagster.yaml`` the repository ships
(``dagster_home/``: lease-aware launcher, run monitoring, run retries), for tests that must see
what a user's instance does.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from durable_assets.ops.instance import INSTANCE_YAML

from .processes import REPO

if TYPE_CHECKING:
    from dagster import DagsterInstance

#: The instance every command requires (ops/instance.py): our launcher, run monitoring, run retries,
#: telemetry off. A test's own instance differs from a user's only in where its storage lives.
TELEMETRY_OFF = INSTANCE_YAML
#: The instance configurations the repository ships: "" is dagster_home/, "postgres" its sibling.
SHIPPED = REPO / "dagster_home"
#: The Postgres server tests use (CI starts it); a database per test is created on it.
PG_BASE_URL = os.environ.get("DURABLE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432")


def make_home(root: Path, pg_url: str | None = None, *, config: str = TELEMETRY_OFF) -> Path:
    """``root/dagster_home`` with ``config`` as its dagster.yaml; with ``pg_url``, every storage
    (runs, events, schedules, and our tables with them) lives in that database instead of files."""
    home = root / "dagster_home"
    home.mkdir(parents=True, exist_ok=True)
    storage = f"storage:\n  postgres:\n    postgres_url: {pg_url}\n" if pg_url else ""
    (home / "dagster.yaml").write_text(storage + config)
    return home


def shipped_home(root: Path, variant: str = "", name: str = "dagster_home") -> Path:
    """``root/name`` with a dagster.yaml the repository ships, copied as is (``variant``
    "postgres" reads its database from ``DAGSTER_PG_URL``)."""
    home = root / name
    home.mkdir(parents=True, exist_ok=True)
    shutil.copy(SHIPPED / variant / "dagster.yaml", home / "dagster.yaml")
    return home


def pg_url_of(home: Path) -> str | None:
    """The Postgres database a home made by :func:`make_home` keeps its storages in, if any (a
    shipped home's ``{env: DAGSTER_PG_URL}`` is read from this process's environment)."""
    import yaml

    config = yaml.safe_load((home / "dagster.yaml").read_text()) or {}
    url = (config.get("storage") or {}).get("postgres", {}).get("postgres_url")
    if isinstance(url, dict):
        url = os.environ.get(str(url.get("env")))
    return str(url) if url else None


def postgres_available(base_url: str = PG_BASE_URL) -> bool:
    try:
        import psycopg2

        psycopg2.connect(f"{base_url}/postgres", connect_timeout=3).close()
        return True
    except Exception:
        return False


@contextmanager
def postgres_database(base_url: str = PG_BASE_URL, prefix: str = "durable_test") -> Iterator[str]:
    """A new, empty database on the server (its URL), dropped afterwards even while connected.

    Our engine cache (``durable_assets.kit.db``) keeps pools per URL; they are disposed first, so
    the drop does not leave this process holding dead connections to a database that is gone.
    """
    import psycopg2

    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = psycopg2.connect(f"{base_url}/postgres")
    admin.autocommit = True
    admin.cursor().execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{base_url}/{name}"
    finally:
        from durable_assets.kit import db as kit_db

        for url, engine in list(kit_db._engines.items()):
            if url.endswith(name):
                engine.dispose()
                kit_db._engines.pop(url, None)
        admin.cursor().execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def clean_env(home: Path, **extra: object) -> dict[str, str]:
    """The caller's environment minus every setting of ours (``DURABLE_*``, ``DAGSTER_*``,
    ``STRIPE_*``, pytest's marker), pointed at ``home``: a child sees only what the test chose."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DURABLE_", "DAGSTER_", "STRIPE_")) and k != "PYTEST_CURRENT_TEST"
    }
    env["DAGSTER_HOME"] = str(home)
    env["PYTHONUNBUFFERED"] = "1"
    env.update({name: str(value) for name, value in extra.items()})
    return env


def open_instance(home: Path) -> DagsterInstance:
    """The instance at ``home``, opened the way the CLI opens it: under its first-open file lock,
    storages created and our tables migrated, so this never collides with a worker doing the same."""
    from dagster import DagsterInstance

    from durable_assets.kit.db import DurableDatabase

    with open(home / ".durable-open.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        instance = DagsterInstance.from_config(str(home))
        _ = (instance.run_storage, instance.event_log_storage, instance.schedule_storage)
        DurableDatabase.for_instance(instance)
    return instance
