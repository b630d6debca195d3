"""Scenario 5's second floor: the least a Dagster run of the refund job's shape costs.

The refund job's graph with no work in its steps: seven assets of one dynamic partition (a batch),
each reading the same upstream outputs as the refund job's step does (15 inputs in all) and handing
on a 1,000-row DataFrame through Dagster's filesystem IO manager; four partitioned asset checks (three
blocking) on the 4th and 5th assets with the refund checks' inputs; five configurable resources beside the IO
manager, required by the steps that require the refund job's. Run as ``job run`` runs a batch:
the partition added first, ``execute_job`` in process (``reconstructable``, run config with the
step's config and the console logger at WARNING), on the instance in ``DAGSTER_HOME``, with the
same garbage-collector treatment (off through the imports and the instance's open, then
``gc.freeze()``). What is left is what any Dagster job of that shape pays for imports, the
instance, the plan and its events before doing anything.

The IO manager is the kit's own (kit/io_manager.py DurableIOManager, on local storage as here:
Dagster's filesystem IO manager less its debug lines). It is the one piece of our code the floor
loads: a copy of it drifted from it unseen, and the floor is to pay for every output and input
exactly what the refund job's IO path pays, no more (no debug lines) and no less.

    python -c "from bench.dagster_floor import main; main()" BATCH_ID
"""

# No `from __future__ import annotations`: Dagster reads these annotations at definition time.
import gc

# As `job` does (durable_assets/ops/cli.py main): the imports build about a million objects and no
# garbage, and the cyclic collector would scan them over and over. Re-enabled, frozen, in main().
gc.disable()

import sys  # noqa: E402
import warnings  # noqa: E402
from typing import Any  # noqa: E402

import dagster as dg  # noqa: E402
import pandas as pd  # noqa: E402

from durable_assets.kit.io_manager import DurableIOManager  # noqa: E402

# Partitioned checks, as the refund job's (kit/reports.py batch_check), without their preview warning.
warnings.filterwarnings("ignore", message="Specifying a partitions_def on an AssetCheckSpec")
PARTITIONS = dg.DynamicPartitionsDefinition(name="floor_batches")
QUIET_LOGS: dict[str, Any] = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


class Source(dg.Config):
    path: str | None = None
    size: int = 1_000


class Runtime(dg.ConfigurableResource):
    lease_ttl_seconds: float = 30.0
    step_delay_seconds: float = 0.0


class Ledger(dg.ConfigurableResource):
    concurrency: int = 16
    rate_limit_per_second: float | None = None


class Payments(dg.ConfigurableResource):
    payments_url: str | None = None
    concurrency_limit: int = 16


class Mailbox(dg.ConfigurableResource):
    path: str | None = None


class Limits(dg.ConfigurableResource):
    max_refunds_per_batch: int = 10_000


def _frame() -> pd.DataFrame:
    return pd.DataFrame({"invoice": [f"INV-{i:07d}" for i in range(1_000)], "cents": range(1_000)})


# The refund job's graph (refunds/assets.py, refunds/checks.py), step for step.
@dg.asset(partitions_def=PARTITIONS)
def invoices(config: Source, runtime: Runtime, ledger: Ledger, payments: Payments) -> pd.DataFrame:
    return _frame()


@dg.asset(partitions_def=PARTITIONS)
def validated(invoices: pd.DataFrame, runtime: Runtime, ledger: Ledger) -> pd.DataFrame:
    return invoices


@dg.asset(partitions_def=PARTITIONS)
def candidates(validated: pd.DataFrame, runtime: Runtime, ledger: Ledger) -> pd.DataFrame:
    return validated


@dg.asset(partitions_def=PARTITIONS)
def issued(
    candidates: pd.DataFrame, runtime: Runtime, ledger: Ledger, payments: Payments, limits: Limits
) -> pd.DataFrame:
    return candidates


@dg.asset(partitions_def=PARTITIONS)
def reconciled(issued: pd.DataFrame, runtime: Runtime, ledger: Ledger, payments: Payments) -> pd.DataFrame:
    return issued


@dg.asset(partitions_def=PARTITIONS)
def notices(
    reconciled: pd.DataFrame, candidates: pd.DataFrame, runtime: Runtime, ledger: Ledger, mailbox: Mailbox
) -> pd.DataFrame:
    return reconciled


@dg.asset(partitions_def=PARTITIONS)
def report(
    notices: pd.DataFrame, reconciled: pd.DataFrame, validated: pd.DataFrame, runtime: Runtime, ledger: Ledger
) -> pd.DataFrame:
    return notices


def _check(asset: dg.AssetsDefinition, *, blocking: bool = False, reads: tuple[str, ...] = ()) -> Any:
    """A check partitioned like its asset and reading the batch's other frames by name, as the
    kit's ``batch_check`` makes the real job's."""
    return dg.asset_check(
        asset=asset,
        partitions_def=PARTITIONS,
        blocking=blocking,
        additional_ins={name: dg.AssetIn(name) for name in reads} or None,
    )


@_check(issued, blocking=True, reads=("candidates",))
def issued_match(issued: pd.DataFrame, candidates: pd.DataFrame) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(passed=True)


@_check(issued, blocking=True)
def issued_within_ceiling(issued: pd.DataFrame) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(passed=True)


@_check(reconciled, blocking=True, reads=("candidates",))
def reconciled_no_duplicates(reconciled: pd.DataFrame, candidates: pd.DataFrame) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(passed=True)


@_check(reconciled)
def reconciled_agrees(reconciled: pd.DataFrame) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(passed=True)


def floor_job() -> dg.JobDefinition:
    """Module-level factory, so ``reconstructable`` can rebuild it as ``job run`` rebuilds ours."""
    defs = dg.Definitions(
        assets=[invoices, validated, candidates, issued, reconciled, notices, report],
        asset_checks=[issued_match, issued_within_ceiling, reconciled_no_duplicates, reconciled_agrees],
        jobs=[
            dg.define_asset_job(
                "floor",
                selection=dg.AssetSelection.all(),
                partitions_def=PARTITIONS,
                executor_def=dg.in_process_executor,
            )
        ],
        resources={
            "io_manager": DurableIOManager(),
            "runtime": Runtime(),
            "ledger": Ledger(),
            "payments": Payments(),
            "mailbox": Mailbox(),
            "limits": Limits(),
        },
    )
    return defs.resolve_job_def("floor")


def main() -> None:
    batch_id = sys.argv[1]
    with dg.DagsterInstance.get() as instance:
        _ = (instance.run_storage, instance.event_log_storage, instance.schedule_storage)
        gc.freeze()  # as `job` does once its instance is open (ops/cli.py _collect_garbage_again)
        gc.enable()
        instance.add_dynamic_partitions(PARTITIONS.name, [batch_id])
        result = dg.execute_job(
            dg.reconstructable(floor_job),
            instance,
            run_config={"ops": {"invoices": {"config": {"size": 1_000}}}, **QUIET_LOGS},
            tags={"dagster/partition": batch_id, "bench": batch_id},
        )
    sys.exit(0 if result.success else 1)
