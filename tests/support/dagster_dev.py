"""`dagster dev` on a test instance, the code location's gRPC server, and ``scripts/ui.sh``.

All of them stop the same way (:func:`.processes.stop_tree`): a signal, a short grace for the
tree to exit by itself, then SIGKILL to every process group of the tree. Left to itself `dagster
dev` keeps its code server alive until runs in flight end and ignores SIGTERM when started with
SIGINT ignored, so a polite stop can take tens of seconds; this one takes a few.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from .homes import pg_url_of
from .machine import scaled, slowness
from .network import free_port
from .polling import wait_until
from .processes import JOB, REPO, VENV_BIN, Process, kill_group, kill_tree, stop_tree

_seq = itertools.count(1)
#: The code location's name in workspace.yaml (and of a CodeServer).
LOCATION = "durable_assets"
#: What `dagster dev` gets to shut down by itself before SIGKILL (scripts/ui.sh's GRACE_MS).
DEV_GRACE_S = 2.5


@dataclass(frozen=True)
class LaunchedJob:
    """The job a :class:`DagsterDev` waits to see loaded and launches, and the op whose ``size``
    config sets a batch's size (what the UI's launchpad would be given)."""

    name: str
    size_op: str

    def run_config(self, size: int) -> dict[str, Any]:
        return {"ops": {self.size_op: {"config": {"size": size}}}}


#: Our own reference job, the default of every helper here.
REFUNDS = LaunchedJob("refund_batch", "invoices")


def _logs(log_dir: Path, stem: str) -> tuple[Path, Path]:
    base = log_dir / f"{next(_seq):03d}-{stem}"
    return base.with_suffix(".out"), base.with_suffix(".err")


def graphql(url: str, query: str, **variables: Any) -> dict[str, Any]:
    """The ``data`` of the Dagster webserver's answer at ``url``; one with ``errors`` fails the caller."""
    response = httpx.post(f"{url}/graphql", json={"query": query, "variables": variables}, timeout=30)
    response.raise_for_status()
    body = response.json()
    assert "errors" not in body, body
    return dict(body["data"])


class Webserver:
    """What `dagster dev` and scripts/ui.sh share: a port of their own and a GraphQL endpoint."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    def gql(self, query: str, **variables: Any) -> dict[str, Any]:
        return graphql(self.url, query, **variables)


class DagsterDev(Webserver):
    """`dagster dev` (webserver + daemon + code server) on a test instance, as a user would run it.

    The instance's dagster.yaml is the shipped one (our launcher, run monitoring, run retries),
    with the monitoring poll shortened so a test waits seconds, not tens of seconds. ``job`` is
    the job it waits for and launches; a location other than ours comes with its ``code_server``.
    """

    def __init__(
        self,
        home: Path,
        env: Mapping[str, str],
        log_dir: Path,
        poll_interval_s: int = 2,
        code_server: CodeServer | None = None,
        job: LaunchedJob = REFUNDS,
    ) -> None:
        super().__init__()
        self.job = job
        shipped = (REPO / "dagster_home" / "dagster.yaml").read_text()
        # With a code server of its own, `dagster dev` only connects to it (a deployment's layout);
        # otherwise it starts one as a child that nothing restarts once it dies.
        self.workspace = code_server.workspace_file(log_dir) if code_server else REPO / "workspace.yaml"
        self.poll_interval_s = poll_interval_s
        pg_url = pg_url_of(home)
        storage = f"storage:\n  postgres:\n    postgres_url: {pg_url}\n" if pg_url else ""
        (home / "dagster.yaml").write_text(
            storage + shipped.replace("poll_interval_seconds: 5", f"poll_interval_seconds: {poll_interval_s}")
        )
        self.home, self.env, self.log_dir = home, env, log_dir

    def start(self) -> DagsterDev:
        """Start it (open the instance from the test first: first-open creates the SQLite files)."""
        argv = [VENV_BIN / "dagster", "dev", "-w", self.workspace, "-h", "127.0.0.1", "-p", self.port]
        env = {**self.env, "DAGSTER_HOME": str(self.home)}
        out, err = _logs(self.log_dir, "dagster-dev")
        # SIGINT reset: dagster maps SIGTERM to SIGINT's handler, so the stop's SIGTERM is heard.
        self.proc = Process([str(a) for a in argv], env, out, err, sigint_default=True)
        wait_until(
            self._ready, timeout=120, interval=0.25, what="the Dagster webserver", detail=self.proc.tail
        )
        return self

    def _ready(self) -> bool:
        assert self.proc.alive(), f"dagster dev exited\n{self.proc.tail()}"
        # The code location is loaded once the job is visible through GraphQL.
        query = "{ repositoriesOrError { ... on RepositoryConnection { nodes { jobs { name } } } } }"
        try:
            if httpx.get(f"{self.url}/server_info", timeout=2).status_code != 200:
                return False
            body = httpx.post(f"{self.url}/graphql", json={"query": query}, timeout=10).json()
        except httpx.HTTPError:
            return False
        nodes = (body.get("data") or {}).get("repositoriesOrError", {}).get("nodes", [])
        return any(job["name"] == self.job.name for node in nodes for job in node["jobs"])

    def launch(
        self,
        batch_id: str,
        size: int,
        *,
        run_config: Mapping[str, Any] | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> str:
        """Launch a batch the way the UI's launchpad does (GraphQL launchRun, partition tag only),
        with ``run_config`` merged over the job's (e.g. ``execution``) and ``tags`` added."""
        from dagster_graphql import DagsterGraphQLClient

        client = DagsterGraphQLClient("127.0.0.1", port_number=self.port)
        return client.submit_job_execution(
            self.job.name,
            run_config={**self.job.run_config(size), **(run_config or {})},
            tags={"dagster/partition": batch_id, **(tags or {})},
        )

    def stop(self, grace_s: float = DEV_GRACE_S) -> float:
        """SIGTERM to its whole group, ``grace_s`` for the tree to go, then SIGKILL what is left
        (runs in flight included: the tests read storages, which outlive it). Returns seconds."""
        if not hasattr(self, "proc"):
            return 0.0
        stopped = stop_tree(self.proc.proc, signal.SIGTERM, grace_s, whole_group=True)
        self.proc.alive()
        return stopped.elapsed_s


class CodeServer:
    """The code location's gRPC server (`dagster api grpc`) as its own process group, as a deployment
    runs it on the worker's host: the run workers it launches are its children, in its group, so one
    ``killpg`` is the host dying; :meth:`start` again is the host's supervisor bringing it back.

    By default it serves our own location; ``module`` (with the folder it is imported from,
    ``working_dir``) and ``location`` serve a user's, as ``dagster api grpc -m`` would.
    """

    def __init__(
        self,
        env: Mapping[str, str],
        log_dir: Path,
        *,
        module: str = "durable_assets.definitions",
        working_dir: Path | None = None,
        location: str = LOCATION,
    ) -> None:
        self.env, self.log_dir = env, log_dir
        self.module, self.working_dir, self.location = module, working_dir, location
        self.port = free_port()
        self.proc: Process | None = None

    def workspace_file(self, directory: Path) -> Path:
        path = directory / "grpc_workspace.yaml"
        path.write_text(
            "load_from:\n  - grpc_server:\n      host: 127.0.0.1\n"
            f"      port: {self.port}\n      location_name: {self.location}\n"
        )
        return path

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 120) -> CodeServer:
        argv = [str(VENV_BIN / "dagster"), "api", "grpc", "--host", "127.0.0.1", "--port", str(self.port)]
        argv += ["--location-name", self.location, "--module-name", self.module, "--attribute", "defs"]
        if self.working_dir is not None:
            argv += ["--working-directory", str(self.working_dir)]
        out, err = _logs(self.log_dir, "code-server")
        self.proc = Process(argv, self.env, out, err, cwd=self.working_dir)
        wait_until(self._serving, timeout=timeout, interval=0.25, what="the code server", detail=self.tail)
        return self

    def _serving(self) -> bool:
        assert self.proc is not None and self.proc.alive(), f"code server exited\n{self.tail()}"
        return self._ping()

    def _ping(self) -> bool:
        from dagster._grpc.client import DagsterGrpcClient

        try:
            DagsterGrpcClient(port=self.port, host="127.0.0.1").ping("")
            return True
        except Exception:
            return False

    def kill_host(self) -> None:
        """SIGKILL the code server and every run worker it launched, at once (one process group)."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.proc.wait(timeout=scaled(30))

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.reap_group()

    def tail(self) -> str:
        return self.proc.tail() if self.proc is not None else "(code server not started)"


class SupervisedCodeServer(CodeServer):
    """The same code server run by `job serve-location` (durable_assets/ops/serve_location.py): the
    supervisor's child is the server, in a process group of its own with the run workers it launches,
    so :meth:`kill_host` is still the host's loss, and the supervisor, not the test, brings it back.

    ``pid`` is the server now serving (the newest the supervisor says it started).
    """

    supervisor: Process | None = None

    def start(self, timeout: float = 120) -> SupervisedCodeServer:
        """Start the supervisor (once), and wait until its server answers."""
        if self.supervisor is None:
            argv = [str(JOB), "serve-location", "--module", self.module, "--location-name", self.location]
            argv += ["--port", str(self.port)]
            if self.working_dir is not None:
                argv += ["--working-directory", str(self.working_dir)]
            out, err = _logs(self.log_dir, "serve-location")
            self.supervisor = Process(argv, self.env, out, err, cwd=self.working_dir)
        wait_until(
            self._serving, timeout=timeout, interval=0.25, what="the supervised code server", detail=self.tail
        )
        return self

    def started_pids(self) -> list[int]:
        """Every server the supervisor started, oldest first (its stderr's lines)."""
        text = self.supervisor.stderr if self.supervisor is not None else ""
        return [int(pid) for pid in re.findall(r"code server started \(pid (\d+)\)", text)]

    @property
    def pid(self) -> int:
        pids = self.started_pids()
        assert pids, f"the supervisor started no code server\n{self.tail()}"
        return pids[-1]

    def _serving(self) -> bool:
        assert self.supervisor is not None and self.supervisor.alive(), f"supervisor exited\n{self.tail()}"
        return bool(self.started_pids()) and self._ping()

    def kill_host(self) -> None:
        """SIGKILL the server and its run workers at once (one process group); returns once the
        supervisor has reaped the server (its pid gone), not when it is back."""
        killed = self.pid
        os.killpg(killed, signal.SIGKILL)
        wait_until(
            lambda: not Path(f"/proc/{killed}").exists(), timeout=30, what=f"code server {killed} reaped"
        )

    def wait_back(self, killed: int, timeout: float = 120) -> int:
        """Until the supervisor has started a server other than ``killed`` and it answers; its pid."""
        wait_until(
            lambda: self.pid != killed and self._serving(),
            timeout=timeout,
            interval=0.1,
            what="the supervisor to restart the code server",
            detail=self.tail,
        )
        return self.pid

    def stop(self) -> None:
        """SIGTERM the supervisor (it stops its server), then SIGKILL whatever a failed stop left."""
        if self.supervisor is not None:
            pids = self.started_pids()
            self.supervisor.terminate()
            for pid in pids:
                kill_group(pid)

    def tail(self) -> str:
        return self.supervisor.tail() if self.supervisor is not None else "(supervisor not started)"


UI_SH = REPO / "scripts" / "ui.sh"
#: The product's promise (scripts/ui.sh, README): SIGTERM or SIGINT stops it, whole, within this on an
#: idle machine.
STOP_DEADLINE_S = 5.0


def stop_deadline_s() -> float:
    """What a test allows the stop on this machine now: the promise assumes an idle machine (load
    below 1 on 2 cores), and on a loaded one every process of the tree takes longer to be scheduled,
    hear the signal and exit (ui.sh's own SIGKILL comes at 2.5 s whatever the load). So the test
    scales the promise by the measured slowness (tests/support/machine.py) and says so."""
    return scaled(STOP_DEADLINE_S)


def assert_stopped_in_time(elapsed_s: float, sig: signal.Signals) -> None:
    limit = stop_deadline_s()
    assert elapsed_s <= limit, (
        f"scripts/ui.sh took {elapsed_s:.2f} s to stop on {sig.name}: the promise is {STOP_DEADLINE_S:g} s "
        f"on an idle machine; this one measured x{slowness():.2f} slower, so {limit:.1f} s were allowed"
    )


class UiProcess(Webserver):
    """`scripts/ui.sh --no-setup` on ``home`` (setup already ran), on a free port; output in ``log``.

    ``proc`` is the script's ``Popen``. Not in ``Process.spawned``: ui.sh starts `dagster dev` in a
    session of its own, so only its own :meth:`stop` or :meth:`kill` (the whole tree) cleans up.
    """

    def __init__(self, home: Path, log: Path, env: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self.home, self.log = home, log
        full_env = {
            **(env or os.environ),
            "DAGSTER_HOME": str(home),
            "PYTHONPATH": str(REPO),
            "PORT": str(self.port),
        }
        # Not the test's group (a stop must not reach pytest), and SIGINT as from a terminal:
        # pytest itself may run with SIGINT ignored, which the script would inherit and not trap.
        self.process = Process(
            [str(UI_SH), "--no-setup"], full_env, log, cwd=REPO, sigint_default=True, track=False
        )
        self.proc = self.process.proc

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
            detail=self.tail,
        )
        assert self.proc.poll() is None, f"scripts/ui.sh exited ({self.proc.returncode})\n{self.tail()}"
        return self

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def kill(self) -> None:
        """SIGKILL the script's whole tree at once (teardown after a failure)."""
        kill_tree(self.proc)

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> float:
        """Send ``sig`` to ui.sh alone (as `kill` or a supervisor would; Ctrl-C's SIGINT reaches it
        the same way); return the seconds until no process of its tree is left. Whatever is still
        there after twice the deadline (scaled: :func:`stop_deadline_s`) is SIGKILLed, so a failing
        test leaks nothing, then reported. The caller asserts the deadline itself."""
        stopped = stop_tree(self.proc, sig, 2 * stop_deadline_s())
        assert not stopped.killed, (
            f"still running {stopped.elapsed_s:.1f} s after {sig.name} (the promise: {STOP_DEADLINE_S:g} s "
            f"on an idle machine; this one x{slowness():.2f}): {stopped.killed}\n{self.tail()}"
        )
        return stopped.elapsed_s
