"""Step output captured for the UI without starting four processes per step.

Dagster's default ``LocalComputeLogManager`` writes each step's stdout and stderr to files the UI
reads, and mirrors them back to the terminal: per stream it starts a ``tail -F`` and a Python
watcher (``watch_orphans``) and stops both when the step ends. In process that happens once per
run; on a distributed worker it happens for every task, and those four process starts were the
largest share of a task's overhead (docs/benchmarks.md, scenario 10). A ``job worker``'s terminal
is not where anyone reads a step's output, so this manager keeps the files exactly where and as
the default writes them (same paths, same completion marker: the UI's stdout/stderr view is
unchanged) and skips the mirror. Configured in ``dagster_home/postgres`` and
``dagster_home/distributed``; the SQLite home keeps Dagster's default, whose ``dagster dev``
terminal shows step output as it runs.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Generator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from dagster import Field, Float, StringSource

from durable_assets.kit.dagster_internals import (
    IO_TYPE_EXTENSION,
    CapturedLogContext,
    ComputeIOType,
    LocalComputeLogManager,
    compute_logs_directory,
    redirect_to_file,
)

__all__ = ["CapturedComputeLogManager"]


class CapturedComputeLogManager(LocalComputeLogManager):
    """Dagster's local compute logs, captured by redirecting the file descriptors only.

    ``base_dir`` is optional: without it the files go where Dagster's default puts them, under the
    instance folder's ``storage``.
    """

    def __init__(self, base_dir: str | None = None, **kwargs: Any) -> None:
        self._configured_dir = base_dir
        super().__init__(base_dir or "", **kwargs)

    @property  # type: ignore[override]
    def _base_dir(self) -> str:
        return self._configured_dir or compute_logs_directory(self._instance.root_directory)

    @_base_dir.setter
    def _base_dir(self, value: str) -> None:
        self._configured_dir = value or None

    @classmethod
    def config_type(cls) -> dict[str, Any]:
        return {
            "base_dir": Field(StringSource, is_required=False),
            "polling_timeout": Field(Float, is_required=False),
        }

    @classmethod
    def from_config_value(cls, inst_data: Any, config_value: Mapping[str, Any]) -> CapturedComputeLogManager:
        return cls(inst_data=inst_data, **config_value)

    @contextmanager
    def capture_logs(self, log_key: Sequence[str]) -> Generator[CapturedLogContext, None, None]:
        out = self.get_captured_local_path(log_key, IO_TYPE_EXTENSION[ComputeIOType.STDOUT])
        err = self.get_captured_local_path(log_key, IO_TYPE_EXTENSION[ComputeIOType.STDERR])
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with redirect_to_file(sys.stdout, out), redirect_to_file(sys.stderr, err):
            yield CapturedLogContext(log_key)
        # Dagster's marker that the capture finished: the UI stops following the files.
        with open(self.complete_artifact_path(log_key), "a"):
            pass
