"""Asset checks of a batch's outcome: partitioned like their step, with examples a person can follow.

Why a kit module: a check of a durable step must be partitioned like the step, or it would read
every batch's frame instead of this one's, and it reports what it found as counts plus a few
examples. Every pipeline wrote that scaffolding itself; here it is once.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

from dagster import (
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetIn,
    AssetsDefinition,
    MetadataValue,
    PartitionsDefinition,
    PreviewWarning,
    asset_check,
)

#: Examples listed in a check's metadata: enough to start an investigation, never the whole batch.
EXAMPLES: Final = 10


def batch_check(
    *,
    asset: AssetsDefinition,
    partitions_def: PartitionsDefinition,
    blocking: bool = False,
    reads: Sequence[str] = (),
) -> Callable[[Callable[..., AssetCheckResult]], AssetChecksDefinition]:
    """Dagster's ``asset_check`` on ``asset``, partitioned like it, so it checks one batch's frame.

    ``reads`` names other steps whose frames (of the same batch) the check takes as arguments of
    the same names. ``blocking`` stops the batch's run when the check fails, before any later step.
    Dagster marks a partitioned check as preview; its warning would print on every ``job`` command,
    so it is silenced here, once, where such checks are made.
    """
    warnings.filterwarnings(
        "ignore", message="Specifying a partitions_def on an AssetCheckSpec", category=PreviewWarning
    )
    return asset_check(
        asset=asset,
        partitions_def=partitions_def,
        blocking=blocking,
        additional_ins={name: AssetIn(name) for name in reads} or None,
    )


def check_examples(values: Iterable[Any]) -> MetadataValue:
    """The first :data:`EXAMPLES` of ``values`` as text, for a check's metadata (JSON)."""
    return MetadataValue.json([str(v) for v in list(values)[:EXAMPLES]])


def check_result(problems: Sequence[str], metadata: dict[str, Any]) -> AssetCheckResult:
    """A check that fails (ERROR) for any problem: their count, the first as ``examples``, then
    ``metadata``. For checks whose every finding is a problem of the same weight."""
    if problems:
        metadata["examples"] = check_examples(problems)
    return AssetCheckResult(
        passed=not problems,
        severity=AssetCheckSeverity.ERROR,
        metadata={"problems": len(problems), **metadata},
    )
