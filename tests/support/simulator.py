"""The Stripe-compatible payment simulator, started and always stopped, two ways.

- :class:`ThreadedSimulator`: served from a thread of the caller. It outlives every worker a test
  kills, and the test can reconfigure faults or swap its request handler while it serves.
- :class:`SimulatorProcess`: the real `job provider serve` command in a process of its own (its
  own session, output in a file): the command line is what is under test, or the client being
  measured must not share its CPU with the server.

Both are context managers, so a fixture is ``with ThreadedSimulator(path) as sim: yield sim``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from .network import Closing, ServedInThread, free_port
from .polling import wait_until
from .processes import JOB, Process

if TYPE_CHECKING:
    from durable_assets_testing.simulator import SimulatorServer


class ThreadedSimulator(ServedInThread):
    """``build_server`` on a free port of 127.0.0.1, serving from a daemon thread until :meth:`close`.

    ``faults`` are :class:`~durable_assets_testing.simulator.Faults`' fields (``latency_ms``,
    ``error_rate``, ...); ``seed`` and ``api_keys`` are ``build_server``'s.
    """

    server: SimulatorServer

    def __init__(
        self,
        db_path: Path,
        *,
        poll_interval: float = 0.02,
        seed: int | None = None,
        api_keys: Iterable[str] = (),
        **faults: Any,
    ) -> None:
        from durable_assets_testing.simulator import Faults, build_server

        server = build_server("127.0.0.1", 0, str(db_path), Faults(**faults), seed=seed, api_keys=api_keys)
        super().__init__(server, poll_interval)

    @property
    def url(self) -> str:
        return self.server.url

    def configure(self, **faults: Any) -> None:
        """Switch faults while serving (see ``SimulatorServer.configure``)."""
        self.server.configure(**faults)


class SimulatorProcess(Closing):
    """`job provider serve --port P --db DB [args]`, ready once it answers ``/healthz``.

    ``command`` replaces the `job` console script (e.g. ``python -c "...main()"``); ``env``
    defaults to the caller's. Output goes to ``log`` (default: next to ``db``, ``.log``).
    """

    def __init__(
        self,
        db: Path,
        *args: str,
        command: Sequence[str] = (str(JOB),),
        env: Mapping[str, str] | None = None,
        log: Path | None = None,
        timeout: float = 60,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [*command, "provider", "serve", "--port", str(self.port), "--db", str(db), *args]
        self.proc = Process(argv, os.environ if env is None else env, log or db.with_suffix(".log"))
        self._http = httpx.Client(timeout=10)
        try:
            wait_until(
                self._healthy, timeout=timeout, what="the simulator to answer /healthz", detail=self.tail
            )
        except BaseException:
            self.stop()
            raise

    def _healthy(self) -> bool:
        if not self.proc.alive():
            raise RuntimeError(f"simulator exited\n{self.proc.tail()}")
        try:
            return self._http.get(f"{self.url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def stats(self) -> dict[str, int]:
        """``GET /_sim/stats`` (never fault-injected)."""
        return {k: int(v) for k, v in self._http.get(f"{self.url}/_sim/stats").json().items()}

    @property
    def output(self) -> str:
        """What the server wrote (stdout and stderr), e.g. for an assertion's message."""
        return self.proc.stdout

    def tail(self) -> str:
        return self.proc.tail()

    def close(self) -> None:
        """SIGTERM (it closes its store), then reap its group."""
        self._http.close()
        self.proc.terminate(timeout=10)

    stop = close
