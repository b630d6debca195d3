"""Every environment variable durable-assets reads, typed, bounded and documented in one place.

Before this module, some 30 variables were read in a dozen modules, each with its own parsing: a
typo in one became a traceback from whichever step or import met it first, and the README's
table drifted from the code. Now :class:`Settings` has one field per variable (its name, type,
default, bounds and a one-line description), :meth:`Settings.from_env` validates them all at once
and fails with one line naming the variable and what it accepts, and the README's Configuration
table is checked against the fields (tests/test_settings.py), so the two cannot drift.

Read the environment through :func:`settings`: it re-reads the variables on every call (so a
test's ``monkeypatch.setenv`` and a process that sets ``DAGSTER_HOME`` or
``DURABLE_CODE_LOCATION`` itself are seen at once) and parses only when one of them changed.

This module is below both the kit and the operations layer: it imports nothing from durable_assets
but :mod:`durable_assets.errors`. The per-feature settings (``ApiSettings``,
``WebhookSettings``, ``AutoResumeSettings``, ``RetentionPolicy``) are built from it and keep their
cross-field checks (a webhook URL needs a secret, a CORS origin must be an origin).

Per-job input variables stay per job (``DailyBatches.input_env`` names one); the known ones are
listed under "pipelines" below so they are documented and checked like the rest.

``python -m durable_assets.settings`` prints the README table.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from functools import lru_cache
from typing import Any, Literal, get_args, get_origin

import annotated_types
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.fields import FieldInfo

from durable_assets.errors import UsageError

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _var(
    name: str,
    default: Any,
    description: str,
    *,
    unset: str | None = None,
    secret: bool = False,
    internal: bool = False,
    **bounds: float,
) -> Any:
    """One variable: ``unset`` is the README's default cell when the default is "not set" (None or
    empty), ``secret`` keeps the value out of reprs and logs, ``internal`` keeps a test hook out of
    the README; ``bounds`` are pydantic's ``gt``/``ge``/``lt``/``le``."""
    extra: dict[str, Any] = {}
    if unset is not None:
        extra["unset"] = unset
    if internal:
        extra["internal"] = True
    return Field(  # type: ignore[call-overload]
        default,
        alias=name,
        description=description,
        repr=not secret,
        json_schema_extra=extra or None,
        **bounds,
    )


class Settings(BaseModel):
    """The whole configuration of a durable-assets process, as read from its environment.

    Field order is the README table's order. Add a variable here (and a row there) rather than
    reading ``os.environ`` in a module: the test that compares the two fails until both agree.
    """

    model_config = ConfigDict(
        frozen=True, extra="forbid", allow_inf_nan=False, validate_by_name=True, validate_by_alias=True
    )

    # --- the instance and the code location --------------------------------------------------
    dagster_home: str | None = _var(
        "DAGSTER_HOME",
        None,
        "the Dagster instance",
        unset="`./dagster_home` if present, else `~/.durable_assets`",
    )
    dagster_pg_url: str | None = _var(
        "DAGSTER_PG_URL",
        None,
        "with `DAGSTER_HOME=dagster_home/postgres`: Postgres for Dagster *and* our tables "
        "(read by that instance's `dagster.yaml`)",
        unset="—",
        secret=True,
    )
    code_location: str = _var(
        "DURABLE_CODE_LOCATION",
        "durable_assets.definitions",
        "the module whose `durable_jobs` every command serves ([your own job](docs/your-own-job.md))",
    )

    # --- the payment provider ----------------------------------------------------------------
    payments_url: str | None = _var(
        "DURABLE_PAYMENTS_URL",
        None,
        "a Stripe-compatible API (official `stripe` SDK)",
        unset="unset = embedded provider",
    )
    stripe_api_key: str | None = _var(
        "STRIPE_API_KEY",
        None,
        "the provider's secret key (passed to Dagster as an `EnvVar`, never shown in the UI)",
        unset="— (required with `DURABLE_PAYMENTS_URL`)",
        secret=True,
    )
    concurrency: int = _var("DURABLE_CONCURRENCY", 16, "concurrent provider requests", ge=1, le=256)
    rate_limit: float | None = _var(
        "DURABLE_RATE_LIMIT",
        None,
        "a hard ceiling on requests/s to the provider. Unset, the process learns the provider's "
        "limit from its 429s (shared by every thread and step; `Retry-After` honoured) and runs at "
        "~1.0 of it ([pacing](docs/operations.md#provider-pacing-and-the-down-budget))",
        unset="none",
        gt=0,
    )
    provider_down_budget_s: float = _var(
        "DURABLE_PROVIDER_DOWN_BUDGET_S",
        60.0,
        "how long the provider may answer nothing but faults (5xx, timeouts, refused connections) "
        "before the step fails, naming this variable; 429s never count. The step's retry policy "
        "does not add to it",
        gt=0,
    )

    # --- the run worker ----------------------------------------------------------------------
    lease_ttl_s: float = _var("DURABLE_LEASE_TTL_S", 15.0, "lease timeout", gt=0)
    key_retention_hours: float = _var(
        "DURABLE_KEY_RETENTION_HOURS",
        24.0,
        "provider key retention; older intents are reconciled by lookup",
        gt=0,
    )
    step_delay_s: float = _var(
        "DURABLE_STEP_DELAY_S", 0.0, "pause before each step (demos and crash tests)", ge=0
    )
    progress_log_interval_s: float = _var(
        "DURABLE_PROGRESS_LOG_INTERVAL_S",
        10.0,
        "when `job run`/`job resume` print to a log (not a terminal): a line per step, at most one "
        "more every this many seconds, and the last",
        ge=0,
    )
    auto_resume_max_attempts: int = _var(
        "DURABLE_AUTO_RESUME_MAX_ATTEMPTS",
        3,
        "automatic resumes per batch after a lost worker whose retry Dagster dropped; 0 = off "
        "([Stale runs](#stale-runs-leases-detection-resume))",
        ge=0,
    )
    auto_resume_after_s: float = _var(
        "DURABLE_AUTO_RESUME_AFTER_S", 30.0, "how long Dagster's own retry gets first", ge=0
    )
    auto_resume_interval_s: int = _var(
        "DURABLE_AUTO_RESUME_INTERVAL_S", 15, "the automatic-resume sensor's minimum interval", ge=1
    )

    # --- distributed execution (`job worker`, `job run --executor celery`) --------------------
    broker_url: str = _var(
        "DURABLE_BROKER_URL",
        "pyamqp://guest@127.0.0.1:5672//",
        "the Celery broker of `job worker` and `job run --executor celery` (RabbitMQ) "
        "([Scaling out](#scaling-out))",
        secret=True,
    )
    broker_queue: str = _var(
        "DURABLE_BROKER_QUEUE",
        "durable_steps",
        "the broker queue steps are sent to and workers consume (one per deployment, or per test)",
    )
    step_lease_ttl_s: float = _var(
        "DURABLE_STEP_LEASE_TTL_S",
        15.0,
        "a distributed step's task renews its step lease every TTL/3; a task not renewed within the "
        "TTL is lost and its step is sent again",
        gt=0,
    )
    step_max_attempts: int = _var(
        "DURABLE_STEP_MAX_ATTEMPTS",
        3,
        "sends of one step's task in one run before the step fails (then `job resume` finishes it)",
        ge=1,
        le=100,
    )

    # --- the HTTP API (`job serve`) ----------------------------------------------------------
    api_token: str | None = _var(
        "DURABLE_API_TOKEN",
        None,
        "`job serve` requires `Authorization: Bearer <token>` on every route but `/healthz`",
        unset="unset",
        secret=True,
    )
    api_heartbeat_s: float = _var(
        "DURABLE_API_HEARTBEAT_S",
        15.0,
        "seconds of silence before a keepalive comment on an event stream",
        gt=0,
    )
    api_max_header_bytes: int = _var(
        "DURABLE_API_MAX_HEADER_BYTES",
        16 * 1024,
        "a larger request head is answered 431 and the connection closed",
        ge=1,
    )
    api_header_timeout_s: float = _var(
        "DURABLE_API_HEADER_TIMEOUT_S",
        10.0,
        "seconds a request head (and any body) may take from its first byte (Slowloris); then 408 and close",
        gt=0,
    )
    api_max_connections: int = _var(
        "DURABLE_API_MAX_CONNECTIONS",
        256,
        "connections served; as many again get only `/healthz` and a 503, beyond that the oldest "
        "idle one is dropped",
        ge=1,
    )
    api_max_streams: int = _var("DURABLE_API_MAX_STREAMS", 64, "open event streams; one more gets 503", ge=1)
    api_cors_origins: tuple[str, ...] = _var(
        "DURABLE_API_CORS_ORIGINS",
        (),
        "comma-separated origins (`https://host[:port]`) whose pages may call the API "
        "(`job serve --cors-origin` adds more)",
        unset="unset = no CORS",
    )

    # --- retention (`job prune`, the daily retention schedule) -------------------------------
    retention_completed_days: float = _var(
        "DURABLE_RETENTION_COMPLETED_DAYS",
        30.0,
        "retention of succeeded batches ([Retention](#retention))",
        ge=0,
    )
    retention_failed_days: float = _var(
        "DURABLE_RETENTION_FAILED_DAYS", 90.0, "retention of failed or canceled batches", ge=0
    )
    ledger_retention_days: float = _var(
        "DURABLE_LEDGER_RETENTION_DAYS", 365.0, "idempotency-key horizon", ge=0
    )
    archive_dir: str | None = _var(
        "DURABLE_ARCHIVE_DIR",
        None,
        "where pruned batches are archived",
        unset="`$DAGSTER_HOME/archive`",
    )
    retention_schedule: Literal["running", "stopped"] = _var(
        "DURABLE_RETENTION_SCHEDULE",
        "running",
        "`stopped`: the daily retention schedule starts stopped",
    )

    # --- webhooks ----------------------------------------------------------------------------
    webhook_urls: tuple[str, ...] = _var(
        "DURABLE_WEBHOOK_URLS",
        (),
        "comma-separated `http(s)` receivers of terminal batch events ([Webhooks](#webhooks))",
        unset="unset = no webhooks",
    )
    webhook_secret: str | None = _var(
        "DURABLE_WEBHOOK_SECRET",
        None,
        "`whsec_<base64>` signing secret (≥ 16 bytes once decoded)",
        unset="— (required with URLs)",
        secret=True,
    )
    webhook_timeout_s: float = _var(
        "DURABLE_WEBHOOK_TIMEOUT_S",
        10.0,
        "per-request timeout; a crashed sender's claim on a delivery lapses after 2 × this + 1 s",  # noqa: RUF001
        gt=0,
    )
    webhook_cli_budget_s: float = _var(
        "DURABLE_WEBHOOK_CLI_BUDGET_S",
        30.0,
        "how long `job run` / `job resume` may spend delivering before it exits and leaves the rest pending",
        ge=0,
    )
    webhook_backoff_base_s: float = _var(
        "DURABLE_WEBHOOK_BACKOFF_BASE_S",
        1.0,
        "full-jitter backoff base ([docs/webhooks.md](docs/webhooks.md))",
        gt=0,
    )
    webhook_backoff_cap_s: float = _var(
        "DURABLE_WEBHOOK_BACKOFF_CAP_S", 3600.0, "the longest wait between two attempts", gt=0
    )
    webhook_max_attempts: int = _var(
        "DURABLE_WEBHOOK_MAX_ATTEMPTS",
        16,
        "then the delivery is given up (≈ 6 h of retries with the defaults)",
        ge=1,
    )

    # --- pipelines: each pipeline's own limits and inputs ------------------------------------
    # A pipeline's variables go here, in a block of their own: the refund batch's guardrails and
    # the daily input of each DailyBatches schedule (its ``input_env``), and the credit
    # migration's limits (its CreditLimits resource).
    max_refunds_per_batch: int = _var(
        "DURABLE_MAX_REFUNDS_PER_BATCH", 100_000, "refund batch: ceiling on refunds per batch", ge=0
    )
    max_amount_per_batch_cents: int = _var(
        "DURABLE_MAX_AMOUNT_PER_BATCH_CENTS",
        100_000_000,
        "refund batch: ceiling on the amount per batch, per currency, in minor units",
        ge=0,
    )
    max_credit_adjustments_per_batch: int = _var(
        "DURABLE_MAX_CREDIT_ADJUSTMENTS_PER_BATCH",
        100_000,
        "credit migration: ceiling on balance adjustments per batch",
        ge=0,
    )
    max_credit_per_batch_cents: int = _var(
        "DURABLE_MAX_CREDIT_PER_BATCH_CENTS",
        100_000_000,
        "credit migration: ceiling on the credit a batch moves (sum of the adjustments' absolute "
        "values), per currency, in minor units",
        ge=0,
    )
    daily_invoices: str | None = _var(
        "DURABLE_DAILY_INVOICES",
        None,
        "the daily refund schedule's input file, `{date}` templated",
        unset="unset = synthetic",
    )
    nightly_credits: str | None = _var(
        "DURABLE_NIGHTLY_CREDITS",
        None,
        "the nightly credit-migration schedule's input file, `{date}` templated",
        unset="unset = synthetic",
    )

    # --- test hooks: not configuration, kept out of the README --------------------------------
    crash_at: str | None = _var(
        "DURABLE_CRASH_AT",
        None,
        "tests only: `POINT[:N][:stop]`, SIGKILL (with `:stop`, SIGSTOP) this process the Nth time it "
        "passes that named crash point (durable_assets/kit/crashpoints.py checks the spelling)",
        internal=True,
    )
    crash_counts: str | None = _var(
        "DURABLE_CRASH_COUNTS",
        None,
        "tests only: a file to which the process appends, at exit, how often it passed each crash point",
        internal=True,
    )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Settings:
        """Parse and check every variable; the first bad one raises :class:`UsageError` (exit 2)
        naming it and what it accepts. Unset and blank variables take their defaults."""
        values: dict[str, Any] = {}
        for name, info in cls.model_fields.items():
            raw = environ.get(variable(info))
            if raw is not None and raw.strip():
                values[name] = _parse(info, raw)
        try:
            return cls.model_validate(values)
        except ValidationError as exc:  # _parse checks what pydantic checks; this is a safety net
            error = exc.errors()[0]
            info = cls.model_fields[str(error["loc"][0])]
            raw = environ.get(variable(info), "").strip()
            raise UsageError(
                f"{variable(info)}={raw!r} is invalid ({error['msg']}); fix or unset it"
            ) from None

    @classmethod
    def public_fields(cls) -> dict[str, FieldInfo]:
        """The fields a user sets (the README's table), without the test hooks."""
        return {n: f for n, f in cls.model_fields.items() if not _extra(f).get("internal")}


def variable(info: FieldInfo) -> str:
    """The environment variable behind a field."""
    assert info.alias is not None
    return info.alias


def _extra(info: FieldInfo) -> dict[str, Any]:
    return info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}


def _kind(info: FieldInfo) -> Any:
    """The field's type without ``| None``."""
    args = [a for a in get_args(info.annotation) if a is not type(None)]
    return args[0] if get_origin(info.annotation) is not Literal and len(args) == 1 else info.annotation


def _bounds(info: FieldInfo) -> list[tuple[str, float]]:
    """The field's pydantic bounds as (operator, number), for the message and the check."""
    ops = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}
    return [
        (op, float(getattr(meta, attr)))
        for meta in info.metadata
        for attr, op in ops.items()
        if isinstance(meta, annotated_types.BaseMetadata) and hasattr(meta, attr)
    ]


def _parse(info: FieldInfo, raw: str) -> Any:
    """One variable's text as its field's type, in the wording of the CLI's messages."""
    name, text, kind = variable(info), raw.strip(), _kind(info)
    if kind in (int, float):
        noun = "a whole number" if kind is int else "a number"
        try:
            value = kind(text)
        except ValueError:
            raise UsageError(f"{name}={text!r} is not {noun}; fix or unset it") from None
        bounds = _bounds(info)
        inside = {">": float.__gt__, ">=": float.__ge__, "<": float.__lt__, "<=": float.__le__}
        if not math.isfinite(value) or not all(inside[op](float(value), b) for op, b in bounds):
            allowed = " and ".join(f"{op} {b:g}" for op, b in bounds) or "that is finite"
            raise UsageError(f"{name}={text!r} is out of range: use {noun} {allowed}, or unset it")
        return value
    if kind is bool:
        if text.lower() not in (*_TRUE, *_FALSE):
            raise UsageError(f"{name}={text!r} is not a yes/no value (1 or 0); fix or unset it")
        return text.lower() in _TRUE
    if get_origin(kind) is Literal:
        choices = get_args(kind)
        if text.lower() not in choices:
            raise UsageError(f"{name}={text!r} is not one of: {', '.join(choices)}; fix or unset it")
        return text.lower()
    if get_origin(kind) is tuple:
        return tuple(part.strip() for part in raw.split(",") if part.strip())
    return raw


def default_text(info: FieldInfo) -> str:
    """The README's default cell for a field."""
    if "unset" in _extra(info):
        return str(_extra(info)["unset"])
    value = info.default
    if isinstance(value, str):
        return f"`{value}`"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def markdown_table() -> str:
    """The README's Configuration table, one row per public field, in field order."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    rows += [
        f"| `{variable(f)}` | {default_text(f)} | {f.description} |"
        for f in Settings.public_fields().values()
    ]
    return "\n".join(rows)


_VARIABLES = tuple(variable(f) for f in Settings.model_fields.values())


@lru_cache(maxsize=8)
def _parsed(snapshot: tuple[str | None, ...]) -> Settings:
    return Settings.from_env({k: v for k, v in zip(_VARIABLES, snapshot, strict=True) if v is not None})


class _Current:
    """``settings()``: the process's settings, re-validated whenever one of the variables changed.

    Keyed on the variables' current values rather than cached once: tests set variables per test,
    and the CLI sets ``DAGSTER_HOME`` (runner.resolve_dagster_home) after the first read. Reading
    ~35 variables costs tens of microseconds; parsing again only happens when one changed. An
    invalid environment is not cached: every call raises until it is fixed.
    """

    def __call__(self) -> Settings:
        return _parsed(tuple(map(os.environ.get, _VARIABLES)))

    def cache_clear(self) -> None:
        _parsed.cache_clear()


settings = _Current()


if __name__ == "__main__":
    print(markdown_table())
