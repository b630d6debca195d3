"""`job serve-location` (durable_assets/ops/serve_location.py): when it restarts a code server, what
it prints for the webserver and the daemon, what it refuses, and how it stops.

That it brings a killed server back and the daemon then finishes the batch is the slow tier's
tests/crash/test_serve_location.py.
"""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from durable_assets.errors import UsageError
from durable_assets.ops.serve_location import Backoff, location
from tests.support.dagster_dev import SupervisedCodeServer
from tests.support.polling import wait_until
from tests.support.processes import live_in_groups


def test_restarts_wait_1_s_doubling_to_30_s_and_start_over_after_a_healthy_minute() -> None:
    policy = Backoff()
    delays: list[float] = []
    previous = None
    for _ in range(8):  # a server that dies 2 s after every start
        previous = policy.next_delay(previous, uptime_s=2.0)
        delays.append(previous)
    assert delays == [1, 2, 4, 8, 16, 30, 30, 30]
    assert policy.next_delay(30, uptime_s=60.0) == 1  # it had served a minute: back at once
    assert policy.next_delay(30, uptime_s=59.9) == 30
    assert policy.next_delay(None, uptime_s=0.1) == 1  # the first restart never waits long


def test_it_prints_the_workspace_dagster_reads(tmp_path: Path) -> None:
    (tmp_path / "shop_location.py").write_text("defs = None\n")
    where = location("shop_location", str(tmp_path), None, "127.0.0.1", 0)
    assert where.port > 0  # 0 picks a free port, named in the workspace
    assert yaml.safe_load(where.workspace_yaml()) == {
        "load_from": [
            {"grpc_server": {"host": "127.0.0.1", "port": where.port, "location_name": "shop_location"}}
        ]
    }
    argv = where.argv()
    assert argv[1:5] == ["-m", "dagster", "api", "grpc"]
    assert argv[argv.index("--working-directory") + 1] == str(tmp_path)
    assert argv[argv.index("--attribute") + 1] == "defs"


def test_a_missing_module_a_missing_folder_and_a_taken_port_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no module named 'nowhere_to_be_found'"):
        location("nowhere_to_be_found", str(tmp_path), None, "127.0.0.1", 0)
    with pytest.raises(UsageError, match="is not a directory"):
        location("durable_assets.definitions", str(tmp_path / "gone"), None, "127.0.0.1", 0)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(UsageError, match="pick another --port"):
            location("durable_assets.definitions", None, None, "127.0.0.1", taken.getsockname()[1])


@contextmanager
def supervised_tiny_server(tmp_path: Path) -> Iterator[tuple[SupervisedCodeServer, int]]:
    """A supervised code server for an empty Definitions, started, with its server's pid.

    Both stop tests need the same live pair (a supervisor and its server in a group of their own)
    before each kills the supervisor its own way; the server is stopped whatever the test did.
    """
    (tmp_path / "tiny.py").write_text("import dagster as dg\n\ndefs = dg.Definitions()\n")
    logs = tmp_path / "logs"
    logs.mkdir()
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "home")}
    served = SupervisedCodeServer(env, logs, module="tiny", working_dir=tmp_path, location="tiny")
    try:
        served.start()
        assert served.supervisor is not None
        yield served, served.pid
    finally:
        served.stop()


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_stop_signal_stops_the_server_and_its_group_and_exits_128_plus_it(
    tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    with supervised_tiny_server(tmp_path) as (served, child):
        assert served.supervisor is not None
        assert os.getpgid(child) == child != served.supervisor.pid  # a group of its own
        os.kill(served.supervisor.pid, sig)
        assert served.supervisor.wait(timeout=30) == code, served.tail()
        assert not live_in_groups({child}), "the code server's group outlived its supervisor"
        assert f"stopped on {sig.name}" in served.supervisor.stderr
        # stdout is the workspace file and nothing else (the server's own output goes to stderr)
        workspace = yaml.safe_load(served.supervisor.stdout)
        assert workspace["load_from"][0]["grpc_server"]["port"] == served.port


@pytest.mark.slow
def test_a_sigkilled_supervisor_takes_its_server_with_it(tmp_path: Path) -> None:
    """A supervisor killed outright runs no code; its server must not go on holding the port (a
    restarted supervisor would be refused as "port in use"): the kernel's parent-death signal."""
    with supervised_tiny_server(tmp_path) as (served, child):
        assert served.supervisor is not None
        os.kill(served.supervisor.pid, signal.SIGKILL)
        wait_until(
            lambda: not live_in_groups({child}),
            timeout=30,
            interval=0.2,
            what="the code server to leave with its SIGKILLed supervisor",
            detail=lambda: "\n".join(live_in_groups({child})),
        )
        with socket.create_server(("127.0.0.1", served.port)):  # the port is free again
            pass
