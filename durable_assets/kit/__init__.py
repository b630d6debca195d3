"""The durability kit: what makes a Dagster asset job durable. A job author imports from here.

This is the kit's author face: the names a job is written against (``docs/your-own-job.md``
walks through a whole job), with two named submodules for what a batch reads and reports.

- Describe the job: :class:`DurableJob` (steps, partitions, input config, summary) registered in
  the code location's :class:`DurableJobs`; :func:`durable_asset` for each step; its input is
  :class:`BatchInput`, read with :func:`batch_input`; :class:`DailyBatches` for a schedule.
- Inside steps: :func:`effect_runner` sends each :class:`Intent` exactly once (each kept as a
  :class:`LedgerEntry`; the run's :class:`EffectReport` says what happened); :class:`BatchRuntime`
  holds the lease, checks cancel and fence; :func:`report_progress` reports progress of a step
  without effects; :func:`frame_result` returns a frame with its row count and data version.
- Effects at a provider: ``effect_runner(..., provider=resource)`` takes its pace and account from
  a :class:`PacedProvider`; reads go through :func:`paced_map` (or :func:`call_with_retries` with
  a :func:`shared_limiter`); :func:`answer_mismatches` and ``review_note(subject_taken=...)`` word
  what is held for review.
- Guardrails: subclass :class:`Guardrails` for a batch's ceilings (:func:`count_ceiling`,
  :func:`amount_ceiling`); their values are pinned with the batch at its first run and every
  later run of it uses them.
- A person's word on a held item: a job declares the decisions it honours
  (``DurableJob(decisions=...)``), ``job decide`` records one, and a step reads those in force with
  :func:`decisions_for` (each an :class:`ItemDecision`) before it holds or moves that item again.
- Tables of your own: :class:`Migrations` versions them with Alembic (your revisions, your version
  table), as the kit versions its own; :func:`enable_wal` switches a SQLite file of your own to
  WAL even while other processes are opening it.
- ``kit.tables``: read a CSV or Parquet file as text, check rows and keep the reasons, type a frame.
- ``kit.reports``: the files a batch writes for people, its summary lines, checks of its outcome.
- ``kit.errors``: the one exception hierarchy. A step raises ``kit.errors.TransientProviderError``
  for a fault worth retrying with the same key, ``ProviderRejectedError`` for one that is not,
  ``GuardrailError`` for a batch over its ceiling.

The operations layer and the provider adapter build on a second, declared face,
``durable_assets.kit.runtime``; a job author never needs it. Every other kit module is private.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from durable_assets.kit._lazy import lazy_names

# The imports below declare the face for mypy and readers; nothing here uses them, and
# test_architecture keeps them equal to _SOURCES, the table the interpreter reads.
# ruff: noqa: F401
if TYPE_CHECKING:  # what mypy and readers see; at run time each name is imported on first use
    from durable_assets import errors
    from durable_assets.kit import reports, tables
    from durable_assets.kit.decisions import ItemDecision, decisions_for
    from durable_assets.kit.effects import EffectReport, answer_mismatches, review_note
    from durable_assets.kit.guardrails import Guardrails, amount_ceiling, count_ceiling
    from durable_assets.kit.job import BatchInput, DurableJob, DurableJobs
    from durable_assets.kit.ledger import Intent, LedgerEntry
    from durable_assets.kit.pacing import PacedProvider, call_with_retries, paced_map, shared_limiter
    from durable_assets.kit.resources import BatchRuntime
    from durable_assets.kit.schedules import DailyBatches
    from durable_assets.kit.schema_migrations import Migrations
    from durable_assets.kit.sqlite_wal import enable_wal
    from durable_assets.kit.steps import (
        batch_input,
        durable_asset,
        effect_runner,
        frame_result,
        report_progress,
    )

#: Where each name of the author face lives (kept equal to the imports above by test_architecture).
_SOURCES: dict[str, tuple[str, ...]] = {
    "durable_assets.kit.decisions": ("ItemDecision", "decisions_for"),
    "durable_assets.kit.effects": ("EffectReport", "answer_mismatches", "review_note"),
    "durable_assets.kit.guardrails": ("Guardrails", "amount_ceiling", "count_ceiling"),
    "durable_assets.kit.job": ("BatchInput", "DurableJob", "DurableJobs"),
    "durable_assets.kit.ledger": ("Intent", "LedgerEntry"),
    "durable_assets.kit.pacing": ("PacedProvider", "call_with_retries", "paced_map", "shared_limiter"),
    "durable_assets.kit.resources": ("BatchRuntime",),
    "durable_assets.kit.schedules": ("DailyBatches",),
    "durable_assets.kit.schema_migrations": ("Migrations",),
    "durable_assets.kit.sqlite_wal": ("enable_wal",),
    "durable_assets.kit.steps": (
        "batch_input",
        "durable_asset",
        "effect_runner",
        "frame_result",
        "report_progress",
    ),
}
#: Whole modules the author face offers by name.
_MODULES = {
    "errors": "durable_assets.errors",
    "reports": "durable_assets.kit.reports",
    "tables": "durable_assets.kit.tables",
}

__all__, __getattr__, __dir__ = lazy_names(__name__, _SOURCES, _MODULES)
