"""A lease whose holder is a process of this host that no longer exists is taken over at once.

Why: after a SIGKILL on one machine, `job resume` (or the daemon) would otherwise refuse for a whole
lease TTL although the kernel can say the worker is gone. Only a definite answer counts: a frozen
process, another host, a reused pid or an owner of another form keep the lease until it lapses.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_assets.errors import LeaseHeldError
from durable_assets.kit.db import DurableDatabase
from durable_assets.kit.leases import LeaseStore, holder_is_gone, owner_of, owner_pid, process_owner
from tests.support.machine import scaled
from tests.support.polling import wait_until


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    yield proc
    proc.kill()
    proc.wait(scaled(10))


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_live_or_frozen_process_is_not_gone(child: subprocess.Popen[bytes]) -> None:
    owner = owner_of(child.pid)
    assert owner_pid(owner) == child.pid
    assert not holder_is_gone(owner)
    os.kill(child.pid, signal.SIGSTOP)
    wait_until(lambda: _state(child.pid) == "T", 10, what="the child to freeze")
    assert not holder_is_gone(owner), "a frozen worker may wake up and must keep its lease"


def test_a_killed_process_is_gone_reaped_or_not(child: subprocess.Popen[bytes]) -> None:
    owner = owner_of(child.pid)
    child.kill()
    wait_until(lambda: _state(child.pid) == "Z", 10, what="the child to become a zombie")
    assert holder_is_gone(owner), "a zombie runs nothing"
    child.wait(scaled(10))
    assert holder_is_gone(owner)


def test_a_reused_pid_is_told_apart_by_its_start_time(child: subprocess.Popen[bytes]) -> None:
    host, pid, incarnation = owner_of(child.pid).split(":")
    namespace, _, start = incarnation.partition(".")
    assert not holder_is_gone(f"{host}:{pid}:{namespace}.{start}")
    assert holder_is_gone(f"{host}:{pid}:{namespace}.{int(start) + 1}")


@pytest.mark.parametrize(
    "owner",
    ["host:1", "another-host:1:00000000.1", "worker-that-finished", "auto-resume@x:1/abc"],
)
def test_an_owner_this_host_cannot_judge_is_not_gone(owner: str) -> None:
    assert not holder_is_gone(owner)


def test_a_foreign_namespace_is_not_judged(child: subprocess.Popen[bytes]) -> None:
    _, pid, incarnation = owner_of(child.pid).split(":")
    child.kill()
    child.wait(scaled(10))
    start = incarnation.partition(".")[2]
    assert not holder_is_gone(f"{socket.gethostname()}:{pid}:ffffffff.{start}")


def test_acquire_takes_over_from_a_dead_holder_at_once(
    tmp_path: Path, child: subprocess.Popen[bytes]
) -> None:
    store = LeaseStore(DurableDatabase(f"sqlite:///{tmp_path / 'durable.db'}"), ttl_s=600)
    held = store.acquire("b", "dead-run", owner=owner_of(child.pid))
    with pytest.raises(LeaseHeldError):
        store.acquire("b", "new-run", owner=process_owner())
    child.kill()
    child.wait(scaled(10))
    taken = store.acquire("b", "new-run", owner=process_owner())
    assert (taken.run_id, taken.fence) == ("new-run", held.fence + 1)
    assert not store.renew(held), "the dead holder's fence is stale"
