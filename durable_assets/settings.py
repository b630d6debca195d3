"""The machinery of durable-assets' settings, and the instance-wide variables.

Before this module, some 30 variables were read in a dozen modules, each with its own parsing: a
typo in one became a traceback from whichever step or import met it first, and the README's
table drifted from the code. Now every variable is a field of a :class:`Section` (its name, type,
default, bounds and a one-line description), :meth:`Section.from_env` validates a section at once
and fails with one line naming the variable and what it accepts, and the README's Configuration
table is generated from the sections (``python -m durable_assets.configuration``) and checked
against them (tests/test_settings.py), so the two cannot drift.

Each layer declares its own section next to its code, so each default is written once, where it
is used: the kit's knobs in :mod:`durable_assets.kit.settings`, the provider's in
:mod:`durable_assets.payments.settings`, the operations layer's in :mod:`durable_assets.ops.settings`
(some sections *are* the feature's settings object: ``ApiSettings``, ``AutoResumeSettings``), and
each pipeline's own limits and inputs in its package (``refunds/settings.py``,
``credit_migration/settings.py``). This module keeps only what every layer shares: the field
helper :func:`var`, parsing with the CLI's error wording, the table's cells, and the variables of
the instance and the code location. It is below every layer: it imports nothing from
durable_assets but :mod:`durable_assets.errors`.

The kit reads no section itself: values reach it through resource and executor config, set where
a code location is wired (tests/test_architecture.py lists the two documented exceptions).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any, ClassVar, Literal, Self, get_args, get_origin

import annotated_types
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.fields import FieldInfo

from durable_assets.errors import UsageError

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def var(
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


class Section(BaseModel):
    """A group of variables one layer or pipeline reads, as read from a process's environment.

    Field order is the README table's order within the section. A field declared with :func:`var`
    is a variable; a plain field (no alias) is a value the section carries but does not read (set
    by whoever builds it). Add a variable to a section rather than reading ``os.environ`` in a
    module: the test that compares the README with the sections fails until both agree.
    """

    model_config = ConfigDict(
        frozen=True, extra="forbid", allow_inf_nan=False, validate_by_name=True, validate_by_alias=True
    )

    #: Every section defined so far, in definition order (``job run`` checks them all up front).
    registered: ClassVar[list[type[Section]]] = []

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        Section.registered.append(cls)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Self:
        """Parse and check the section's variables (default: this process's environment); the
        first bad one raises :class:`UsageError` (exit 2) naming it and what it accepts. Unset and
        blank variables take their defaults."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name, info in cls.variables().items():
            raw = env.get(variable(info))
            if raw is not None and raw.strip():
                values[name] = _parse(info, raw)
        try:
            return cls.model_validate(values)
        except ValidationError as exc:  # _parse checks what pydantic checks; this is a safety net
            error = exc.errors()[0]
            info = cls.model_fields[str(error["loc"][0])]
            raw = env.get(variable(info), "").strip()
            raise UsageError(
                f"{variable(info)}={raw!r} is invalid ({error['msg']}); fix or unset it"
            ) from None

    @classmethod
    def current(cls) -> Self:
        """This process's values, re-validated whenever one of the section's variables changed.

        Keyed on the variables' current values rather than cached once: tests set variables per
        test, and the CLI sets ``DAGSTER_HOME`` (runner.resolve_dagster_home) after the first read.
        An invalid environment is not cached: every call raises until it is fixed.
        """
        names = tuple(variable(f) for f in cls.variables().values())
        parsed = _parsed(cls, tuple(map(os.environ.get, names)))
        assert isinstance(parsed, cls)
        return parsed

    @classmethod
    def variables(cls) -> dict[str, FieldInfo]:
        """The fields read from the environment (test hooks included)."""
        return {n: f for n, f in cls.model_fields.items() if f.alias is not None}

    @classmethod
    def variables_of(cls, *fields: str) -> dict[str, str]:
        """field -> variable, for the named fields (a guardrail resource names them in its messages)."""
        return {name: variable(cls.model_fields[name]) for name in fields}

    @classmethod
    def public_fields(cls) -> dict[str, FieldInfo]:
        """The fields a user sets (the README's table), without the test hooks."""
        return {n: f for n, f in cls.variables().items() if not _extra(f).get("internal")}


@lru_cache(maxsize=64)
def _parsed(section: type[Section], snapshot: tuple[str | None, ...]) -> Section:
    names = [variable(f) for f in section.variables().values()]
    return section.from_env({k: v for k, v in zip(names, snapshot, strict=True) if v is not None})


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """Parse every section defined in this process, so a malformed variable fails in one place."""
    for section in list(Section.registered):
        section.from_env(environ)


class InstanceSettings(Section):
    """The Dagster instance and the code location: read by every process, of every layer."""

    dagster_home: str | None = var(
        "DAGSTER_HOME",
        None,
        "the Dagster instance",
        unset="`./dagster_home` if present, else `~/.durable_assets`",
    )
    dagster_pg_url: str | None = var(
        "DAGSTER_PG_URL",
        None,
        "Postgres for Dagster *and* our tables, read by an instance whose `dagster.yaml` says so "
        "(`job init-home DIR --postgres-from-env`, `dagster_home/postgres`); beside one that stores "
        "elsewhere, every command refuses it (exit 2)",
        unset="—",
        secret=True,
    )
    code_location: str = var(
        "DURABLE_CODE_LOCATION",
        "durable_assets.definitions",
        "the module whose `durable_jobs` every command serves ([your own job](docs/your-own-job.md)); "
        "unset, a process that builds a location (`dagster dev -m postcards`, a code server, a run "
        "worker) serves that one, kept in `ops/registry.py` and never written into the environment",
    )


def child_environment(**overrides: str) -> dict[str, str]:
    """The environment for a process we start: this one, with ``overrides`` (a resolved
    DAGSTER_HOME), so the value reaches the child without being written into ours."""
    return {**os.environ, **overrides}


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


def markdown_table(sections: Iterable[type[Section]]) -> str:
    """The README's Configuration table: one row per public field, section by section."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    rows += [
        f"| `{variable(f)}` | {default_text(f)} | {f.description} |"
        for section in sections
        for f in section.public_fields().values()
    ]
    return "\n".join(rows)
