"""`job serve-location`: a code location served by Dagster's own gRPC code server, brought back when
it dies.

The automatic resume of a batch whose worker was lost (``auto_resume_lost_batches``, ops/auto_resume.py)
is a sensor, and sensors and run workers live in the location's code server. Under `dagster dev` the
code server is a child that nothing restarts once it is killed (host loss, OOM), so the batch would
wait for a person. This is the smallest supervisor that closes that gap on a host without systemd:
it runs ``dagster api grpc`` (from this interpreter's environment) in a process group of its own,
starts it again when it exits unexpectedly, with a bounded backoff so a location that cannot start
does not spin, and stops it (and the run workers in its group) on SIGTERM or SIGINT, exiting 143 or
130. The webserver and the daemon connect to it through a ``workspace.yaml``, which it prints on
stdout (and nothing else there), so ``job serve-location > workspace.yaml`` writes that file.

It never imports the location: code that crashes or hangs on import (or leaks memory as it serves)
takes down the server, never the supervisor that restarts it.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from durable_assets.errors import UsageError
from durable_assets.settings import child_environment

#: Dagster's conventional code-server port (`dagster code-server` and its docs use 4266).
DEFAULT_PORT = 4266
#: What the code server gets to shut down by itself (finish a gRPC call, let its run workers hear
#: the signal and record it) before the rest of its group is SIGKILLed: long enough for a worker to
#: mark its step failed and release its lease, short enough for a service manager's stop timeout
#: (systemd's default is 90 s).
STOP_GRACE_S = 10.0
#: How often the supervisor looks at its child; a restart is at most this late.
POLL_S = 0.2


@dataclass(frozen=True)
class Backoff:
    """When to start a code server again after it exited.

    ``first_s`` after a crash of a server that had run for ``healthy_s`` or longer (a host that
    lost it once should get it back at once); doubling up to ``max_s`` while it keeps dying young
    (a location that fails on import, a port someone else took: retrying every second would only
    fill the log and burn the CPU its neighbours need).
    """

    first_s: float = 1.0
    max_s: float = 30.0
    healthy_s: float = 60.0

    def next_delay(self, previous_s: float | None, uptime_s: float) -> float:
        """The wait before the next start, given the last wait (None: no restart yet) and how long
        the server that just exited had run."""
        if previous_s is None or uptime_s >= self.healthy_s:
            return self.first_s
        return min(previous_s * 2, self.max_s)


@dataclass(frozen=True)
class Location:
    """What the code server serves and where: the arguments of ``dagster api grpc``."""

    module: str
    working_directory: Path
    name: str
    host: str
    port: int

    def argv(self) -> list[str]:
        """``dagster api grpc`` of this interpreter's environment (`python -m dagster` finds the same
        installation as the `dagster` script beside it, without relying on PATH)."""
        return [
            *[sys.executable, "-m", "dagster", "api", "grpc"],
            *["--host", self.host, "--port", str(self.port)],
            *["--module-name", self.module, "--attribute", "defs"],
            *["--working-directory", str(self.working_directory), "--location-name", self.name],
        ]

    def workspace_yaml(self) -> str:
        """The ``workspace.yaml`` that `dagster-webserver -w`, `dagster dev -w` and `dagster-daemon
        run -w` need to use this server instead of starting one of their own."""
        return (
            f"# code location {self.name!r} served by `job serve-location` (module {self.module})\n"
            "load_from:\n"
            "  - grpc_server:\n"
            f"      host: {self.host}\n"
            f"      port: {self.port}\n"
            f"      location_name: {self.name}\n"
        )


def location(module: str, working_directory: str | None, name: str | None, host: str, port: int) -> Location:
    """The location the options name, checked before anything starts (exit 2 with one line): the
    folder exists, the module's top-level package is found from it, the port can be bound
    (0 picks a free one, kept across restarts so the workspace file stays right)."""
    folder = Path(working_directory or os.getcwd()).absolute()
    if not folder.is_dir():
        raise UsageError(f"--working-directory {folder} is not a directory")
    top = module.split(".", 1)[0]
    sys.path.insert(0, str(folder))
    try:
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        found = None
    finally:
        sys.path.remove(str(folder))
    if found is None:
        raise UsageError(
            f"no module named {top!r} in {folder} or the environment: pass --module (default: "
            "DURABLE_CODE_LOCATION, else durable_assets.definitions) and --working-directory"
        )
    return Location(module, folder, name or module, host, _bindable(host, port))


def _bindable(host: str, port: int) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a past server's TIME_WAIT is fine
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise UsageError(
                f"cannot serve on {host}:{port}: {exc.strerror or exc}; "
                "pick another --port (0 = any free port)"
            ) from exc
        return int(probe.getsockname()[1])


class _StopSignal:
    """SIGTERM or SIGINT, remembered: the loop stops the child and exits 128 + the signal."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.event = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._heard)

    def _heard(self, signum: int, _frame: object) -> None:
        self.received = self.received or signum
        self.event.set()


#: Linux's prctl option: the signal a process gets when its parent dies (prctl(2)).
_PR_SET_PDEATHSIG = 1


def _dies_with(supervisor: int) -> Callable[[], None]:
    """Run in the forked child before exec: SIGTERM when the supervisor dies, however it dies.

    SIGTERM and SIGINT reach :func:`_stop`; a SIGKILLed supervisor runs no code, and its server
    would go on holding the port, so a restarted supervisor would be refused ("port in use")
    until someone found and killed the orphan. The kernel sends this signal instead. A
    supervisor that died between the fork and the prctl is caught by the parent check.
    """

    def set_death_signal() -> None:
        if _libc is not None:
            _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != supervisor:
            os.kill(os.getpid(), signal.SIGTERM)

    return set_death_signal


def _load_libc() -> ctypes.CDLL | None:
    """libc, loaded before any fork (a forked child should not load libraries); None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    return ctypes.CDLL(None, use_errno=True)


_libc = _load_libc()


def _describe(returncode: int) -> str:
    if returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    return f"exit code {returncode}"


def _stop(child: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM to the child's group (the server and the run workers it launched), then SIGKILL to
    whatever of the group is left after ``grace_s``."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        child.poll()  # reaped, so a group of only its zombie reads as gone
        try:
            os.killpg(child.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(POLL_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()


def supervise(
    where: Location,
    home: Path | None = None,
    *,
    backoff: Backoff = Backoff(),
    grace_s: float = STOP_GRACE_S,
    log: Callable[[str], None] = lambda line: print(f"serve-location: {line}", file=sys.stderr, flush=True),
) -> int:
    """Serve ``where`` until SIGTERM or SIGINT; returns the exit code (143 or 130).

    ``home``: the instance folder the CLI resolved (``./dagster_home`` when DAGSTER_HOME is unset),
    given to the code server as its DAGSTER_HOME; without it, the code server's is this process's."""
    stop = _StopSignal()
    print(where.workspace_yaml(), end="", flush=True)
    delay: float | None = None
    restarts = 0
    child: subprocess.Popen[bytes] | None = None
    child_env = None if home is None else child_environment(DAGSTER_HOME=str(home))
    while not stop.event.is_set():
        started = time.monotonic()
        # Its environment is this one with the instance the CLI resolved, and the job's own
        # variables. Its output (and its run workers': a step's print) goes to stderr: stdout is the
        # workspace file.
        child = subprocess.Popen(
            where.argv(),
            cwd=where.working_directory,
            env=child_env,
            process_group=0,
            preexec_fn=_dies_with(os.getpid()),  # this process has no other thread to deadlock
            stdout=sys.stderr.fileno(),
        )
        log(f"code server started (pid {child.pid}) on {where.host}:{where.port}")
        while child.poll() is None and not stop.event.wait(POLL_S):
            pass
        if child.returncode is None:  # stopped on purpose
            break
        uptime = time.monotonic() - started
        delay = backoff.next_delay(delay, uptime)
        restarts += 1
        log(
            f"code server (pid {child.pid}) {_describe(child.returncode)} after {uptime:.1f} s; "
            f"restart {restarts} in {delay:g} s"
        )
        stop.event.wait(delay)
    if child is not None and child.returncode is None:
        _stop(child, grace_s)
    received = stop.received or signal.SIGTERM
    log(f"stopped on {signal.Signals(received).name}")
    return 128 + received
