"""Scenario 5's second floor: the least a Dagster run of the refund job's shape costs.

Seven assets in a chain, each handing the next a 1,000-row DataFrame through Dagster's filesystem IO
manager, and four asset checks: the refund job's eleven steps with no work in them, executed in
process (``execute_job``, as ``job run`` does) on the instance in ``DAGSTER_HOME``. Its process
start to exit is what any Dagster job of that shape pays for imports, the instance, the plan and
its ~150 events, before doing anything; the import floor (``import dagster, pandas``) leaves all of
that out.

    python -c "from bench.dagster_floor import main; main()" RUN_NAME
"""

from __future__ import annotations

import sys
import tempfile

import dagster as dg
import pandas as pd

STEPS = 7
CHECKED = (3, 4, 4, 6)  # the refund job's four checks sit on its 4th, 5th and 6th assets


def _chain() -> list[dg.AssetsDefinition]:
    def first() -> pd.DataFrame:
        return pd.DataFrame({"invoice": [f"INV-{i:07d}" for i in range(1_000)], "cents": range(1_000)})

    assets = [dg.asset(name="a1")(first)]
    for n in range(2, STEPS + 1):

        def passed_on(up: pd.DataFrame) -> pd.DataFrame:
            return up

        assets.append(dg.asset(name=f"a{n}", ins={"up": dg.AssetIn(assets[-1].key)})(passed_on))
    return assets


def _checks(assets: list[dg.AssetsDefinition]) -> list[dg.AssetChecksDefinition]:
    def check(n: int, i: int) -> dg.AssetChecksDefinition:
        @dg.asset_check(asset=assets[i].key, name=f"check_{n}", blocking=True)
        def _check() -> dg.AssetCheckResult:
            return dg.AssetCheckResult(passed=True)

        return _check

    return [check(n, i) for n, i in enumerate(CHECKED)]


def floor_job() -> dg.JobDefinition:
    """Module-level factory, so ``reconstructable`` can rebuild it as ``job run`` rebuilds ours."""
    assets = _chain()
    defs = dg.Definitions(
        assets=assets,
        asset_checks=_checks(assets),
        jobs=[
            dg.define_asset_job(
                "floor", selection=dg.AssetSelection.all(), executor_def=dg.in_process_executor
            )
        ],
        resources={"io_manager": dg.FilesystemIOManager(base_dir=tempfile.mkdtemp(prefix="floor-"))},
    )
    return defs.resolve_job_def("floor")


def main() -> None:
    with dg.DagsterInstance.get() as instance:
        result = dg.execute_job(dg.reconstructable(floor_job), instance, tags={"bench": sys.argv[1]})
    sys.exit(0 if result.success else 1)
