"""The Dagster instance a command uses is never Dagster's bare default.

A ``DAGSTER_HOME`` folder without our ``dagster.yaml`` is Dagster's default instance: no lease-aware
launcher, so run monitoring cannot see a dead worker; no run monitoring, so nothing fails its run;
no run retries, so nothing resumes it. Every guarantee the daemon gives a UI-launched batch would
silently be gone. So when the CLI picks an instance: a folder with no ``dagster.yaml`` gets the
project's (SQLite storage in the folder, as ``dagster_home/dagster.yaml``); one whose ``dagster.yaml``
lacks these parts is refused (exit 2), naming each missing line, never quietly patched: the file
may be someone's deliberate configuration.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from durable_assets.errors import InstanceConfigError

LAUNCHER_MODULE, LAUNCHER_CLASS = "durable_assets.kit.launcher", "LeaseAwareRunLauncher"

#: What a folder without a dagster.yaml gets; the same parts as ``dagster_home/dagster.yaml``
#: (tests/test_instance_config.py holds the two together).
INSTANCE_YAML = f"""\
# Written by durable-assets on first use (durable_assets/ops/instance.py): SQLite storage in this
# folder, with the launcher, run monitoring and run retries that let the daemon fail and resume a
# batch whose worker died. Keep these three sections if you edit this file.
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
    :class:`InstanceConfigError` when its own ``dagster.yaml`` lacks a required part."""
    if home.exists() and not home.is_dir():
        raise InstanceConfigError(
            f"DAGSTER_HOME={home} is a file, not a folder: point DAGSTER_HOME at the instance's folder "
            "(the one that holds dagster.yaml), or at a new path to make one there"
        )
    path = home / "dagster.yaml"
    if not path.exists():
        try:
            home.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InstanceConfigError(
                f"cannot make the instance folder DAGSTER_HOME={home}: {exc.strerror or exc}; point "
                "DAGSTER_HOME at a folder you can write"
            ) from exc
        # Two commands starting together on a new folder write the same text; a rename is atomic.
        fd, tmp = tempfile.mkstemp(dir=home, prefix=".dagster.yaml.")
        with os.fdopen(fd, "w") as out:
            out.write(INSTANCE_YAML)
        os.replace(tmp, path)
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
    missing = missing_parts(config if isinstance(config, dict) else {})
    if missing:
        raise InstanceConfigError(
            f"{path} lacks {'; '.join(missing)}: without them the daemon never fails nor resumes a batch "
            "whose worker died; add them (see dagster_home/dagster.yaml), or move the file away to get "
            "the project's"
        )
    return home
