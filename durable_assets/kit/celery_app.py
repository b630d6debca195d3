"""Our Celery app and its one task, on which a `job worker` and a run's orchestrator meet.

``acks_late`` and ``reject_on_worker_lost``, so a task whose worker is SIGKILLed goes back to the
queue instead of being lost; prefetch 1, so a worker never sits on tasks another could run; a 10 s
broker heartbeat, so a frozen worker's connection (and its unacknowledged task) is given up. The
task's body is :func:`durable_assets.kit.step_task.execute_step`.
"""

from __future__ import annotations

from functools import cache

from celery import Celery
from kombu import Queue

from durable_assets.kit.settings import DistributedSettings
from durable_assets.kit.step_task import execute_step

TASK_NAME = "durable_assets.execute_step"
#: RabbitMQ's heartbeat: a frozen worker's connection is closed (and its task redelivered) after ~2x this.
BROKER_HEARTBEAT_S = 10
#: The broker deletes an orchestrator's reply queue (the rpc backend's, where tasks' answers wait)
#: this long after its last use (``x-expires``, from Celery's ``result_expires``). Its auto-delete
#: never fires: the loop reads answers with ``basic_get`` and never consumes the queue, so before
#: this every orchestrator, ended or SIGKILLed, left its queue (and any answers in it) for an hour.
#: A live orchestrator uses it every tick while an answer is due, and each send declares it again;
#: one that has not looked for a minute (4x the 15 s run lease) has lost its batch to `job resume`.
#: A worker declares one too whenever a revoke reaches it (Celery reads the revoked task's state
#: through the backend); it goes the same way.
REPLY_QUEUE_EXPIRES_S = 60


class _DurableCelery(Celery):
    """Celery whose reply queues are named after the deployment's queue: ``<queue>.reply.<oid>``,
    so a person listing the broker's queues (or a test) sees whose each one is."""

    @property
    def thread_oid(self) -> str:
        # The rpc backend's reply queue and every sent task's ``reply_to`` (one per thread).
        return f"{self.conf.task_default_queue}.reply.{super().thread_oid}"


def make_app(broker_url: str, queue: str) -> Celery:
    """Our Celery app: one queue, late acks, redelivery of the tasks of a lost worker."""
    app = _DurableCelery("durable_assets", broker=broker_url, backend="rpc://")
    app.conf.update(
        task_queues=[Queue(queue, routing_key=queue)],
        task_default_queue=queue,
        task_default_routing_key=queue,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_track_started=False,
        worker_prefetch_multiplier=1,
        broker_heartbeat=BROKER_HEARTBEAT_S,
        broker_connection_retry_on_startup=True,
        # A worker that lost the broker gives its running tasks up: the broker redelivers them, and
        # the step lease makes the redelivered copy the current execution.
        worker_cancel_long_running_tasks_on_connection_loss=True,
        result_expires=REPLY_QUEUE_EXPIRES_S,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        worker_hijack_root_logger=False,
    )
    app.task(bind=True, name=TASK_NAME, acks_late=True, reject_on_worker_lost=True)(execute_step)
    return app


@cache
def app() -> Celery:
    """This process's app, its broker and queue read from the environment when first used.

    The kit's one read of distributed settings (tests/test_architecture.py lists it): a `job
    worker` and the orchestrator of a run are separate processes that must meet on the same broker
    and queue, and the broker URL carries a password, which must not travel in run or executor
    config (Dagster shows and stores both). Everything else reaches the executor through its config.
    """
    env = DistributedSettings.current()
    return make_app(env.broker_url, env.broker_queue)


def queue_of(celery: Celery) -> str:
    return str(celery.conf.task_default_queue)


def workers_answer(celery: Celery, queue: str) -> bool:
    """Whether a worker consumes ``queue`` (a plain ping is answered by every worker on the broker,
    including those of other queues, another deployment's or another test's, that never run ours).

    On AMQP (RabbitMQ) the broker answers: a passive declare of the queue returns its consumer count
    in one round trip (~10 ms), and a queue nobody declared yet has no worker. A broadcast
    ``inspect`` instead waits its whole timeout for replies that may still come: 1 s before every
    distributed run's first step, ~50 ms of each task of a small batch. Other transports count no
    consumers, so they keep the broadcast."""
    try:
        with celery.connection_for_read() as conn:
            if conn.transport.driver_type == "amqp":
                try:
                    declared = conn.default_channel.queue_declare(queue=queue, passive=True)
                except conn.channel_errors:  # not declared yet: no worker has consumed it
                    return False
                return int(declared.consumer_count) > 0
        replies = celery.control.inspect(timeout=1.0).active_queues() or {}
    except Exception:
        return False
    return any(q.get("name") == queue for queues in replies.values() for q in (queues or []))
