"""`job worker`: a Celery worker of our app on the configured queue."""

from __future__ import annotations

import logging
import os
import socket
import threading
from pathlib import Path
from typing import Any

from durable_assets.kit.celery_app import app, queue_of
from durable_assets.kit.dagster_internals import remember_config_schemas
from durable_assets.kit.db import (
    ConnectionBounds,
    bound_connections,
)
from durable_assets.kit.step_task import serve_from_home, warm_up


def run_worker(concurrency: int, connections: ConnectionBounds, home: Path | None = None) -> None:
    """`job worker`: a Celery worker of our app on the configured queue, until it is stopped.

    Prefork pool: each step runs in a child process, so one step's crash (or a superseded one's
    exit) takes no other step with it; a unique node name per process, so pings and revokes reach
    each worker on a host. Each child holds at most ``connections.most`` database connections (it
    runs one step at a time); the parent, which runs none, closes its own before the pool forks.
    ``home``: the worker's own instance folder (default: DAGSTER_HOME), which its tasks use when it
    holds their run.
    """
    from celery.signals import after_setup_logger, worker_process_init

    bound_connections(connections)
    # Before the pool forks, so every child inherits it: resources are built once per step.
    remember_config_schemas()
    if home is not None:
        serve_from_home(home)

    @after_setup_logger.connect(weak=False)
    def _quiet_results(logger: Any, **_kwargs: Any) -> None:
        # Celery logs every task's return value at INFO: here, a step's whole event list.
        logging.getLogger("celery.app.trace").setLevel(logging.WARNING)

    @worker_process_init.connect(weak=False)
    def _warm_up_child(**_kwargs: Any) -> None:
        # In a thread: the pool gives a child 4 s (worker_proc_alive_timeout) to finish its init.
        threading.Thread(target=warm_up, name="durable-warm-up", daemon=True).start()

    celery = app()
    argv = [
        "worker",
        f"--concurrency={concurrency}",
        "--pool=prefork",
        f"--queues={queue_of(celery)}",
        f"--hostname=durable-{os.getpid()}@{socket.gethostname()}",
        "--without-gossip",
        "--without-mingle",
        "--loglevel=INFO",
    ]
    celery.worker_main(argv)
