"""The operations layer's variables: progress lines, automatic resume, the HTTP API, retention, webhooks.

Each section is read by the command or sensor that uses it, once. The HTTP API's and the
automatic resume's sections are the features' own settings objects (``ApiSettings``,
``AutoResumeSettings``); the retention policy and the webhook settings are derived from the
sections here without restating a default. Light on purpose (no server, no Dagster): `job run`
checks every section before it opens anything.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Literal, Self

from durable_assets.errors import UsageError
from durable_assets.kit.runtime import DEFAULT_LEASE_TTL_S, KitSettings
from durable_assets.settings import Section, var


class ProgressSettings(Section):
    """What `job run`/`job resume` print while they wait."""

    progress_log_interval_s: float = var(
        "DURABLE_PROGRESS_LOG_INTERVAL_S",
        10.0,
        "when `job run`/`job resume` print to a log (not a terminal): a line per step, at most one "
        "more every this many seconds, and the last",
        ge=0,
    )


class AutoResumeSettings(Section):
    """``DURABLE_AUTO_RESUME_*``; read once where the code location is wired (durable_assets/location.py)."""

    #: Three lost hosts in a row is an incident.
    max_attempts: int = var(
        "DURABLE_AUTO_RESUME_MAX_ATTEMPTS",
        3,
        "automatic resumes per batch after a lost worker whose retry Dagster dropped; 0 = off "
        "([Stale runs](#stale-runs-leases-detection-resume))",
        ge=0,
    )
    #: Dagster's own retry normally acts within seconds of the failure.
    after_s: float = var("DURABLE_AUTO_RESUME_AFTER_S", 30.0, "how long Dagster's own retry gets first", ge=0)
    #: The daemon evaluates sensors at most every ~5 s anyway.
    interval_s: int = var(
        "DURABLE_AUTO_RESUME_INTERVAL_S", 15, "the automatic-resume sensor's minimum interval", ge=1
    )
    #: The kit's ``DURABLE_LEASE_TTL_S`` (not read by this section): a lost worker's lease lapses after it.
    lease_ttl_s: float = DEFAULT_LEASE_TTL_S

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Self:
        own = super().from_env(environ)
        return own.model_copy(update={"lease_ttl_s": KitSettings.from_env(environ).lease_ttl_s})


def lease_ttl_s() -> float:
    """The kit's ``DURABLE_LEASE_TTL_S`` as every command sees it (the kit's section, read here
    only for the operations layer): how long a lost worker's lease takes to lapse."""
    return KitSettings.current().lease_ttl_s


_ORIGIN = re.compile(r"^https?://[^/\s]+$")


def check_origins(origins: Sequence[str]) -> tuple[str, ...]:
    """CORS origins as browsers send them (``scheme://host[:port]``, no path); ``*`` is refused."""
    out = []
    for origin in (o.strip().rstrip("/") for o in origins):
        if not origin:
            continue
        if not _ORIGIN.match(origin):
            raise UsageError(
                f"CORS origin {origin!r} is not an origin: give scheme://host[:port], e.g. "
                "https://dash.example.com (a wildcard would hand every web page the API)"
            )
        out.append(origin)
    return tuple(dict.fromkeys(out))


class ApiSettings(Section):
    """Everything ``job serve`` reads from the environment, read once (README's configuration table)."""

    token: str | None = var(
        "DURABLE_API_TOKEN",
        None,
        "`job serve` requires `Authorization: Bearer <token>` on every route but `/healthz`",
        unset="unset",
        secret=True,
    )
    heartbeat_s: float = var(
        "DURABLE_API_HEARTBEAT_S",
        15.0,
        "seconds of silence before a keepalive comment on an event stream",
        gt=0,
    )
    #: nginx: 8 KiB buffers; h11: 16 KiB.
    max_header_bytes: int = var(
        "DURABLE_API_MAX_HEADER_BYTES",
        16 * 1024,
        "a larger request head is answered 431 and the connection closed",
        ge=1,
    )
    header_timeout_s: float = var(
        "DURABLE_API_HEADER_TIMEOUT_S",
        10.0,
        "seconds a request head (and any body) may take from its first byte (Slowloris); then 408 and close",
        gt=0,
    )
    max_connections: int = var(
        "DURABLE_API_MAX_CONNECTIONS",
        256,
        "requests in progress at once (an event stream counts until it ends); one more gets 503 "
        "but `/healthz`; open connections stay within twice it, a new one closing the oldest stalled",
        ge=1,
    )
    max_stalled_per_client: int = var(
        "DURABLE_API_MAX_STALLED_PER_CLIENT",
        16,
        "connections one client address may hold with no request in progress (a head or body still "
        "arriving, or idle); one more closes its oldest",
        ge=1,
    )
    #: Each open stream costs a poll every 0.25 s.
    max_streams: int = var("DURABLE_API_MAX_STREAMS", 64, "open event streams; one more gets 503", ge=1)
    cors_origins: tuple[str, ...] = var(
        "DURABLE_API_CORS_ORIGINS",
        (),
        "comma-separated origins (`https://host[:port]`) whose pages may call the API "
        "(`job serve --cors-origin` adds more)",
        unset="unset = no CORS",
    )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, cors_origins: Sequence[str] = ()) -> Self:
        """The environment's values, with ``--cors-origin`` added and every origin checked."""
        own = super().from_env(environ)
        return own.model_copy(update={"cors_origins": check_origins([*own.cors_origins, *cors_origins])})


class RetentionSettings(Section):
    """Retention (`job prune`, the daily retention schedule)."""

    completed_days: float = var(
        "DURABLE_RETENTION_COMPLETED_DAYS",
        30.0,
        "retention of succeeded batches ([Retention](#retention))",
        ge=0,
    )
    failed_days: float = var(
        "DURABLE_RETENTION_FAILED_DAYS", 90.0, "retention of failed or canceled batches", ge=0
    )
    ledger_days: float = var("DURABLE_LEDGER_RETENTION_DAYS", 365.0, "idempotency-key horizon", ge=0)
    archive_dir: str | None = var(
        "DURABLE_ARCHIVE_DIR",
        None,
        "where pruned batches are archived: a folder, or `s3://BUCKET/PREFIX` (cold storage; "
        "`DURABLE_S3_ENDPOINT_URL` and `DURABLE_S3_REGION` apply). With `DURABLE_STORAGE=s3` unset "
        "means that bucket's `archive/`",
        unset="`$DAGSTER_HOME/archive`",
    )
    schedule: Literal["running", "stopped"] = var(
        "DURABLE_RETENTION_SCHEDULE", "running", "`stopped`: the daily retention schedule starts stopped"
    )


class WebhookVariables(Section):
    """Webhooks, as set; :class:`~durable_assets.ops.webhooks.outbox.WebhookSettings` checks them
    as a whole (a URL needs a secret) and decodes the secret."""

    urls: tuple[str, ...] = var(
        "DURABLE_WEBHOOK_URLS",
        (),
        "comma-separated `http(s)` receivers of terminal batch events ([Webhooks](#webhooks))",
        unset="unset = no webhooks",
    )
    secret: str | None = var(
        "DURABLE_WEBHOOK_SECRET",
        None,
        "`whsec_<base64>` signing secret (≥ 16 bytes once decoded)",
        unset="— (required with URLs)",
        secret=True,
    )
    timeout_s: float = var(
        "DURABLE_WEBHOOK_TIMEOUT_S",
        10.0,
        "per-request timeout; a crashed sender's claim on a delivery lapses after 2 × this + 1 s",  # noqa: RUF001
        gt=0,
    )
    cli_budget_s: float = var(
        "DURABLE_WEBHOOK_CLI_BUDGET_S",
        30.0,
        "how long `job run` / `job resume` may spend delivering before it exits and leaves the rest pending",
        ge=0,
    )
    backoff_base_s: float = var(
        "DURABLE_WEBHOOK_BACKOFF_BASE_S",
        1.0,
        "full-jitter backoff base ([docs/webhooks.md](docs/webhooks.md))",
        gt=0,
    )
    backoff_cap_s: float = var(
        "DURABLE_WEBHOOK_BACKOFF_CAP_S", 3600.0, "the longest wait between two attempts", gt=0
    )
    max_attempts: int = var(
        "DURABLE_WEBHOOK_MAX_ATTEMPTS",
        16,
        "then the delivery is given up (≈ 6 h of retries with the defaults)",
        ge=1,
    )
