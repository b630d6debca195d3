"""`scripts/ui.sh` as a real process, and the proof that stopping it leaves nothing behind.

The tests start the script users run (with ``--no-setup``: setup already ran), on a free port and a
test instance, and stop it with the signal a user or a supervisor sends. A stop is complete when
no live process remains in any process group of the script's tree (ui.sh's own, and the session
it starts `dagster dev` in: webserver, daemon, code servers, run workers, their `tail -F`s).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from ..conftest import REPO
from ..crash.helpers import free_port, wait_until

UI_SH = REPO / "scripts" / "ui.sh"
LOCATION = "durable_assets"
#: The issue's bound for a stop, SIGTERM or SIGINT alike.
STOP_DEADLINE_S = 5.0


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, pgid) of a process, None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # after "pid (comm) "; comm may hold spaces
    return fields[0], int(fields[1]), int(fields[2])


def _all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def live_in_groups(pgids: set[int]) -> list[str]:
    """Processes (not zombies) in any of these process groups, as `pid cmdline` lines."""
    found = []
    for pid in _all_pids():
        stat = _proc_stat(pid)
        if stat and stat[0] != "Z" and stat[2] in pgids:
            with contextlib.suppress(OSError):
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{pid} {cmd[:160]}")
    return found


def tree_groups(root: int) -> set[int]:
    """The process groups of ``root`` and all its descendants."""
    children: dict[int, list[int]] = {}
    groups: dict[int, int] = {}
    for pid in _all_pids():
        stat = _proc_stat(pid)
        if stat:
            children.setdefault(stat[1], []).append(pid)
            groups[pid] = stat[2]
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid in groups:
            found.add(groups[pid])
        todo.extend(children.get(pid, []))
    return found


class UiProcess:
    """`scripts/ui.sh --no-setup` on ``home``; its output goes to ``log``."""

    def __init__(self, home: Path, log: Path, env: Mapping[str, str] | None = None) -> None:
        self.home, self.log = home, log
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        full_env = {
            **(env or os.environ),
            "DAGSTER_HOME": str(home),
            "PYTHONPATH": str(REPO),
            "PORT": str(self.port),
        }
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                [str(UI_SH), "--no-setup"],
                cwd=REPO,
                env=full_env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # not the test's group: a stop must not reach pytest
                # As from a terminal: pytest itself may run with SIGINT ignored (started in the
                # background), which the script would inherit and could not trap.
                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
            )

    def gql(self, query: str, **variables: Any) -> dict[str, Any]:
        body = {"query": query, "variables": variables}
        response = httpx.post(f"{self.url}/graphql", json=body, timeout=30)
        response.raise_for_status()
        body = response.json()
        assert "errors" not in body, body
        return dict(body["data"])

    def location_loaded(self) -> bool:
        try:
            data = self.gql(
                "{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus "
                "locationOrLoadError { __typename } } } } }"
            )
        except httpx.HTTPError:
            return False
        entries = data["workspaceOrError"]["locationEntries"]
        return any(
            e["name"] == LOCATION
            and e["loadStatus"] == "LOADED"
            and e["locationOrLoadError"]["__typename"] == "RepositoryLocation"
            for e in entries
        )

    def wait_loaded(self, timeout: float = 180) -> UiProcess:
        wait_until(
            lambda: self.proc.poll() is not None or self.location_loaded(),
            timeout,
            interval=0.5,
            what="scripts/ui.sh to serve the code location",
        )
        assert self.proc.poll() is None, f"scripts/ui.sh exited ({self.proc.returncode})\n{self.tail()}"
        return self

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def kill(self) -> None:
        """SIGKILL the script's whole tree at once (teardown after a failure)."""
        for pgid in tree_groups(self.proc.pid) | {self.proc.pid}:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> float:
        """Send ``sig`` to ui.sh alone (as `kill` or a supervisor would; Ctrl-C's SIGINT reaches it
        the same way); return the seconds until no process of its tree is left. Whatever is still
        there after the deadline is SIGKILLed (so a failing test leaks nothing), then reported."""
        groups = tree_groups(self.proc.pid) | {self.proc.pid}
        start = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, sig)
        while live_in_groups(groups) and time.monotonic() - start < STOP_DEADLINE_S + 5:
            time.sleep(0.05)
        elapsed = time.monotonic() - start
        left = live_in_groups(groups)
        for pgid in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        assert not left, f"still running {elapsed:.1f} s after {sig.name}: {left}\n{self.tail()}"
        return elapsed
