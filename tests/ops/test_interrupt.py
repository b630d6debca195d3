"""Ctrl-C and SIGTERM on `job run`: the batch stops at a safe point, and `job resume` finishes it.

Real processes and real signals: Ctrl-C is the ``\\x03`` byte typed into a real pseudo-terminal
(the terminal driver turns it into SIGINT for the foreground process group, as for a person), and
SIGTERM is sent by pid. What is asserted is read from the payment simulator, which runs in this
test process and logs every refund request as it arrives: no request after the signal (beyond
those already past the guard), the exit code, the one line on stderr, and, after `job resume`,
every refund exactly once.
"""

from __future__ import annotations

import os
import pty
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from tests.crash.helpers import (
    EXIT_OK,
    Expected,
    JobProcess,
    RefundRequest,
    Simulator,
    assert_refunded_exactly_once,
    job,
    job_env,
)
from tests.support.homes import make_home
from tests.support.machine import scaled, slowness
from tests.support.polling import wait_until
from tests.support.processes import JOB

pytestmark = pytest.mark.slow

SIZE = 300
CONCURRENCY = 4
#: A request that passed the guard before the signal reaches the simulator within this on a quiet
#: machine (times the machine's slowness on this one); one that arrives later was sent after the signal.
IN_FLIGHT_GRACE_S = 0.5
#: The second Ctrl-C stops the worker within this on a quiet machine, while requests in flight take
#: longer to answer (:data:`SLOW_ANSWER_S`): both times the machine's slowness, so that a stop which
#: waited for them fails the bound on any machine.
SECOND_CTRL_C_STOP_S = 7.0
SLOW_ANSWER_S = 8.0


class PtyJob:
    """`job ARGS` on the slave side of a new pseudo-terminal (its controlling terminal), its output
    drained from the master side by a thread so the child never blocks on a full terminal."""

    def __init__(self, args: list[str], env: Mapping[str, str]) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: nothing but exec (the parent has threads)
            os.execve(str(JOB), [str(JOB), *args], dict(env))
        self._chunks: list[bytes] = []
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()
        self.returncode: int | None = None

    def _drain(self) -> None:
        while True:
            try:
                data = os.read(self.fd, 65536)
            except OSError:  # EIO: the child closed the terminal
                return
            if not data:
                return
            self._chunks.append(data)

    def type_ctrl_c(self) -> float:
        """Type Ctrl-C at the terminal; returns the moment it was typed."""
        at = time.monotonic()
        os.write(self.fd, b"\x03")
        return at

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float) -> int:
        wait_until(
            lambda: self.poll() is not None, timeout, what="`job` on the pty to exit", detail=self.text
        )
        self._reader.join(timeout=5)
        assert self.returncode is not None
        return self.returncode

    def text(self) -> str:
        return b"".join(self._chunks).decode(errors="replace")

    def close(self) -> None:
        if self.poll() is None:
            os.killpg(self.pid, signal.SIGKILL)  # its own session: pty.fork made it a session leader
            os.waitpid(self.pid, 0)
        os.close(self.fd)


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[Simulator]:
    with Simulator(tmp_path / "simulator.db", latency_ms=200) as s:
        yield s


def _refunds_started(sim: Simulator, log: list[RefundRequest], alive: object) -> bool:
    assert alive, "the batch ended before the signal"
    return len(log) >= 2 * CONCURRENCY


def _assert_nothing_sent_after(log: list[RefundRequest], signal_at: float) -> None:
    late = [r for r in log if r.at > signal_at + scaled(IN_FLIGHT_GRACE_S)]
    assert not late, f"{len(late)} refund requests reached the provider after the signal"
    assert sum(r.at > signal_at for r in log) <= CONCURRENCY, "more than the requests in flight"


def _resume_finishes_exactly_once(
    batch: str, env: Mapping[str, str], tmp_path: Path, sim: Simulator, expected: Expected
) -> None:
    """One `job resume`, not a loop: the interrupted worker left no live lease to wait for."""
    sim.configure(latency_ms=0)
    resumed = job(["resume", "--id", batch], env, tmp_path, timeout=180)
    assert resumed.proc.returncode == EXIT_OK, resumed.tail()
    assert_refunded_exactly_once(sim.refunds(), expected)
    assert sim.quiet()["refunds_created"] == expected.n


def test_ctrl_c_on_a_terminal_stops_before_the_next_refund_and_resume_finishes(
    tmp_path: Path, sim: Simulator
) -> None:
    batch = "ctrl-c"
    expected = Expected.of(batch, SIZE)
    env = job_env(make_home(tmp_path), payments_url=sim.url, DURABLE_CONCURRENCY=CONCURRENCY)
    log = sim.record_refund_requests()
    worker = PtyJob(["run", "--id", batch, "--size", str(SIZE)], env)
    try:
        wait_until(lambda: _refunds_started(sim, log, worker.poll() is None), 120, what="refunds to start")
        signal_at = worker.type_ctrl_c()
        rc = worker.wait(timeout=60)
    finally:
        worker.close()
    assert rc == 130, worker.text()[-2000:]
    assert f"interrupted at step 4; job resume --id {batch} continues it" in worker.text()
    sent = sim.quiet()["refund_requests"]
    _assert_nothing_sent_after(log, signal_at)
    assert sent < expected.n, "the whole step ran: the signal came too late to test anything"
    _resume_finishes_exactly_once(batch, env, tmp_path, sim, expected)


def test_sigterm_stops_with_143_and_one_line(tmp_path: Path, sim: Simulator) -> None:
    batch = "sigterm"
    expected = Expected.of(batch, SIZE)
    env = job_env(make_home(tmp_path), payments_url=sim.url, DURABLE_CONCURRENCY=CONCURRENCY)
    log = sim.record_refund_requests()
    worker = JobProcess(["run", "--id", batch, "--size", str(SIZE)], env, tmp_path)
    wait_until(lambda: _refunds_started(sim, log, worker.alive()), 120, what="refunds to start")
    signal_at = time.monotonic()
    os.kill(worker.pid, signal.SIGTERM)
    assert worker.wait(timeout=60) == 143, worker.tail()
    assert worker.stderr.strip().splitlines()[-1] == (
        f"interrupted at step 4; job resume --id {batch} continues it"
    ), worker.tail()
    sim.quiet()
    _assert_nothing_sent_after(log, signal_at)
    _resume_finishes_exactly_once(batch, env, tmp_path, sim, expected)


def test_a_second_ctrl_c_stops_at_once_and_resume_takes_over_at_once(tmp_path: Path, sim: Simulator) -> None:
    """Requests in flight take 8 s to answer (times the machine's slowness); the second Ctrl-C does not
    wait for them, and the resume that follows is not refused (exit 3) for a lease the stopped worker
    still held."""
    batch = "ctrl-c-twice"
    expected = Expected.of(batch, SIZE)
    env = job_env(make_home(tmp_path), payments_url=sim.url, lease_ttl_s=60, DURABLE_CONCURRENCY=CONCURRENCY)
    log = sim.record_refund_requests()
    worker = PtyJob(["run", "--id", batch, "--size", str(SIZE)], env)
    try:
        wait_until(lambda: _refunds_started(sim, log, worker.poll() is None), 120, what="refunds to start")
        sim.configure(latency_ms=int(scaled(SLOW_ANSWER_S) * 1000))
        wait_until(lambda: sim.server.in_flight_count() > 0, 30, what="a slow request in flight")
        signal_at = worker.type_ctrl_c()
        wait_until(lambda: "stopping at the next safe point" in worker.text(), 10, what="the first ^C heard")
        worker.type_ctrl_c()
        rc = worker.wait(timeout=30)
        stopped_after = time.monotonic() - signal_at
    finally:
        worker.close()
    assert rc == 130, worker.text()[-2000:]
    assert f"interrupted at step 4; job resume --id {batch} continues it" in worker.text()
    limit = scaled(SECOND_CTRL_C_STOP_S)
    assert stopped_after < limit, (
        f"the second Ctrl-C took {stopped_after:.1f} s to stop the worker ({SECOND_CTRL_C_STOP_S:g} s on a "
        f"quiet machine, {limit:.1f} s on this one, x{slowness():.2f}); requests in flight answer in "
        f"{scaled(SLOW_ANSWER_S):.1f} s"
    )
    _assert_nothing_sent_after(log, signal_at)
    _resume_finishes_exactly_once(batch, env, tmp_path, sim, expected)
