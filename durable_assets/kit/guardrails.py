"""Guardrails pinned per batch: the ceilings a batch runs under are the ones it started with.

A ceiling read from each process's environment is not a guardrail: a batch stopped by
``DURABLE_MAX_REFUNDS_PER_BATCH=5`` and resumed from a shell without that variable would send every
refund. So a guardrail resource (a subclass of :class:`Guardrails`) stores its field values with
the batch the first time a run of that batch uses it, and every later run of the batch (a resume, a
re-execution from the UI, a shard of a distributed run, a daemon retry) replaces its own values
with the stored ones. Only an operator changes them, on purpose: ``job resume --override-guardrails``
(:meth:`PinnedGuardrails.override`), which is recorded and shown by ``job status``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import sqlalchemy as sa
from dagster import ConfigurableResource, InitResourceContext
from pydantic import Field, TypeAdapter

from durable_assets.kit.db import DurableDatabase, batch_guardrails, now
from durable_assets.kit.tags import BATCH_TAG


@dataclass(frozen=True)
class GuardrailPin:
    """One guardrail resource's values as a batch holds them, and the last override of them."""

    name: str
    values: dict[str, Any]
    pinned_at: float
    overridden_at: float | None = None
    overridden_from: dict[str, Any] | None = None


class PinnedGuardrails:
    """The ``durable_batch_guardrails`` table: (batch, guardrail name) -> the values in force."""

    def __init__(self, db: DurableDatabase) -> None:
        self.db = db

    def pin(self, batch_id: str, name: str, values: Mapping[str, Any]) -> dict[str, Any]:
        """Store ``values`` unless the batch has this guardrail pinned already; the values in force.

        Insert-if-absent, then read: two workers of one batch (shards, a retry racing a resume)
        that pin together both get the first one's values.
        """
        with self.db.transaction() as conn:
            conn.execute(
                self.db.insert_ignore(batch_guardrails),
                [
                    {
                        "batch_id": batch_id,
                        "name": name,
                        "guardrail_values": json.dumps(dict(values), sort_keys=True),
                        "pinned_at": now(),
                    }
                ],
            )
            row = conn.execute(self._select(batch_id).where(batch_guardrails.c.name == name)).one()
        return dict(json.loads(row.guardrail_values))

    def get(self, batch_id: str) -> list[GuardrailPin]:
        """Every guardrail the batch has pinned, by name."""
        with self.db.read() as conn:
            rows = conn.execute(self._select(batch_id).order_by(batch_guardrails.c.name)).all()
        return [
            GuardrailPin(
                name=row.name,
                values=json.loads(row.guardrail_values),
                pinned_at=row.pinned_at,
                overridden_at=row.overridden_at,
                overridden_from=json.loads(row.overridden_from) if row.overridden_from else None,
            )
            for row in rows
        ]

    def override(self, batch_id: str, name: str, values: Mapping[str, Any]) -> GuardrailPin:
        """Re-pin ``values`` on purpose (an operator's ``--override-guardrails``), recording when and
        what they replaced; a guardrail the batch never pinned is simply pinned."""
        c = batch_guardrails.c
        t = now()
        encoded = json.dumps(dict(values), sort_keys=True)
        with self.db.transaction() as conn:
            row = conn.execute(self._select(batch_id).where(c.name == name)).first()
            if row is None:
                conn.execute(
                    batch_guardrails.insert().values(
                        batch_id=batch_id, name=name, guardrail_values=encoded, pinned_at=t
                    )
                )
                return GuardrailPin(name, dict(values), t)
            conn.execute(
                batch_guardrails.update()
                .where(c.batch_id == batch_id, c.name == name)
                .values(guardrail_values=encoded, overridden_at=t, overridden_from=row.guardrail_values)
            )
        return GuardrailPin(name, dict(values), row.pinned_at, t, json.loads(row.guardrail_values))

    @staticmethod
    def _select(batch_id: str) -> sa.Select[Any]:
        return sa.select(batch_guardrails).where(batch_guardrails.c.batch_id == batch_id)


def count_ceiling(default: int) -> Any:
    """A :class:`Guardrails` field: how many effects one batch may send at most (0: none).

    Why a helper: every job that sends effects has this ceiling, and it must never be negative.
    """
    return Field(default=default, ge=0)


def amount_ceiling(default_cents: int) -> Any:
    """A :class:`Guardrails` field: how much money one batch may move, per currency, in minor units.

    Why a helper: every job that moves money has this ceiling, described the same way (with its
    default in major units) wherever its fields are shown.
    """
    return Field(
        default=default_cents,
        ge=0,
        description=f"Per currency, in minor units (default {default_cents / 100:,.2f})",
    )


class Guardrails(ConfigurableResource):
    """Base of a resource whose fields are a batch's ceilings and limits: pinned at its first run.

    Subclass it and declare the fields; a step reads them as usual (``limits.max_refunds_per_batch``)
    and gets the batch's pinned values. ``env_vars`` names the variable that sets each field in your
    code location, for the line ``job resume`` prints when the shell asks for other values (a field
    configured with ``EnvVar`` is named by it already). A subclass that needs its own setup calls
    ``super().setup_for_execution(context)`` first.
    """

    #: field -> the environment variable the code location sets it from (for messages only).
    env_vars: ClassVar[Mapping[str, str]] = {}

    @classmethod
    def guardrail_name(cls) -> str:
        """The key the values are stored under for a batch: the class's name."""
        return cls.__name__

    def guardrail_values(self) -> dict[str, Any]:
        """This instance's field values (a run's: with its config and ``EnvVar`` values resolved)."""
        return {name: getattr(self, name) for name in type(self).model_fields}

    def setup_for_execution(self, context: InitResourceContext) -> None:
        run = context.dagster_run
        batch_id = run.tags.get(BATCH_TAG) if run is not None else None
        if not batch_id or context.instance is None:
            return  # an ad-hoc materialization outside any batch: its own values
        pinned = PinnedGuardrails(DurableDatabase.for_instance(context.instance)).pin(
            batch_id, self.guardrail_name(), self.guardrail_values()
        )
        for name, value in pinned.items():
            if name in type(self).model_fields:
                # The resource is a frozen model, and this copy is the run's own (Dagster makes one
                # per initialization): the pinned values replace the environment's for this run.
                object.__setattr__(self, name, value)

    def configured_values(self, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
        """The values a run started now would use, before pinning: what the code location configured,
        with fields configured as ``EnvVar`` read from ``environ`` (default: this process's)."""
        env = os.environ if environ is None else environ
        values = self.guardrail_values()
        for name, variable in self._env_fields().items():
            if variable in env:
                annotation = type(self).model_fields[name].annotation
                values[name] = TypeAdapter(annotation or Any).validate_python(env[variable])
            else:
                values[name] = type(self).model_fields[name].get_default(call_default_factory=True)
        return values

    def variable(self, field: str) -> str | None:
        """The environment variable that sets ``field`` in this code location, if one does."""
        return self._env_fields().get(field) or self.env_vars.get(field)

    def variable_is_set(self, field: str) -> bool:
        """Whether this process's environment sets ``field``'s variable (False if it has none)."""
        name = self.variable(field)
        return name is not None and name in os.environ

    def _env_fields(self) -> dict[str, str]:
        """Fields configured as ``EnvVar``: Dagster resolves those only inside a run, so before one the
        instance holds a placeholder and the variable's name is in its configuration."""
        state = getattr(self, "_state__internal__", None)  # Dagster's own record of the config given
        config = getattr(state, "resolved_config_dict", None) or {}
        return {
            name: value["env"]
            for name, value in config.items()
            if isinstance(value, Mapping) and set(value) == {"env"} and name in type(self).model_fields
        }


def guardrails_used(definitions: Iterable[Any], resources: Mapping[str, Any]) -> dict[str, Guardrails]:
    """The guardrail resources that ``definitions`` (a job's assets and checks) require, by name."""
    keys: set[str] = set()
    for definition in definitions:
        keys |= set(definition.required_resource_keys)
    found = [resources[k] for k in sorted(keys) if isinstance(resources.get(k), Guardrails)]
    return {g.guardrail_name(): g for g in found}


def guardrail_variables(guardrails: Mapping[str, Guardrails]) -> dict[str, dict[str, str]]:
    """``{guardrail name: {field: variable}}`` for the fields a variable sets."""
    return {
        name: {f: v for f in type(g).model_fields if (v := g.variable(f))} for name, g in guardrails.items()
    }
