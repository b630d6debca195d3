"""What an orchestrator leaves in RabbitMQ: nothing, about a minute after it is gone.

Tasks answer on the orchestrator's reply queue (Celery's rpc backend), named
``<DURABLE_BROKER_QUEUE>.reply.<oid>``. The orchestrator reads it with ``basic_get`` and never
consumes it, so its auto-delete never fires: the queue goes when it has been unused for
``REPLY_QUEUE_EXPIRES_S`` (``x-expires``). Before, that was Celery's one hour, for a SIGKILLed
orchestrator and a finished one alike, with the answers that arrived after a kill still in it.
A worker declares one too, each time a revoke reaches it (Celery reads the task's state through
the backend), and revokes are broadcast to every worker on the broker, other deployments' too:
so the workers are stopped before the wait, and their queues must go the same way.

The broker is asked through ``rabbitmqctl`` (an admin's read): a passive declare, the one way a
client can ask whether a queue exists, counts as a use and would keep the queue alive.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess

import pytest

from durable_assets.kit.celery_app import REPLY_QUEUE_EXPIRES_S
from tests.crash.helpers import InstanceReader
from tests.support.machine import scaled
from tests.support.polling import wait_until

from .conftest import Cluster
from .test_worker_loss import a_batch_mid_shard, resumed_exactly

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


def broker_queues() -> dict[str, dict[str, object]]:
    """Every queue on the broker's default vhost with its ``x-`` arguments, read by ``rabbitmqctl``."""
    ctl = shutil.which("rabbitmqctl")
    if ctl is None:
        pytest.skip("rabbitmqctl is not installed (scripts/setup.sh --with-rabbitmq installs it)")
    listed = subprocess.run(
        [ctl, "-q", "list_queues", "--no-table-headers", "name", "arguments"],
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    if listed.returncode != 0:
        pytest.skip(f"rabbitmqctl cannot list queues here (run as root?): {listed.stderr.strip()[:200]}")
    queues: dict[str, dict[str, object]] = {}
    for line in listed.stdout.splitlines():
        name, _, arguments = line.partition("\t")
        # Erlang's ``[{"x-expires",60000}]``: a list of pairs, read as Python once braces are brackets.
        pairs = ast.literal_eval(arguments.replace("{", "(").replace("}", ")") or "[]")
        queues[name] = dict(pairs)
    return queues


def reply_queues(cluster: Cluster) -> dict[str, dict[str, object]]:
    prefix = f"{cluster.queue}.reply."
    return {name: args for name, args in broker_queues().items() if name.startswith(prefix)}


def test_reply_queues_go_a_minute_after_a_sigkilled_orchestrator(
    cluster: Cluster, reader: InstanceReader
) -> None:
    batch_id = "dist-reply-queues"
    run, _ = a_batch_mid_shard(cluster, reader, batch_id)
    at_kill = reply_queues(cluster)  # the orchestrator's, declared before its first task was sent
    assert at_kill, "no reply queue named after the deployment's queue"
    assert {n: a.get("x-expires") for n, a in at_kill.items()} == dict.fromkeys(
        at_kill, REPLY_QUEUE_EXPIRES_S * 1000
    ), at_kill
    run.sigkill()
    # A live orchestrator (the resume) gets its answers, on a reply queue of its own.
    resumed_exactly(cluster, reader, batch_id)
    for worker in cluster.live_workers():
        cluster.kill_worker(worker)
    # The killed orchestrator's queue, the finished resume's and the workers' go once unused for
    # the expiry; rabbitmqctl takes seconds a call on a busy machine, hence the slow poll.
    wait_until(
        lambda: not reply_queues(cluster),
        timeout=REPLY_QUEUE_EXPIRES_S + 60,
        interval=2.0,
        what=f"the deployment's reply queues ({', '.join(at_kill)} and later ones) to be deleted",
        detail=lambda: json.dumps(reply_queues(cluster)),
    )
