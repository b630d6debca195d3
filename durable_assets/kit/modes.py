"""How a batch runs: the executor kinds (no heavy imports; their run tags are in kit/tags.py).

Kept apart from :mod:`durable_assets.kit.distributed` (Celery, Dagster's executor machinery) so the
CLI can offer ``--executor``/``--shards`` and the status code can read a run's mode without loading
either.
"""

from __future__ import annotations

import enum

#: Default shards per sharded step, and the most (one worker slot each; beyond this the merge and
#: the per-task overhead outweigh what another shard adds on one broker).
DEFAULT_SHARDS = 4
MAX_SHARDS = 64


class ExecutorKind(enum.StrEnum):
    """Where a batch's steps run."""

    IN_PROCESS = "in_process"  # the `job run` / `job resume` process runs every step (the default)
    CELERY = "celery"  # `job worker`s run them as Celery tasks; that process orchestrates
