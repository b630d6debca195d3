"""Scenario 4 — a SIGKILLed worker: how long until its run is marked failed, and re-executed.

(a) CLI path: `job run` is killed; an operator (here: a loop) runs `job resume` until it is
    accepted. `job resume` refuses (exit 3) while the dead worker's lease is live, then marks the
    run failed and re-executes it. Governed by ``DURABLE_LEASE_TTL_S``.
(b) Daemon path: the run is launched the way the UI launches it (GraphQL ``launchPipelineExecution``
    through ``dagster-graphql`` into the instance's queued run coordinator), on an instance with
    the repository's own ``dagster_home/dagster.yaml`` (``LeaseAwareRunLauncher``, run monitoring,
    run retries) and a real ``dagster-daemon``. The worker (the ``dagster api execute_run`` process,
    found from its lease's ``host:pid``) is SIGKILLed; we time run monitoring marking the run
    FAILURE and run retries starting the re-execution; when the code server died too and Dagster
    drops the retry, the automatic resume (``durable_assets.ops.auto_resume``) starting it instead.
Baseline: the same daemon and monitoring config with Dagster's ``DefaultRunLauncher``. It cannot
check a worker's health, so the run stays STARTED; we watch it for a bounded time.

Times come from run storage (the run record's end and start timestamps) minus the kill's wall
clock time, and are given relative to the bound the configuration promises: TTL + poll interval.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from bench.harness import InstanceView, Result, Size, instance_view, job_env
from durable_assets.kit.leases import owner_pid
from tests.support.homes import make_home
from tests.support.polling import wait_until
from tests.support.processes import JOB, REPO, VENV_BIN, Process

LEASE_TTL_S = 5.0
INVOICES = 200
STEP_DELAY_S = 0.5  # keeps the worker visibly alive until the kill
OBSERVE_S = {"smoke": 15.0, "quick": 30.0, "full": 60.0}  # how long the baseline is watched
WORKSPACE = REPO / "workspace.yaml"
#: The code location's name as workspace.yaml sets it (the launch mutation names it).
LOCATION = yaml.safe_load(WORKSPACE.read_text())["load_from"][0]["python_module"]["location_name"]


def run(size: Size, workdir: Path) -> Result:
    config = yaml.safe_load((REPO / "dagster_home" / "dagster.yaml").read_text())
    poll_s = float(config["run_monitoring"]["poll_interval_seconds"])
    bound = LEASE_TTL_S + poll_s
    cli = _cli_path(workdir / "cli")
    ours = _daemon_path(workdir / "daemon", config, lease_aware=True, observe_s=0)
    plain = {k: v for k, v in config.items() if k != "run_launcher"}
    base = _daemon_path(workdir / "plain", plain, lease_aware=False, observe_s=OBSERVE_S[size])
    host, worker = ours["host"], ours["worker"]
    never = base["host"]["failed_after_s"] is None
    base_host = (
        f"never (still {base['host']['status_after_observation']} after {base['host']['observed_s']:.0f} s)"
        if never
        else f"failed after {base['host']['failed_after_s']:.1f} s"
    )
    return Result(
        4,
        f"dead worker (lease TTL {LEASE_TTL_S:.0f} s, monitoring poll {poll_s:.0f} s)",
        measured=(
            f"worker+code server killed: failed in {host['failed_after_s']:.1f} s, {_retry_text(host)}; "
            f"worker only: failed in {worker['failed_after_s']:.1f} s, {_retry_text(worker)}; "
            f"CLI `job resume` in a loop: failed in {cli['failed_after_s']:.1f} s (lease lapsed at "
            f"{cli['lease_left_at_kill_s']:.1f} s)"
        ),
        baseline=(
            f"DefaultRunLauncher, worker+code server killed: {base_host}; worker only: failed "
            f"{base['worker']['failed_after_s']:.1f} s (by its code server)"
        ),
        ratio=(
            f"{host['failed_after_s'] / bound:.2f} (daemon), {cli['failed_after_s'] / bound:.2f} (CLI) "
            f"of TTL+poll = {bound:.0f} s"
        ),
        goal="failed within TTL+poll; baseline never",
        met=host["failed_after_s"] <= bound + 2.0 and never,
        data={
            "lease_ttl_s": LEASE_TTL_S,
            "monitoring_poll_s": poll_s,
            "bound_s": bound,
            "cli": cli,
            "daemon_lease_aware_launcher": ours,
            "daemon_default_launcher": base,
        },
    )


def _retry_text(d: dict[str, Any]) -> str:
    if d.get("retry_started_after_s") is None:
        dropped = "Dagster dropped the retry (code location unreachable)"
        if d.get("auto_resume_started_after_s") is None:
            return f"no automatic re-execution ({dropped})"
        return (
            f"{dropped}; automatic resume started at {d['auto_resume_started_after_s']:.1f} s "
            f"({d['auto_resume_run_status']})"
        )
    return f"re-execution started at {d['retry_started_after_s']:.1f} s ({d['retry_run_status']})"


# --- (a) the CLI path ----------------------------------------------------------------------------


def _cli_path(workdir: Path) -> dict[str, Any]:
    workdir.mkdir()
    home = make_home(workdir)
    batch = "bench-cli-dead"
    with instance_view(home) as view:
        worker = Process(
            [str(JOB), "run", "--id", batch, "--size", str(INVOICES)],
            job_env(home, DURABLE_LEASE_TTL_S=LEASE_TTL_S, DURABLE_STEP_DELAY_S=STEP_DELAY_S),
            workdir / "worker.log",
        )
        try:
            run_id = wait_until(
                lambda: _started_run(view, batch, worker), timeout=120, what="the run to start"
            )
            wait_until(lambda: _lease_of(view, batch, run_id), timeout=60, what="the run's lease")
            kill_wall = time.time()
            lease_left = view.lease(batch)["expires_at"] - kill_wall  # type: ignore[index]
            worker.sigkill()
        finally:
            worker.reap_group()
        attempts: list[int] = []
        env = job_env(home, DURABLE_LEASE_TTL_S=LEASE_TTL_S)

        def operator() -> None:
            """`job resume` back to back until it is accepted (what a retry loop in cron would do)."""
            while True:
                p = Process([str(JOB), "resume", "--id", batch], env, workdir / f"resume-{len(attempts)}.log")
                attempts.append(p.wait(300))
                if attempts[-1] != 3 or len(attempts) > 100:
                    return

        loop = threading.Thread(target=operator, daemon=True)
        loop.start()
        failed_at = wait_until(lambda: _ended(view, run_id, "FAILURE"), timeout=120, what="the run to fail")
        loop.join(timeout=300)
    return {
        "failed_after_s": round(failed_at - kill_wall, 2),
        "lease_left_at_kill_s": round(lease_left, 2),
        "resume_attempts": len(attempts),
        "resume_exit_codes": attempts,
    }


# --- (b) the daemon path -------------------------------------------------------------------------

#: How a worker dies. "worker": only the run worker process (OOM-killer style); its parent code
#: server survives and notices. "host": the worker and the code server that spawned it (the host or
#: container running them died); nothing of Dagster's is left to notice.
MODES = ("worker", "host")


def _daemon_path(
    workdir: Path, config: dict[str, Any], *, lease_aware: bool, observe_s: float
) -> dict[str, Any]:
    """One daemon, one instance; a batch killed per mode, in turn."""
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import WorkspaceFileTarget

    workdir.mkdir()
    home = make_home(workdir, config=yaml.safe_dump(config))
    env = job_env(home, DURABLE_LEASE_TTL_S=LEASE_TTL_S, DURABLE_STEP_DELAY_S=STEP_DELAY_S)
    out: dict[str, Any] = {}
    with instance_view(home) as view:
        daemon = Process(
            [str(VENV_BIN / "dagster-daemon"), "run", "-w", str(WORKSPACE)], env, workdir / "daemon.log"
        )
        try:
            with WorkspaceProcessContext(view.instance, WorkspaceFileTarget(paths=[str(WORKSPACE)])) as ui:
                for mode in MODES:
                    out[mode] = _kill_and_watch(
                        view, ui, daemon, mode, lease_aware=lease_aware, observe_s=observe_s
                    )
        finally:
            daemon.terminate()
    return out


def _kill_and_watch(
    view: InstanceView, ui: Any, daemon: Process, mode: str, *, lease_aware: bool, observe_s: float
) -> dict[str, Any]:
    batch = f"bench-{mode}-dead"
    view.instance.add_dynamic_partitions("batches", [batch])
    run_id = _submit_like_the_ui(ui, batch)
    owner = wait_until(lambda: _lease_of(view, batch, run_id), timeout=180, what="the worker's lease")
    host, worker = owner.split(":", 1)[0], owner_pid(owner)
    if worker is None:
        raise RuntimeError(f"lease owner {owner} names no process")
    parent = _parent_pid(worker)
    # Only ever kill processes of the daemon we started (its process group), never anything else.
    if host != socket.gethostname() or os.getpgid(worker) != daemon.pid or os.getpgid(parent) != daemon.pid:
        raise RuntimeError(f"lease owner {owner} (parent {parent}) is not a process of our daemon")
    kill_wall = time.time()
    os.kill(worker, signal.SIGKILL)  # the `dagster api execute_run` process: steps run in it
    if mode == "host":
        os.kill(parent, signal.SIGKILL)  # the code server that launched it
    result: dict[str, Any] = {"killed": [worker] + ([parent] if mode == "host" else [])}
    log_offset = daemon.out_path.stat().st_size
    if lease_aware or mode == "worker":
        failed_at = wait_until(lambda: _ended(view, run_id, "FAILURE"), 120, 0.1, "the run to be failed")
        result |= {"failed_after_s": round(failed_at - kill_wall, 2), "failed_by": _failed_by(view, run_id)}
        if not lease_aware:  # the code server failed it, as it would ours: its retry is the same, too
            return result
        retry = wait_until(
            lambda: _retry_of(view, run_id) or _retry_lost(daemon, log_offset),
            timeout=180,
            interval=0.1,
            what="run retries to create a re-execution (or give up)",
        )
        if retry == LOST:
            result |= {"retry_started_after_s": None, "retry_run_status": LOST}
            if not lease_aware:
                return result
            # The daemon brings its code server back on its next workspace refresh (<= 60 s); then
            # the automatic resume (durable_assets.ops.auto_resume, default settings) continues the batch.
            resumed = wait_until(
                lambda: _auto_resume_of(view, run_id),
                timeout=AUTO_RESUME_WAIT_S,
                interval=0.5,
                what="the automatic resume",
            )
            started_at = wait_until(lambda: _start_time(view, resumed), 240, 0.1, "the resume to start")
            wait_until(lambda: _ended(view, resumed, None), timeout=300, what="the resume to finish")
            return result | {
                "auto_resume_created_after_s": round(_created(view, resumed) - kill_wall, 2),
                "auto_resume_started_after_s": round(started_at - kill_wall, 2),
                "auto_resume_run_status": _status(view, resumed),
            }
        started_at = wait_until(lambda: _start_time(view, retry), 180, 0.1, "the re-execution to start")
        if mode == MODES[-1]:  # the last batch of this daemon: see its re-execution through
            wait_until(lambda: _ended(view, retry, None), timeout=240, what="the re-execution to finish")
        return result | {
            "retry_created_after_s": round(_created(view, retry) - kill_wall, 2),
            "retry_started_after_s": round(started_at - kill_wall, 2),
            "retry_run_status": _status(view, retry),
        }
    deadline = time.monotonic() + observe_s
    ended = None
    while time.monotonic() < deadline and ended is None:
        ended = _ended(view, run_id, None)
        time.sleep(0.25)
    return result | {
        "failed_after_s": round(ended - kill_wall, 2) if ended else None,
        "observed_s": observe_s,
        "status_after_observation": _status(view, run_id),
        "retry_created": bool(_retry_of(view, run_id)),
    }


LOST = "lost: the retry daemon could not reach the code location"
#: Workspace refresh (60 s) + DURABLE_AUTO_RESUME_AFTER_S (30 s) + sensor interval (15 s), with room.
AUTO_RESUME_WAIT_S = 240.0


def _auto_resume_of(view: InstanceView, run_id: str) -> str | None:
    from dagster import RunsFilter

    from durable_assets.kit.tags import AUTO_RESUME_OF_TAG

    runs = view.instance.get_runs(RunsFilter(tags={AUTO_RESUME_OF_TAG: run_id}), limit=1)
    return runs[0].run_id if runs else None


def _retry_lost(daemon: Process, offset: int) -> str | None:
    """Dagster's retry daemon logs and drops a retry whose code location is unreachable."""
    with open(daemon.out_path, errors="replace") as f:
        f.seek(offset)
        return LOST if "DagsterUserCodeUnreachableError" in f.read() else None


def _parent_pid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def _submit_like_the_ui(ui: Any, batch: str) -> str:
    """The UI's launch mutation (GraphQL ``launchPipelineExecution``) against the workspace."""
    from dagster_graphql.cli import execute_query
    from dagster_graphql.client.query import LAUNCH_PIPELINE_EXECUTION_MUTATION

    variables = {
        "executionParams": {
            "selector": {
                "repositoryLocationName": LOCATION,
                "repositoryName": "__repository__",
                "jobName": "refund_batch",
            },
            "runConfigData": {"ops": {"invoices": {"config": {"size": INVOICES}}}},
            "executionMetadata": {
                "tags": [
                    {"key": "durable/batch", "value": batch},
                    {"key": "dagster/partition", "value": batch},
                ]
            },
        }
    }
    body = execute_query(ui, LAUNCH_PIPELINE_EXECUTION_MUTATION, variables)["data"]["launchPipelineExecution"]
    if body.get("__typename") != "LaunchRunSuccess":
        raise RuntimeError(f"launch failed: {body}")
    return str(body["run"]["runId"])


# --- reading run storage -------------------------------------------------------------------------


def _started_run(view: InstanceView, batch: str, worker: Process) -> str | None:
    if not worker.alive():
        raise RuntimeError(f"the worker exited early\n{worker.tail()}")
    runs = view.runs(batch)
    return runs[-1].run_id if runs and runs[-1].status.value == "STARTED" else None


def _lease_of(view: InstanceView, batch: str, run_id: str) -> str | None:
    """The live lease's owner (host:pid) once the run's worker holds it."""
    lease = view.lease(batch)
    if lease and lease["run_id"] == run_id and view.lease_live(batch):
        return str(lease["owner"])
    return None


def _ended(view: InstanceView, run_id: str, status: str | None) -> float | None:
    """The run's end timestamp once it ended (with ``status``, if given)."""
    record = view.instance.get_run_record_by_id(run_id)
    if record is None or record.end_time is None:
        return None
    if status is not None and record.dagster_run.status.value != status:
        raise RuntimeError(f"run {run_id} ended {record.dagster_run.status.value}, expected {status}")
    return float(record.end_time)


def _start_time(view: InstanceView, run_id: str) -> float | None:
    record = view.instance.get_run_record_by_id(run_id)
    return float(record.start_time) if record and record.start_time else None


def _created(view: InstanceView, run_id: str) -> float:
    record = view.instance.get_run_record_by_id(run_id)
    return float(record.create_timestamp.timestamp()) if record else float("nan")


def _status(view: InstanceView, run_id: str) -> str:
    run = view.instance.get_run_by_id(run_id)
    return run.status.value if run else "?"


def _retry_of(view: InstanceView, run_id: str) -> str | None:
    from dagster import RunsFilter

    runs = view.instance.get_runs(RunsFilter(tags={"dagster/parent_run_id": run_id}), limit=1)
    return runs[0].run_id if runs else None


def _failed_by(view: InstanceView, run_id: str) -> str:
    """Who failed the run: the engine events logged with the failure name their source."""
    texts = " ".join(entry.message or "" for entry in view.instance.all_logs(run_id))
    if "Run execution process" in texts:
        return "code server (saw its child process die)"
    if "lease" in texts:
        return "run monitoring (lease expired)"
    return "unknown"
