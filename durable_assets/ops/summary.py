"""The end-of-batch summary: what a person wants to know, read from the steps' own metadata.

Every number comes from the ``MaterializeResult`` metadata the steps recorded in Dagster's event
log (the same fold as ``job status``), so a resumed batch sums up its whole lineage, not only the
run that finished it. A job names the lines worth reading in a :class:`SummarySpec`; a job without
one gets every step's scalar metadata, labelled by its keys.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dagster import DagsterInstance, DagsterRun

from durable_assets.kit.runtime import DurableDatabase, Ledger, SummarySpec
from durable_assets.ops.registry import durable_jobs
from durable_assets.ops.status import batch_runs, batch_status, held_for_review, step_metadata
from durable_assets.ops.status_model import BatchStatus, ProviderModel, StepStatus

#: Lines are wrapped to this many columns (a breakdown of many reasons stays readable).
WIDTH = 100


@dataclass(frozen=True)
class Summary:
    batch_id: str
    status: str
    rows: list[tuple[str, str, str]]  # label, figure, detail
    files: list[tuple[str, str]]
    held_for_review: int
    elapsed_this_run_s: float | None
    elapsed_all_runs_s: float | None
    runs: int
    review_hint: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def render(self) -> str:
        out = [f"batch {self.batch_id}: {self.status}"]
        rows = list(self.rows)
        if self.elapsed_this_run_s is not None:
            elapsed = format_seconds(self.elapsed_this_run_s)
            if self.runs > 1 and self.elapsed_all_runs_s is not None:
                rows.append(
                    (
                        "elapsed",
                        elapsed,
                        f"this run; {format_seconds(self.elapsed_all_runs_s)} over {self.runs} runs",
                    )
                )
            else:
                rows.append(("elapsed", elapsed, ""))
        width = max((len(label) for label, _, _ in rows), default=0)
        figure_width = max((len(figure) for _, figure, _ in rows), default=0)
        for label, figure, detail in rows:
            line = f"  {label:<{width}}  {figure:>{figure_width}}"
            if not detail:
                out.append(line)
                continue
            out.extend(_wrap_items(line + "  ", detail.split(", ")))
        file_width = max((len(label) for label, _ in self.files), default=0)
        for label, path in self.files:
            out.append(f"  {label:<{file_width}}  {path}")
        if self.held_for_review:
            where = f": {self.review_hint}" if self.review_hint else ""
            out.append(
                f"  needs review: {self.held_for_review} item{'s' if self.held_for_review != 1 else ''} "
                f"held for a person{where}"
            )
        return "\n".join(out)


def provider_line(provider: ProviderModel | None) -> str | None:
    """Which account the batch's effects went to, and whether that was real money."""
    if provider is None:
        return None
    where = f"{provider.kind} account {provider.account}"
    if provider.kind == "embedded":
        return f"provider: {where} (inside this instance: no real money moved)"
    return f"provider: {where} ({'LIVE mode: real money' if provider.livemode else 'test mode'})"


def _wrap_items(first: str, items: list[str]) -> list[str]:
    """``first`` then ``items`` joined by ", ", wrapped between items (never inside ``USD 1.00``)."""
    lines, current = [], first
    for n, item in enumerate(items):
        piece = item + ("," if n < len(items) - 1 else "")
        if current.strip() and len(current) + len(piece) > WIDTH and current != first:
            lines.append(current.rstrip())
            current = " " * len(first)
        current += piece + " "
    lines.append(current.rstrip())
    return lines


def format_count(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.2f}"
    return str(value)


def format_money(minor_units: Mapping[str, Any]) -> str:
    """``{"usd": 123456, "eur": 500}`` -> ``EUR 5.00, USD 1,234.56`` (the six currencies have 2 decimals)."""
    parts = []
    for currency in sorted(minor_units):
        cents = int(minor_units[currency])
        sign = "-" if cents < 0 else ""
        major, minor = divmod(abs(cents), 100)
        parts.append(f"{currency.upper()} {sign}{major:,}.{minor:02d}")
    return ", ".join(parts)


def format_breakdown(value: Any) -> str:
    """A JSON breakdown, largest first: ``{"a": 1, "b": 3}`` -> ``b 3, a 1``."""
    if isinstance(value, Mapping):
        items = sorted(
            value.items(), key=lambda kv: (-kv[1], kv[0]) if isinstance(kv[1], int | float) else (0, kv[0])
        )
        return ", ".join(f"{k} {format_count(v)}" for k, v in items)
    return "" if value is None else str(value)


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) else 0.0


def format_seconds(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"


def _pick(metadata: Mapping[str, Mapping[str, Any]], sources: Sequence[tuple[str, str]]) -> Any:
    found = None
    for step, key in sources:
        if key in metadata.get(step, {}):
            found = metadata[step][key]
    return found


def _elapsed(instance: DagsterInstance, runs: Sequence[DagsterRun]) -> tuple[float | None, float | None]:
    durations: list[float | None] = []
    for run in runs:
        record = instance.get_run_record_by_id(run.run_id)
        if record is not None and record.start_time is not None and record.end_time is not None:
            durations.append(record.end_time - record.start_time)
        else:
            durations.append(None)
    newest = durations[-1] if durations else None
    known = [d for d in durations if d is not None]
    return newest, (sum(known) if known else None)


def _generic_rows(metadata: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, str, str]]:
    rows = []
    for step, values in metadata.items():
        for key, value in values.items():
            if isinstance(value, int | float | bool):
                rows.append((f"{step}: {key.replace('_', ' ')}", format_count(value), ""))
    return rows


def batch_summary(instance: DagsterInstance, batch_id: str, status: str, spec: SummarySpec | None) -> Summary:
    """The summary of batch ``batch_id`` (whose status the caller has just read)."""
    runs = batch_runs(instance, batch_id)
    metadata = step_metadata(instance, runs)
    rows: list[tuple[str, str, str]] = []
    files: list[tuple[str, str]] = []
    if spec is None:
        rows = _generic_rows(metadata)
    else:
        for line in spec.lines:
            value = _pick(metadata, line.sources)
            if value is None:
                continue  # the step did not get that far
            detail = ""
            if line.detail is not None:
                raw = metadata.get(line.detail[0], {}).get(line.detail[1])
                if raw:
                    detail = (
                        format_money(raw)
                        if line.money_detail and isinstance(raw, Mapping)
                        else format_breakdown(raw)
                    )
            rows.append((line.label, format_count(value), detail))
        for label, step, key in spec.files:
            path = metadata.get(step, {}).get(key)
            if path:
                files.append((label, str(path)))
    rows += _stopped_rows(instance, batch_id, status)
    this_run, all_runs = _elapsed(instance, runs)
    return Summary(
        batch_id=batch_id,
        status=status,
        rows=rows,
        files=files,
        held_for_review=held_for_review(list(metadata.values())),
        elapsed_this_run_s=this_run,
        elapsed_all_runs_s=all_runs,
        runs=len(runs),
        review_hint=spec.review_hint if spec else "",
    )


def _stopped_rows(instance: DagsterInstance, batch_id: str, status: str) -> list[tuple[str, str, str]]:
    """For a batch that stopped short (canceled, failed): the step it stopped in and the side effects
    its runs confirmed, which the steps' metadata cannot say (a step records it only when it
    completes): e.g. the refunds issued before a cancel."""
    if status == BatchStatus.SUCCEEDED:
        return []
    st = batch_status(instance, batch_id)
    rows = []
    p = st.progress
    if p is not None:
        label = p.label.removeprefix("Canceled: ").removeprefix("Failed: ")
        rows.append(("stopped in step", f"{p.step}/{p.total}", label))
    job = durable_jobs().owning(st.job)
    unfinished = {s.step_name for s in st.steps or [] if s.status != StepStatus.COMPLETED}
    scopes = {s.effect_scope for s in (job.steps if job else []) if s.mutates and s.key in unfinished}
    done = Ledger(DurableDatabase.for_instance(instance)).finished_by_runs(st.run_ids)
    done = {scope: n for scope, n in done.items() if scope in scopes}
    if done:
        rows.append(("done before the stop", format_count(sum(done.values())), format_breakdown(done)))
    return rows


def spec_for(job_name: str) -> SummarySpec | None:
    """The summary lines the job declared in its descriptor, if any."""
    job = durable_jobs().owning(job_name)
    return job.summary if job else None
