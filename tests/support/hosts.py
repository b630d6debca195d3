"""Processes that behave as if each ran on a host of its own, sharing only Postgres and RabbitMQ.

A real second host shares no files and no clock with the first. A test gets both on one machine:
each process starts in a mount namespace of its own (``unshare --mount``, as root) with a private
tmpfs over :attr:`Hosts.root`, the folder that holds every host's instance folder, so no process
sees another's files there, even by an absolute path passed along with a task; and a host may run
under Debian's ``faketime`` with a clock of its own. The repository, the venv and the logs stay
shared (they are the software and the test's record, not state of the batch).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

#: Mount a tmpfs over the hosts' folder, make this host's instance folder with the deployment's
#: dagster.yaml in it, then become the command. ``$1`` hosts' folder, ``$2`` the instance folder,
#: ``$3`` the dagster.yaml to copy (outside the hosts' folder, so still visible), then the command.
_ENTER_HOST = (
    'mount -t tmpfs -o size=512m,mode=0755 durable-host "$1" && mkdir -p "$2" '
    '&& cp "$3" "$2/dagster.yaml" && shift 3 && exec "$@"'
)


def private_mounts_available() -> str | None:
    """Why this machine cannot give a process private mounts (None when it can)."""
    if os.geteuid() != 0:
        return "private mounts need root (unshare --mount)"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", "mount -t tmpfs t /mnt"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        return f"unshare --mount fails here: {probe.stderr.strip()[:200]}"
    return None


def faketime_command() -> str | None:
    """The ``faketime`` wrapper, its dead predecessors' state cleared (:func:`clear_stale_faketime`)."""
    found = shutil.which("faketime")
    if found is not None:
        clear_stale_faketime()
    return found


def clear_stale_faketime() -> None:
    """Remove the semaphore and shared memory a SIGKILLed ``faketime`` left in /dev/shm.

    The wrapper names both after its own PID and creates them exclusively; killed, it leaves
    them, and a later wrapper that gets the same PID back fails at once ("sem_open: File
    exists"). The crash tests kill hosts under faketime, and PIDs come round on a busy runner.
    Only a dead PID's files go: a live wrapper's are in use.
    """
    for path in Path("/dev/shm").glob("*faketime_*_*"):
        pid = path.name.rsplit("_", 1)[-1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            path.unlink(missing_ok=True)


@dataclass(frozen=True)
class Hosts:
    """Where the hosts' instance folders live, and the dagster.yaml each host gets."""

    root: Path
    dagster_yaml: Path

    def home(self, host: str) -> Path:
        """``host``'s DAGSTER_HOME: a path that exists only inside that host's namespace."""
        return self.root / host

    def command(self, host: str, program: list[str], clock_offset: str | None = None) -> list[str]:
        """``program`` as ``host`` runs it; ``clock_offset`` (faketime's: ``"+40s"``) shifts its clock."""
        clock = [] if clock_offset is None else [_faketime(), "-f", clock_offset]
        return [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            _ENTER_HOST,
            "sh",
            str(self.root),
            str(self.home(host)),
            str(self.dagster_yaml),
            *clock,
            *program,
        ]


def _faketime() -> str:
    found = faketime_command()
    if found is None:
        pytest.skip("faketime is not installed: scripts/setup.sh --with-postgres installs it")
    return found
