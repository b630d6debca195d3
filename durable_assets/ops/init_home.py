"""`job init-home DIR`: an instance folder made on purpose, for any path.

Before it, the only Postgres and distributed instances were the committed folders
(``dagster_home/postgres``, ``dagster_home/distributed``), usable only from inside the repository
(a relative ``DAGSTER_HOME`` there), and a new folder quietly became SQLite on first use. This writes
the same ``dagster.yaml`` those folders hold (tests/ops/test_init_home.py compares them) into any folder,
and prints the ``export DAGSTER_HOME=...`` line that names it absolutely. An existing file that says
something else is never replaced without ``--force``: it may be someone's live instance.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

from durable_assets.errors import InstanceConfigError, InstanceFolderExistsError, UsageError
from durable_assets.ops.instance import (
    INSTANCE_YAML,
    PG_URL_VARIABLE,
    REQUIRED_PARTS,
    same_database,
    shown_url,
    write_atomically,
)


class HomeKind(StrEnum):
    SQLITE = "sqlite"
    POSTGRES = "postgres"
    DISTRIBUTED = "distributed"


#: What the committed Postgres folders add to the required parts: step output kept for the UI
#: without Dagster's per-step tail processes (durable_assets/kit/compute_logs.py).
COMPUTE_LOGS = """\
compute_logs:
  module: durable_assets.kit.compute_logs
  class: CapturedComputeLogManager
"""

_HEADERS = {
    HomeKind.POSTGRES: (
        "# Postgres instance, written by `job init-home`: Dagster's run, event-log and schedule storage\n"
        "# and every durable_* table of ours share the database below.\n"
    ),
    HomeKind.DISTRIBUTED: (
        "# Distributed instance (`job worker`, `job run --executor celery`), written by `job init-home`:\n"
        "# Dagster's run, event-log and schedule storage and every durable_* table of ours share the\n"
        "# database below, which every host's folder names alike. Broker and queue: DURABLE_BROKER_URL,\n"
        "# DURABLE_BROKER_QUEUE.\n"
    ),
}


def instance_yaml(kind: HomeKind, postgres_url: str | None = None) -> str:
    """The ``dagster.yaml`` of ``kind``: the committed folder's configuration, its Postgres database
    read from ``DAGSTER_PG_URL`` when it starts Dagster (``postgres_url`` None) or written in."""
    if kind == HomeKind.SQLITE:
        return INSTANCE_YAML
    # A JSON string is a YAML double-quoted scalar: any URL is written as given.
    url = f" {json.dumps(postgres_url)}" if postgres_url else f"\n      env: {PG_URL_VARIABLE}"
    storage = f"storage:\n  postgres:\n    postgres_url:{url}\n"
    return _HEADERS[kind] + storage + REQUIRED_PARTS + COMPUTE_LOGS


def check_postgres_url(url: str) -> str:
    """``--postgres URL``: a Postgres URL Dagster and SQLAlchemy both read, or exit 2."""
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception:
        parsed = None
    if parsed is None or parsed.get_backend_name() != "postgresql" or not parsed.database:
        raise UsageError(
            f"--postgres {shown_url(url)!r} is not a Postgres database URL: use "
            "postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE"
        )
    return url


@dataclass(frozen=True)
class InitResult:
    home: Path
    text: str
    #: "wrote", "replaced" (--force) or "kept" (the file already said the same)
    action: str


def init_home(folder: str, kind: HomeKind, postgres_url: str | None, *, force: bool) -> InitResult:
    """Write ``kind``'s ``dagster.yaml`` into ``folder`` (made if missing); refuse a different one
    already there unless ``force``."""
    home = Path(folder).expanduser().absolute()
    if home.exists() and not home.is_dir():
        raise InstanceConfigError(f"{home} is a file, not a folder: give init-home a folder path")
    text = instance_yaml(kind, check_postgres_url(postgres_url) if postgres_url else None)
    path = home / "dagster.yaml"
    action = "wrote"
    if path.exists():
        if _same_config(path, text):
            return InitResult(home, text, "kept")
        if not force:
            raise InstanceFolderExistsError(
                f"{path} already holds another configuration: use another folder, or pass --force "
                "to replace it (batches it stored stay where it stored them)"
            )
        action = "replaced"
    try:
        home.mkdir(parents=True, exist_ok=True)
        # A URL written in may carry a password: then only the owner reads the file.
        write_atomically(path, text, 0o600 if postgres_url else 0o644)
    except OSError as exc:
        raise InstanceConfigError(f"cannot write {path}: {exc.strerror or exc}") from exc
    return InitResult(home, text, action)


def _same_config(path: Path, text: str) -> bool:
    try:
        existing: Any = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return False
    return bool(existing == yaml.safe_load(text))


def describe(result: InitResult, kind: HomeKind, postgres_url: str | None, pg_env: str | None) -> list[str]:
    """What ``job init-home`` prints: the file (a written-in password hidden) and how to use it."""
    path = result.home / "dagster.yaml"
    shown = result.text.replace(postgres_url, shown_url(postgres_url)) if postgres_url else result.text
    verb = {"wrote": "wrote", "replaced": "replaced", "kept": "kept (it already said this)"}[result.action]
    lines = [f"{verb} {path} ({kind.value} instance):", *("  " + line for line in shown.splitlines())]
    lines.append("use it with:")
    lines.append(f"  export DAGSTER_HOME={shlex.quote(str(result.home))}")
    if kind != HomeKind.SQLITE and not postgres_url:
        if pg_env:
            lines.append(
                f"  (it reads {PG_URL_VARIABLE}, now {shown_url(pg_env)}, in every process that opens it)"
            )
        else:
            lines.append(
                f"  export {PG_URL_VARIABLE}=postgresql://USER@HOST:5432/DATABASE   # not set in this shell"
            )
    elif postgres_url and pg_env and not same_database(pg_env, postgres_url):
        lines.append(
            f"  unset {PG_URL_VARIABLE}   # this shell's names another database, and would be refused"
        )
    if kind == HomeKind.DISTRIBUTED:
        lines.append(
            "  export DURABLE_BROKER_QUEUE=...   # one queue per deployment on a shared broker "
            "(default durable_steps)"
        )
    return lines
