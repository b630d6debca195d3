"""Where the operations layer finds the durable jobs: the code location's :class:`DurableJobs`.

The location is a module with a ``durable_jobs`` attribute (``durable_assets.definitions`` unless
``DURABLE_CODE_LOCATION`` names another), the same module Dagster loads (``workspace.yaml``). A
user's own location registers its jobs there and every command serves them, with no change here.
Runs are rebuilt in any process through :func:`job_definition`, a module-level function that
``build_reconstructable_job`` can name.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
from collections.abc import Sequence
from functools import cache

from dagster import DagsterRun, JobDefinition, build_reconstructable_job

from durable_assets.errors import UnknownJobError, UsageError
from durable_assets.kit import DurableJob, DurableJobs
from durable_assets.kit.runtime import (
    BATCH_TAG,
    DEFAULT_SHARDS,
    EXECUTOR_TAG,
    SHARD_SCHEME_TAG,
    SHARDS_TAG,
    ExecutorKind,
    ReconstructableJob,
)
from durable_assets.settings import InstanceSettings

_log = logging.getLogger(__name__)

CODE_LOCATION_ENV = "DURABLE_CODE_LOCATION"


#: The location this process built (``definitions(...)`` in its module), served when
#: ``DURABLE_CODE_LOCATION`` names none: kept here, not written into the environment.
_built: str | None = None


def serve_built(jobs: DurableJobs) -> None:
    """A process that builds a location (``dagster dev -m postcards``, the daemon's code server, a
    run worker it launches) serves it to the operations layer too: the sensors' status reads and
    the retention job find these jobs, not the default's.

    The location is the module that holds ``jobs`` as its ``durable_jobs`` (what :func:`_load`
    imports again in any other process). Jobs that no module holds so (a test's, a script's
    ``__main__``) change nothing. A location that imports another (greetings.py uses postcards.py's
    shop) is built last, so it wins over the one it imported.
    """
    global _built
    default = InstanceSettings.model_fields["code_location"].default
    for name, module in list(sys.modules.items()):
        if name in ("__main__", default):
            continue
        if getattr(module, "__dict__", {}).get("durable_jobs") is jobs:  # no module __getattr__ runs
            _built = name
            return


def code_location() -> str:
    """``DURABLE_CODE_LOCATION`` if it names one, else the location this process built, else ours."""
    configured = InstanceSettings.current().code_location
    if _built is not None and configured == InstanceSettings.model_fields["code_location"].default:
        return _built
    return configured


def _importable_from_here() -> None:
    """As `python -m` and `dagster -m` do: a module in the current directory is importable, so a
    location in the folder the command runs in needs no PYTHONPATH."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def check_code_location() -> None:
    """A command that never imports the location (``status``, ``list``) still refuses one named by
    ``DURABLE_CODE_LOCATION`` that does not exist, without importing it: a setting silently ignored
    by one command and fatal to the next is a trap. Only the module's top-level package is looked
    up (finding a dotted name would import its parents)."""
    module = code_location()
    if module == InstanceSettings().code_location:
        return  # the declared default: ours, installed with the command
    _importable_from_here()
    top = module.split(".", 1)[0]
    try:
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError) as exc:
        found, why = None, str(exc)
    else:
        why = f"no module named {top!r} on the path or in {os.getcwd()}"
    if found is None:
        raise UsageError(
            f"cannot find the code location {module!r} ({CODE_LOCATION_ENV}): {why}; run in the folder "
            f"that holds it, or set {CODE_LOCATION_ENV} to the module that defines `durable_jobs`"
        )


@cache
def _load(module: str) -> DurableJobs:
    _importable_from_here()
    try:
        jobs = getattr(importlib.import_module(module), "durable_jobs", None)
    except ImportError as exc:
        raise UsageError(f"cannot import the code location {module!r} ({CODE_LOCATION_ENV}): {exc}") from exc
    if not isinstance(jobs, DurableJobs):
        raise UsageError(
            f"the code location {module!r} ({CODE_LOCATION_ENV}) has no `durable_jobs = DurableJobs([...])`"
        )
    return jobs


def durable_jobs() -> DurableJobs:
    """The registered jobs of this process's code location."""
    return _load(code_location())


def job_definition(module: str, name: str) -> JobDefinition:
    """The resolved Dagster job ``name`` of ``module``'s location (the reconstructable target)."""
    return _load(module).job_definition(name)


def distributed_job_definition(module: str, name: str, shards: int) -> JobDefinition:
    """Job ``name`` of ``module``'s location for the distributed executor, with ``shards`` shards."""
    return _load(module).distributed_job_definition(name, shards)


def prepare_distributed_jobs(shards: int = DEFAULT_SHARDS) -> None:
    """Build every job's distributed definition for ``shards`` shards and plan it once, in this process.

    `job worker` calls it before its pool forks, so each child inherits the definitions and the
    caches a first plan fills instead of building them in its first task (~0.1 s on a quiet
    machine). With one fresh child per shard, that child started its shard last and the sharded
    step waited for it. Other shard counts are still built by the first task that needs them. Best
    effort: what fails here fails again, and is reported, in that task.
    """
    from durable_assets.kit.runtime import create_execution_plan

    module = code_location()
    for job in durable_jobs():
        try:
            create_execution_plan(distributed_job_definition(module, job.name, shards), {})
        except Exception as error:  # the task that needs the job builds it again and says why
            _log.debug("could not prepare %s with %d shards before forking: %s", job.name, shards, error)


def reconstructable_job(job: DurableJob, shards: int | None = None) -> ReconstructableJob:
    """The job a run of ``job`` executes: in process, or (``shards`` given) distributed and sharded.

    Workers rebuild it from this pointer, so both sides build the same plan from one descriptor.
    """
    if shards is not None:
        return build_reconstructable_job(
            "durable_assets.ops.registry",
            "distributed_job_definition",
            reconstructable_args=(code_location(), job.name, shards),  # type: ignore[arg-type]
        )
    return build_reconstructable_job(
        "durable_assets.ops.registry",
        "job_definition",
        reconstructable_args=(code_location(), job.name),  # type: ignore[arg-type]  # any picklable tuple
    )


def shards_of_runs(runs: Sequence[DagsterRun]) -> int | None:
    """How many shards a distributed batch's lineage runs with (None: its plan is the location's job,
    run in process or, launched from the UI or a schedule, one Celery task per step)."""
    if not runs or runs[0].tags.get(EXECUTOR_TAG) != ExecutorKind.CELERY.value:
        return None
    shards = runs[0].tags.get(SHARDS_TAG)
    return int(shards) if shards is not None else None


def executor_tags_of_runs(runs: Sequence[DagsterRun]) -> dict[str, str]:
    """The executor tags a resume of the lineage carries: its first run's, so it runs as that did
    (shards read their split from the first run itself: ``kit.sharding.scheme_of_batch``)."""
    first = runs[0].tags if runs else {}
    tags = {k: first[k] for k in (EXECUTOR_TAG, SHARDS_TAG, SHARD_SCHEME_TAG) if k in first}
    if SHARDS_TAG in tags and SHARD_SCHEME_TAG not in tags:
        # Sharded before the split had a tag: its shards split by CRC-32, and the resume's run says
        # so in the UI instead of the deployed job's default.
        from durable_assets.kit.runtime import UNTAGGED_SCHEME

        tags[SHARD_SCHEME_TAG] = UNTAGGED_SCHEME.value
    return tags


def job_of_runs(runs: Sequence[DagsterRun]) -> DurableJob:
    """The durable job a batch's lineage belongs to (its first run's job).

    A batch of a job this code location does not register (another location's, or a job since
    removed) is a usage error naming the job, not a status folded over some other job's steps.
    """
    jobs = durable_jobs()
    if not runs:
        return jobs.default
    job = jobs.owning(runs[0].job_name)
    if job is None:
        raise UnknownJobError(
            f"batch {runs[0].tags.get(BATCH_TAG, '?')!r} is a batch of job {runs[0].job_name!r}, which the "
            f"code location {code_location()!r} does not register; set {CODE_LOCATION_ENV} to the module "
            "that does"
        )
    return job
