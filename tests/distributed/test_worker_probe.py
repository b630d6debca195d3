"""Whether a worker consumes a deployment's queue, as the orchestrator asks before its first step.

Asked of RabbitMQ itself (a passive declare's consumer count), so a worker of another queue on
the same broker does not count, and no reply is waited for.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from kombu import Connection, Consumer, Queue

from durable_assets.kit.celery_app import make_app, workers_answer

from .conftest import BROKER_URL, broker_available, delete_queue


@pytest.fixture
def queue() -> Iterator[str]:
    if not broker_available():
        if os.environ.get("CI"):
            pytest.fail(
                f"RabbitMQ is not reachable at {BROKER_URL}; scripts/setup.sh --with-rabbitmq starts it"
            )
        pytest.skip("RabbitMQ not reachable")
    name = f"probe_{uuid.uuid4().hex[:8]}"
    yield name
    delete_queue(name)


def test_a_queue_nobody_declared_has_no_worker(queue: str) -> None:
    assert workers_answer(make_app(BROKER_URL, queue), queue) is False


def test_a_queue_has_a_worker_while_something_consumes_it_and_only_then(queue: str) -> None:
    celery = make_app(BROKER_URL, queue)
    other = f"{queue}_other"
    with Connection(BROKER_URL) as conn:
        declared = Queue(queue, routing_key=queue, channel=conn.default_channel)
        declared.declare()
        assert workers_answer(celery, queue) is False  # declared (a run sent to it), not consumed
        with Consumer(conn.channel(), [Queue(other, routing_key=other)]):
            assert workers_answer(celery, queue) is False  # another deployment's worker
        with Consumer(conn.channel(), [declared]):
            assert workers_answer(celery, queue) is True
    delete_queue(other)
    assert workers_answer(celery, queue) is False  # its consumer gone with its connection


def test_an_unreachable_broker_has_no_worker() -> None:
    celery = make_app("pyamqp://guest@127.0.0.1:1//", "nowhere")
    celery.conf.broker_connection_timeout = 1
    celery.conf.broker_connection_max_retries = 0
    assert workers_answer(celery, "nowhere") is False
