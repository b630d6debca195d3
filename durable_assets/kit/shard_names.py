"""How a shard's step key names its step: ``<step>__shard_<k>_of_<n>``.

Apart from :mod:`durable_assets.kit.sharding` (which builds the shard assets and imports pandas)
because readers only parse names: ``job status`` folds shard events into their step without
paying for pandas.
"""

from __future__ import annotations

import re

from durable_assets.kit.progress import ShardOf

_SHARD_NAME = re.compile(r"^(?P<step>.+)__shard_(?P<k>\d+)_of_(?P<n>\d+)$")


def shard_name(step: str, k: int, n: int) -> str:
    return f"{step}__shard_{k}_of_{n}"


def step_of_shard(step_key: str) -> str:
    """The user-facing step a Dagster step key belongs to (itself unless it is a shard)."""
    match = _SHARD_NAME.match(step_key)
    return match.group("step") if match else step_key


def shard_position(step_key: str) -> ShardOf | None:
    """Which shard of which step a Dagster step key is, or None for a step that is not a shard."""
    match = _SHARD_NAME.match(step_key)
    return ShardOf(match.group("step"), int(match.group("k")), int(match.group("n"))) if match else None
