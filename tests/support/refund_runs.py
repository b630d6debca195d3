"""A refund batch materialized in process, whole or in two halves around the refund step.

Halves let a test change the provider between the refunds and what reads them back (a second
refund paid behind our back, a listing that lies) and count what the second half asked for.
"""

from __future__ import annotations

from typing import Any

from dagster import AssetSelection, DagsterInstance, ExecuteInProcessResult, materialize

from durable_assets.definitions import defs
from durable_assets.kit.tags import BATCH_TAG
from durable_assets.refunds.assets import ALL_ASSETS, BATCHES, issued_refunds
from durable_assets.refunds.checks import ALL_CHECKS

#: Everything up to the refunds at the provider, the checks of those steps included.
UP_TO_REFUNDS = AssetSelection.assets(issued_refunds).upstream()
#: The rest: reconciliation, its checks, the notices and the report.
AFTER_REFUNDS = AssetSelection.all() - UP_TO_REFUNDS


def run_refunds(
    instance: DagsterInstance,
    batch: str,
    selection: AssetSelection | None = None,
    *,
    size: int | None = 200,
    **resources: Any,
) -> ExecuteInProcessResult:
    """Materialize ``selection`` (default: every step and check) of synthetic batch ``batch``.

    ``size`` configures the first step; pass ``None`` for a selection without it (Dagster refuses
    config for a step it does not run). ``resources`` replace the code location's (e.g. ``payments``).
    """
    instance.add_dynamic_partitions(BATCHES.name or "batches", [batch])
    return materialize(
        [*ALL_ASSETS, *ALL_CHECKS],
        selection=selection,
        instance=instance,
        partition_key=batch,
        resources={**defs.resources, **resources},
        run_config={"ops": {"invoices": {"config": {"size": size}}}} if size is not None else None,
        tags={BATCH_TAG: batch},
        raise_on_error=False,
    )


def materialized(result: ExecuteInProcessResult) -> set[str]:
    """The steps of ``result`` that stored an output."""
    return {m.asset_key.path[-1] for m in result.get_asset_materialization_events()}
