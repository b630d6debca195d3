"""Child processes of a test or a benchmark, and the guarantee that none of them outlives it.

Everything here starts its child in a new session (process group = the child's pid), so that what
the child spawns in turn (Dagster's run workers, code servers, the ``tail -F`` that mirrors step
output) can be killed by that one id, and never the caller's own group. Output goes to files, so a
chatty child can never block on a full pipe, and a failure can show its tail.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from tests.support.machine import scaled, slowness
from tests.support.polling import wait_until

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = REPO / ".venv" / "bin"
PYTHON = VENV_BIN / "python" if (VENV_BIN / "python").exists() else Path(sys.executable)
JOB = VENV_BIN / "job"


class ProcessTimeout(AssertionError, TimeoutError):
    """A child did not exit in time (it has been killed, with its group, by then)."""


def _sigint_default() -> None:
    """As from a terminal: the caller may run with SIGINT ignored (started in the background, as CI
    does), which a child inherits; Dagster maps SIGTERM to SIGINT's handler and would ignore both."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextlib.contextmanager
def _sigint_not_ignored() -> Iterator[Callable[[], None] | None]:
    """What gives a child SIGINT's default: the ``preexec_fn`` to pass, or None when none is needed.

    A child inherits an ignored signal, never a handler (exec resets handlers to the default). So on
    the main thread an ignored SIGINT is handled by Python's default handler while the child starts,
    and no Python runs between fork and exec: that path forks with ``fork()``, whose ``atfork``
    handlers include gRPC's, which hung a pytest worker that had talked to a code server (the
    parent blocked in gRPC's prefork handler, inside ``fork``). Elsewhere, ``_sigint_default``.
    """
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        yield None
    elif threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            yield None
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    else:
        yield _sigint_default


class Process:
    """One child in its own session, stdout (and stderr, or both together) in files.

    ``spawned`` lists every one started in this interpreter, so that a test's teardown can reap
    what the test left running (see ``tests/conftest.py``), whatever helper started it.
    """

    spawned: ClassVar[list[Process]] = []

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        out: Path,
        err: Path | None = None,
        *,
        cwd: Path | None = None,
        label: str | None = None,
        sigint_default: bool = False,
        track: bool = True,
    ) -> None:
        """Start ``argv``; its stdout goes to ``out``, its stderr to ``err`` (or ``out`` too).

        ``sigint_default`` gives the child SIGINT's default even when the caller ignores it (see
        :func:`_sigint_not_ignored`).
        ``track=False`` keeps it out of ``spawned``: for a child whose stop is its own business
        (scripts/ui.sh starts a session of its own, which reaping ui.sh's group would leak).
        """
        self.argv = [str(a) for a in argv]
        self.label = label or " ".join([Path(self.argv[0]).name, *self.argv[1:4]])
        self.out_path, self.err_path = out, err
        with contextlib.ExitStack() as files:
            stdout = files.enter_context(open(out, "w"))
            stderr = files.enter_context(open(err, "w")) if err else subprocess.STDOUT
            preexec = files.enter_context(_sigint_not_ignored()) if sigint_default else None
            self.proc = subprocess.Popen(
                self.argv,
                env=dict(env),
                cwd=cwd,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,
                preexec_fn=preexec,
            )
        self.started = time.monotonic()
        self.ended: float | None = None
        if track:
            Process.spawned.append(self)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        if self.proc.poll() is None:
            return True
        self.ended = self.ended or time.monotonic()
        return False

    def wait(self, timeout: float) -> int:
        """Wait for the exit code; past ``timeout`` (quiet-machine seconds, scaled by the machine's
        measured slowness: tests/support/machine.py) kill the group and raise with the output's tail."""
        limit = scaled(timeout)
        try:
            rc = self.proc.wait(timeout=limit)
        except subprocess.TimeoutExpired as exc:
            self.reap_group()
            raise ProcessTimeout(
                f"`{self.label}` did not finish in {limit:.0f} s ({timeout:g} s on a quiet machine "
                f"x{slowness():.2f})\n{self.tail()}"
            ) from exc
        self.ended = self.ended or time.monotonic()
        return rc

    def exited_within(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for the process to exit on its own (a timed wait, not a sleep).

        Not scaled: the crash tier uses it to place a kill at a moment measured on this machine
        (kill_at_then_finish); a caller that means a deadline passes ``scaled(seconds)``."""
        try:
            self.proc.wait(timeout=max(seconds, 0.0))
        except subprocess.TimeoutExpired:
            return False
        self.ended = self.ended or time.monotonic()
        return True

    @property
    def wall_s(self) -> float:
        """Start to exit, in seconds (what a benchmark times)."""
        if self.ended is None:
            raise RuntimeError("process still running")
        return self.ended - self.started

    def sigkill(self) -> float:
        """SIGKILL the process itself (no cleanup, no atexit, no lease release), then reap it;
        returns the kill's ``time.monotonic()``. Its children live on: that is the crash."""
        at = time.monotonic()
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=scaled(30))
        self.ended = self.ended or at
        return at

    def kill_when(
        self, condition: Callable[[], object], *, what: str, timeout: float = 180, interval: float = 0.01
    ) -> float:
        """SIGKILL the process as soon as ``condition`` holds; it must still be running then (a
        process that ended first fails the test: the kill would have tested nothing)."""
        wait_until(lambda: condition() or not self.alive(), timeout=timeout, interval=interval, what=what)
        at = self.sigkill()
        assert self.proc.returncode == -signal.SIGKILL, f"`{self.label}` ended before the kill\n{self.tail()}"
        return at

    def terminate(self, timeout: float = 20) -> None:
        """SIGTERM and wait ``timeout`` (scaled) for the process to go (servers and daemons shut their
        children down on it), SIGKILL it past that, then reap the group."""
        if self.proc.poll() is None:
            self.proc.terminate()
            if not self.exited_within(scaled(timeout)):
                self.sigkill()
        self.reap_group()

    def reap_group(self) -> None:
        """Kill the process and whatever is left of its process group (by its id, nothing else).

        Dagster mirrors step output through a ``tail -F`` child whose orphan watcher starts a moment
        later; a SIGKILL in between leaks the tail unless its group is killed too.
        """
        if self.proc.poll() is None:
            self.sigkill()
        kill_group(self.proc.pid)

    @property
    def stdout(self) -> str:
        return self.out_path.read_text(errors="replace") if self.out_path.exists() else ""

    @property
    def stderr(self) -> str:
        """Its stderr ('' when it shares ``stdout``'s file)."""
        return self.err_path.read_text(errors="replace") if self.err_path and self.err_path.exists() else ""

    def tail(self, chars: int = 3000) -> str:
        head = f"--- {self.label} (rc={self.proc.returncode})"
        if self.err_path is None:
            return f"{head}:\n{self.stdout[-chars:]}"
        return f"{head} stdout:\n{self.stdout[-chars:]}\n--- stderr:\n{self.stderr[-chars:]}"


def kill_group(pgid: int, sig: signal.Signals = signal.SIGKILL) -> None:
    """Signal a whole process group; nothing to do when it is already gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


# --- process trees, read from /proc --------------------------------------------------------------


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
    """The process groups of ``root`` and all its descendants (a child may start a session of its
    own, as scripts/ui.sh does for `dagster dev`; killing ``root``'s group would miss it)."""
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


@dataclass(frozen=True)
class Stopped:
    """How a :func:`stop_tree` went: seconds until nothing was left, and what had to be SIGKILLed."""

    elapsed_s: float
    killed: list[str]


def stop_tree(
    proc: subprocess.Popen[bytes], sig: signal.Signals, grace_s: float, *, whole_group: bool = False
) -> Stopped:
    """Send ``sig`` (to ``proc`` alone, or with ``whole_group`` to its process group), give every
    process of its tree ``grace_s`` seconds to go, then SIGKILL every group of the tree.

    The groups are read before the signal, since children are re-parented once their parent exits.
    A stop is thus bounded by ``grace_s`` whatever the children do (a code server waiting for runs
    in flight, `dagster dev` started with SIGINT ignored), and leaks nothing either way.
    """
    groups = tree_groups(proc.pid) | {proc.pid}
    start = time.monotonic()
    if whole_group:
        kill_group(proc.pid, sig)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)
    while live_in_groups(groups) and time.monotonic() - start < grace_s:
        time.sleep(0.05)
    elapsed = time.monotonic() - start
    left = live_in_groups(groups)
    for pgid in groups:
        kill_group(pgid)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=scaled(10))
    return Stopped(elapsed, left)


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL every process group of ``proc``'s tree at once (teardown after a failure)."""
    for pgid in tree_groups(proc.pid) | {proc.pid}:
        kill_group(pgid)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=scaled(10))
