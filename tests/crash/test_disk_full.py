"""A full disk under the instance (#23): a real, small tmpfs as ``DAGSTER_HOME``, filled while a batch
issues refunds.

The batch must end with the one documented line and exit 1, ``job status`` must answer while the
disk is still full (reading needs no new file), and once space is freed ``job resume`` finishes with
every refund and notice exactly once, counted at the simulator (outside the tmpfs) and the mailbox.
"""

from __future__ import annotations

import errno
import json
import re
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.homes import make_home
from tests.support.polling import wait_until

from .helpers import (
    EXIT_FAILED,
    EXIT_OK,
    Expected,
    JobProcess,
    Simulator,
    assert_batch_complete,
    assert_refunded_exactly_once,
    instance_reader,
    job,
    job_env,
    notices_for,
    resume_until_accepted,
)

pytestmark = pytest.mark.slow

#: Room for the instance's SQLite files and a few hundred refunds' events, little more.
TMPFS_SIZE = "48m"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of its own, unmounted after the test (lazily, should a child still hold a file)."""
    mount_point = tmp_path / f"disk-{uuid.uuid4().hex[:8]}"
    mount_point.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill (needs root or CAP_SYS_ADMIN): {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill(path: Path) -> int:
    """Write ``path`` until the filesystem refuses another byte; the bytes written."""
    written = 0
    chunk = b"\0" * 65536
    with open(path, "wb", buffering=0) as f:
        while True:
            try:
                written += f.write(chunk) or 0
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                break
    for size in (4096, 1):  # and whatever is left of the last pages
        try:
            with open(path, "ab", buffering=0) as f:
                while True:
                    written += f.write(b"\0" * size) or 0
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    return written


def test_disk_full_mid_refunds_then_resume(
    small_disk: Path, tmp_path: Path, simulator: Callable[..., Simulator]
) -> None:
    batch, size = "disk-full", 1000
    expected = Expected.of(batch, size)
    k = expected.n // 3
    home = make_home(small_disk)
    sim = simulator()
    env = job_env(home, payments_url=sim.url, DURABLE_CONCURRENCY=2)

    worker = JobProcess(["run", "--id", batch, "--size", str(size)], env, tmp_path)
    wait_until(
        lambda: sim.stats()["refund_requests"] > 0 or worker.proc.poll() is not None,
        timeout=180,
        interval=0.02,
        what="the refund step's first request",
    )
    sim.configure(latency_ms=50)  # slow refunds only: the disk fills while they are issued
    wait_until(
        lambda: sim.stats()["refunds_created"] >= k or worker.proc.poll() is not None,
        timeout=180,
        interval=0.02,
        what=f"{k} refunds at the provider",
    )
    assert worker.proc.poll() is None, f"the batch ended before the disk was filled\n{worker.tail()}"
    filler = small_disk / "filler"
    assert fill(filler) > 0
    assert sim.stats()["refunds_created"] < expected.n, "the disk filled after the refunds were all issued"
    worker.wait(120)

    err = worker.err_path.read_text() if worker.err_path else ""
    last = err.strip().splitlines()[-1]
    assert worker.proc.returncode == EXIT_FAILED, worker.tail()
    assert re.fullmatch(
        rf"error: batch {batch} failed at step 4: disk full \({re.escape(str(home))}[^)]*\); "
        rf"free space and run job resume --id {batch}",
        last,
    ), last

    status = job(["status", "--id", batch, "--json"], env, tmp_path)  # the disk is still full
    assert status.proc.returncode == EXIT_OK, status.tail()
    state = json.loads(status.stdout)
    assert [s["status"] for s in state["steps"][:3]] == ["completed"] * 3, state["steps"]
    assert state["steps"][3]["status"] != "completed", state["steps"]
    listed = job(["list"], env, tmp_path)
    assert listed.proc.returncode == EXIT_OK and batch in listed.stdout, listed.tail()

    filler.unlink()
    sim.configure(latency_ms=0)
    with instance_reader(home) as reader:
        attempts = resume_until_accepted(batch, env, tmp_path, reader)
    assert attempts[-1].proc.returncode == EXIT_OK, attempts[-1].tail()

    done = job(["status", "--id", batch, "--json"], env, tmp_path)
    assert_batch_complete(json.loads(done.stdout), home, batch)
    assert_refunded_exactly_once(sim.refunds(), expected)
    assert sim.stats()["refunds_created"] == expected.n
    assert notices_for(home, expected) == expected.n
