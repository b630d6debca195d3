"""What `job worker` builds before its pool forks, and what a resume copies from a batch's first run."""

from __future__ import annotations

import uuid

from dagster import DagsterRun

from durable_assets.kit.runtime import DEFAULT_SHARDS, EXECUTOR_TAG, SHARD_SCHEME_TAG, SHARDS_TAG
from durable_assets.ops import registry


def test_every_job_is_ready_for_the_default_shard_count_before_a_worker_forks() -> None:
    """The children inherit these objects: their first task reuses them instead of building them."""
    registry.prepare_distributed_jobs()
    module = registry.code_location()
    for job in registry.durable_jobs():
        prepared = registry.distributed_job_definition(module, job.name, DEFAULT_SHARDS)
        assert registry.distributed_job_definition(module, job.name, DEFAULT_SHARDS) is prepared
        assert prepared.tags[SHARD_SCHEME_TAG] == "balanced"


def test_a_resume_carries_its_first_runs_executor_shards_and_split() -> None:
    def run(tags: dict[str, str]) -> DagsterRun:
        return DagsterRun(job_name="refund_batch", run_id=str(uuid.uuid4()), tags=tags)

    first = {EXECUTOR_TAG: "celery", SHARDS_TAG: "3", SHARD_SCHEME_TAG: "crc32"}
    later = {EXECUTOR_TAG: "celery", SHARDS_TAG: "3", SHARD_SCHEME_TAG: "balanced"}
    assert registry.executor_tags_of_runs([run(first), run(later)]) == first
    # Sharded before the split had a tag: its shards split by CRC-32 (kit.sharding.scheme_of_batch),
    # and the resume's run is tagged so, not with the deployed job's default.
    before_the_split_tag = {EXECUTOR_TAG: "celery", SHARDS_TAG: "3"}
    assert registry.executor_tags_of_runs([run(before_the_split_tag)]) == {
        **before_the_split_tag,
        SHARD_SCHEME_TAG: "crc32",
    }
    in_process = {EXECUTOR_TAG: "in_process"}
    assert registry.executor_tags_of_runs([run(in_process)]) == in_process
