"""One module per scenario, each with ``run(size, workdir) -> Result``; numbered as in issue #8."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from bench.harness import Result, Size

Scenario = Callable[[Size, Path], Result]


def registry() -> dict[int, tuple[str, str]]:
    """Scenario number -> (module under bench.scenarios, short name); imported lazily when run."""
    return {
        1: ("throughput", "refund throughput at a provider limit"),
        2: ("ledger_overhead", "ledger overhead"),
        3: ("resume_cost", "resume cost after SIGKILL"),
        4: ("detection", "dead-worker detection"),
        5: ("batch_overhead", "per-batch overhead"),
        6: ("scale", "scale: load, validate, candidates"),
        7: ("pruning", "pruning old runs"),
        8: ("adaptive_pacing", "provider limit learned with no client setting"),
        9: ("credit_migration", "credit migration at the provider's limit, and the next night"),
        10: ("distributed", "distributed refunds: 1, 2, 4 workers, a shared limit, task overhead"),
        11: ("cli_latency", "`job` commands against the import floor"),
        12: ("provider_bound", "a provider-bound batch against its request floor"),
    }
