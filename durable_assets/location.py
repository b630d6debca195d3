"""A code location's ``Definitions``: its durable jobs with everything that protects them.

The kit describes jobs and the operations layer serves them; a code location needs both, and the
daemon-side half (automatic resume of lost workers, terminal-status webhooks and their outbox, the
retention job and its schedule) only exists if the location registers it. Registering it by hand
was a step every new location forgot, leaving a UI-launched run whose worker died unresumed. So
this module, above both layers (it may import the kit and ``ops``; nothing imports it but code
locations), is the one way a location is built, ours (``durable_assets/definitions.py``) included:

    defs = definitions(durable_jobs, resources={"shop": PrintShop(...)})

Each part can be switched off (``auto_resume=False``, ``webhooks=False``, ``retention=False``);
the kit's ``ledger`` and ``runtime`` resources (and the distributed executor) are tuned by the
environment read here, once, where the location is wired: kit code reads no variable itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dagster import Definitions

from durable_assets.kit import DurableJobs
from durable_assets.kit.runtime import DistributedSettings, KitSettings, StorageSettings
from durable_assets.ops.auto_resume import auto_resume_sensor
from durable_assets.ops.registry import serve_built
from durable_assets.ops.retention import retention as retention_job
from durable_assets.ops.retention import retention_schedule
from durable_assets.ops.settings import AutoResumeSettings
from durable_assets.ops.webhooks.batch import webhook_sensors

__all__ = ["definitions"]


def definitions(
    durable_jobs: DurableJobs,
    *,
    resources: Mapping[str, Any] | None = None,
    jobs: Sequence[Any] = (),
    schedules: Sequence[Any] = (),
    sensors: Sequence[Any] = (),
    auto_resume: bool = True,
    webhooks: bool = True,
    retention: bool = True,
) -> Definitions:
    """The location's ``Definitions``: ``durable_jobs``, the daemon-side parts, and ``resources``
    over the kit's defaults. ``jobs``, ``schedules`` and ``sensors`` are the location's own others.

    - ``auto_resume``: the ``auto_resume_lost_batches`` sensor re-executes a batch whose worker
      was lost and whose Dagster retry was dropped (``DURABLE_AUTO_RESUME_*``);
    - ``webhooks``: run-status sensors and the ``webhook_outbox`` sensor (idle while
      ``DURABLE_WEBHOOK_URLS`` is unset);
    - ``retention``: the ``retention`` job and its daily ``retention_daily`` schedule.
    """
    serve_built(durable_jobs)
    return durable_jobs.definitions(
        resources=resources,
        settings=KitSettings.current(),
        distributed=DistributedSettings.current(),
        storage=StorageSettings.current(),
        jobs=[*([retention_job] if retention else []), *jobs],
        schedules=[*([retention_schedule] if retention else []), *schedules],
        sensors=[
            *(webhook_sensors(durable_jobs) if webhooks else []),
            *([auto_resume_sensor(AutoResumeSettings.from_env(), durable_jobs)] if auto_resume else []),
            *sensors,
        ],
    )
