"""Slow tier: `job serve-location` brings a killed code server back by itself, and the daemon's
automatic resume finishes the batch with no command from anyone (#35 item 3).

tests/crash/test_user_job_auto_resume.py restarts the killed code server by hand, standing in for a
host's supervisor. Here the supervisor is the product's: the tutorial's five-step `greetings` location
(as printed in docs/your-own-job.md, with its checked input, pinned ceiling and report) is served
by `job serve-location`, `dagster dev` connects to it through the workspace it names, and a batch
launched the way the UI launches it loses its code server and run worker together (one SIGKILL to
the served process group) while greetings go out. The supervisor starts the server again, the
`auto_resume_lost_batches` sensor in it resumes the batch, and every named guest ends with exactly
one card, counted in the print shop's file.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from durable_assets.kit.tags import AUTO_RESUME_ATTEMPT_TAG, AUTO_RESUMED_BY_TAG
from tests.support.dagster_dev import SupervisedCodeServer
from tests.support.tutorial import shop_count

from .conftest import ServedTutorial
from .helpers import INTERRUPTED, instance_reader
from .lost_host import LostHost, postcards_served_by_a_daemon

pytestmark = pytest.mark.slow

CARDS = "SELECT count(*) FROM cards WHERE key LIKE 'greeting:%'"
#: DURABLE_TEST_REPEAT=5 runs the case 5 times in one session.
REPEAT = int(os.environ.get("DURABLE_TEST_REPEAT", "1"))


@pytest.mark.timeout(600)  # a loaded 2-core machine: most of it is four processes starting
@pytest.mark.parametrize("repeat", range(REPEAT), ids=lambda i: f"run{i + 1}")
def test_a_killed_code_server_comes_back_by_itself_and_its_batch_finishes(
    home: Path, served_tutorial: ServedTutorial, repeat: int
) -> None:
    batch, size = "greet-served", 400
    named = size - size // 10  # every tenth made-up guest has no name: held back at step 2
    folder, shop, logs = served_tutorial
    _, code, dev = postcards_served_by_a_daemon(home, folder, shop, logs, supervised=True, module="greetings")
    assert isinstance(code, SupervisedCodeServer)
    try:
        with instance_reader(home) as reader:
            host = LostHost(reader, dev, code, batch)
            # Without Dagster's own run retry: the supervisor has the location back within seconds,
            # before run monitoring fails the run, so Dagster's retry would otherwise race the sensor
            # for it (either finishes the batch once; this test pins the path the sensor is for).
            host.launch("greeting_batches", size, tags={"dagster/max_retries": "0"})
            host.wait_mid_effects(lambda: shop_count(shop, CARDS) >= 10, "cards from the worker")
            killed = code.pid
            host.kill()
            at_kill = shop_count(shop, CARDS)  # final for the first run: every writer is dead
            at_kill_status = reader.status(batch)
            code.wait_back(killed)
            back_s = time.monotonic() - host.killed_at
            failed_s = host.wait_failed_from_its_lease()
            done = host.finish(failed_s)
        print(
            f"\ncode server back {back_s:.1f} s after the kill (no command), run failed from its lease by "
            f"{failed_s:.1f} s, automatic resume at {done.resumed_s:.1f} s, kill to done "
            f"{done.succeeded_s:.1f} s; {at_kill} of {named} cards at the kill"
        )
        assert code.supervisor is not None
        restarts = [line for line in code.supervisor.stderr.splitlines() if "SIGKILL" in line]
        assert len(restarts) == 1 and f"pid {killed}" in restarts[0], code.tail()
        assert 0 < at_kill < named, at_kill
        assert at_kill_status is not None and at_kill_status["steps"][3]["status"] in INTERRUPTED
        assert len(done.lineage) == 2, done.lineage_story
        assert done.resumed.tags[AUTO_RESUME_ATTEMPT_TAG] == "1"
        assert done.failed.tags[AUTO_RESUMED_BY_TAG] == done.resumed.run_id
        assert [(s["status"], s["executions"]) for s in done.status["steps"]] == [
            *[("completed", 1)] * 3,
            ("completed", 2),
            ("completed", 1),
        ], done.status["steps"]
        # Exactly once, in the shop's own records: one card per named guest, none twice.
        assert shop_count(shop, CARDS) == named
        assert shop_count(shop, "SELECT count(DISTINCT recipient) FROM cards") == named
        assert named <= shop_count(shop, "SELECT count(*) FROM requests") <= named + at_kill + 4
    finally:
        dev.stop(grace_s=5)
        code.stop()
