"""The capture-only compute log manager: what a step prints reaches the UI's files, and no process
is started to get it there (Dagster's default starts a ``tail`` and a watcher per stream)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dagster import DagsterInstance, asset, materialize

from durable_assets.kit.compute_logs import CapturedComputeLogManager

REPO = Path(__file__).resolve().parents[2]


@asset
def talkative() -> int:
    print("to stdout from the step")
    print("to stderr from the step", file=sys.stderr)
    return 1


def _instance(home: Path, compute_logs: dict[str, object]) -> DagsterInstance:
    (home / "dagster.yaml").write_text(yaml.safe_dump({"compute_logs": compute_logs}))
    return DagsterInstance.from_config(str(home))


def _captured(instance: DagsterInstance, run_id: str) -> tuple[str, str, bool]:
    manager = instance.compute_log_manager
    [file_key] = [
        e.dagster_event.logs_captured_data.file_key
        for e in instance.all_logs(run_id)
        if e.dagster_event is not None and e.dagster_event.event_type_value == "LOGS_CAPTURED"
    ]
    log_key = manager.build_log_key_for_run(run_id, file_key)
    data = manager.get_log_data(log_key)
    return (
        (data.stdout or b"").decode(),
        (data.stderr or b"").decode(),
        manager.is_capture_complete(log_key),
    )


@pytest.mark.parametrize("base_dir", [None, "elsewhere"])
def test_step_output_is_kept_where_the_ui_reads_it_without_starting_a_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, base_dir: str | None
) -> None:
    config: dict[str, object] = {
        "module": "durable_assets.kit.compute_logs",
        "class": "CapturedComputeLogManager",
    }
    if base_dir:
        config["config"] = {"base_dir": str(tmp_path / base_dir)}
    with _instance(tmp_path, config) as instance:
        assert isinstance(instance.compute_log_manager, CapturedComputeLogManager)

        started: list[str] = []
        popen = subprocess.Popen

        def recording(argv: list[str], *args: object, **kwargs: object) -> object:
            started.append(" ".join(map(str, argv)))
            return popen(argv, *args, **kwargs)  # type: ignore[call-overload]

        monkeypatch.setattr(subprocess, "Popen", recording)
        result = materialize([talkative], instance=instance)
        monkeypatch.undo()

        assert [a for a in started if "tail" in a or "watch_orphans" in a] == []

        assert result.success
        out, err, complete = _captured(instance, result.run_id)
        assert "to stdout from the step" in out
        assert "to stderr from the step" in err
        assert complete
        expected_root = tmp_path / (base_dir or "storage")
        assert any(expected_root.rglob("*.out")), "the files are under the configured root"


@pytest.mark.parametrize("home", ["postgres", "distributed"])
def test_the_shared_homes_use_it_and_the_sqlite_home_keeps_dagsters_default(home: str) -> None:
    def manager_of(path: Path) -> object:
        return (yaml.safe_load(path.read_text()) or {}).get("compute_logs", {}).get("class")

    assert manager_of(REPO / "dagster_home" / home / "dagster.yaml") == "CapturedComputeLogManager"
    assert manager_of(REPO / "dagster_home" / "dagster.yaml") is None
