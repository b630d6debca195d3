"""The code a batch started with: pinned per step at its first run, compared by every later one.

Deploys are the first reason a batch's process dies, and a resume runs on whatever is deployed
then. A key derived by changed code is a new key: the provider cannot deduplicate it against the
old one, so a batch resumed across such a change could act twice on an item. DBOS recovers a
workflow only on the application version it started on; Temporal checks determinism on replay;
Dagster's ``code_version`` on assets guards no run. Here:

- each step has a **code version**: its declared Dagster ``code_version`` where the author gave one,
  else a fingerprint of its definition that covers the source of the job's own package (a key
  function lives beside the step, not in it), the job's list of steps and the package's version;
- the first run of a batch **pins** every step's version (``durable_batch_code``), and every later
  run, whoever launched it (``job resume``, the daemon, the UI), compares the deployed version of
  each step it runs with the pin before the step starts;
- a change in a step that has **recorded effects** for the batch (or a declared version that
  differs) stops the step before its first request; a change in a step with no effects is allowed
  and said in the batch's log. Only a person crosses a stopping change, knowingly, with
  ``job resume --accept-code-change`` (:meth:`CodePins.accept`).

The versions say *that* code changed; whether a change matters for exactly-once is decided per
item by the ledger (:meth:`durable_assets.kit.ledger.Ledger.item_drift`), which holds even after a
change is accepted.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from durable_assets.kit.db import DurableDatabase, batch_code, batch_items, idempotency, now

#: A fingerprint's prefix, so a version reads as what it is beside an author's declared one.
FINGERPRINT_PREFIX = "fp-"


@dataclass(frozen=True)
class StepCode:
    """One step's code version, and whether its author declared it (``code_version=``)."""

    version: str
    declared: bool = False

    def as_json(self) -> dict[str, Any]:
        return {"version": self.version, "declared": self.declared}

    @classmethod
    def from_json(cls, value: Any) -> StepCode:
        if isinstance(value, Mapping):
            return cls(str(value.get("version", "")), bool(value.get("declared", False)))
        return cls(str(value))


@dataclass(frozen=True)
class CodePin:
    """A step's version as its batch holds it, what a later check saw deployed, and acceptances."""

    step: str
    code: StepCode
    pinned_at: float
    seen_version: str | None = None
    seen_at: float | None = None
    accepted_at: float | None = None
    accepted_from: str | None = None


@dataclass(frozen=True)
class CodeChange:
    """A step whose deployed code differs from the code its batch started with."""

    step: str
    pinned: StepCode
    deployed: StepCode
    #: The batch has effects recorded in this step's ledger scope: a new key could act twice.
    has_effects: bool

    @property
    def stops(self) -> bool:
        """Whether only a person may cross this change (the rule of the module docstring)."""
        return self.has_effects or self.pinned.declared or self.deployed.declared

    def describe(self) -> str:
        why = "recorded effects" if self.has_effects else "declared code_version"
        return f"{self.step} ({why}; started on {self.pinned.version}, deployed {self.deployed.version})"


# --- versions of the deployed code ------------------------------------------------------------------


def job_code_versions(assets: Iterable[Any], step_keys: Sequence[str]) -> dict[str, StepCode]:
    """Every step's code version as deployed in this process (``assets`` in step order)."""
    steps = "\x1f".join(step_keys)
    out: dict[str, StepCode] = {}
    for asset, step in zip(assets, step_keys, strict=True):
        declared = (getattr(asset, "code_versions_by_key", None) or {}).get(asset.key)
        if declared:
            out[step] = StepCode(str(declared), declared=True)
            continue
        module = _defining_module(asset)
        digest = hashlib.sha256(
            "\x1e".join(
                (step, _scope_of(asset), steps, _source_digest(module), _distribution_version(module))
            ).encode()
        ).hexdigest()
        out[step] = StepCode(FINGERPRINT_PREFIX + digest[:16])
    return out


def _defining_module(asset: Any) -> str:
    """The module the step's function was written in (the kit's wrapper keeps its ``__module__``)."""
    fn = getattr(getattr(asset.op, "compute_fn", None), "decorated_fn", None)
    return str(getattr(fn, "__module__", "") or "")


def _scope_of(asset: Any) -> str:
    from durable_assets.kit.tags import EFFECT_SCOPE_KEY

    metadata = asset.specs_by_key[asset.key].metadata or {}
    value = metadata.get(EFFECT_SCOPE_KEY)
    return str(getattr(value, "value", value) or "")


@functools.cache
def _source_digest(module_name: str) -> str:
    """A digest of the source the step's behaviour can depend on without being in the step: its
    package's modules (a module in a package), or the modules beside it (a top-level module, such as
    a job file in its own folder). Names and bytes, so a moved or renamed module changes it too."""
    module = sys.modules.get(module_name)
    file = getattr(module, "__file__", None)
    if not file:
        return "no-source"
    path = Path(file).resolve()
    files = (
        sorted(p for p in path.parent.rglob("*.py") if "__pycache__" not in p.parts)
        if getattr(module, "__package__", None)
        else sorted(path.parent.glob("*.py"))
    )
    h = hashlib.sha256()
    for source in files:
        h.update(source.relative_to(path.parent).as_posix().encode() + b"\0")
        try:
            h.update(source.read_bytes())
        except OSError:  # a file removed while we read: its absence is part of the digest
            h.update(b"<unreadable>")
        h.update(b"\0")
    return h.hexdigest()


@functools.cache
def _distribution_version(module_name: str) -> str:
    """The installed version of the distribution named like the module's top-level package, if any:
    a release of a package whose sources are outside the step's folder changes the step's version."""
    top = module_name.split(".", 1)[0]
    for name in (top, top.replace("_", "-")):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return ""


def versions_from_metadata(value: Any) -> dict[str, StepCode]:
    """The versions a job's metadata carries (``CODE_VERSIONS_KEY``), as :class:`StepCode`."""
    raw = getattr(value, "value", value) or {}
    return {str(step): StepCode.from_json(code) for step, code in dict(raw).items()}


# --- pins ---------------------------------------------------------------------------------------------


class CodePins:
    """The ``durable_batch_code`` table: (batch, step) -> the code version the batch runs on."""

    def __init__(self, db: DurableDatabase) -> None:
        self.db = db

    def pin(self, batch_id: str, deployed: Mapping[str, StepCode]) -> dict[str, CodePin]:
        """Pin ``deployed`` for every step the batch has not pinned yet; the pins in force.

        Insert-if-absent: the first run of a batch pins all its steps at once, and a step added by a
        later release is pinned when it first runs.
        """
        t = now()
        with self.db.transaction() as conn:
            if deployed:
                conn.execute(
                    self.db.insert_ignore(batch_code),
                    [
                        {
                            "batch_id": batch_id,
                            "step": step,
                            "version": code.version,
                            "declared": code.declared,
                            "pinned_at": t,
                        }
                        for step, code in sorted(deployed.items())
                    ],
                )
            return self._read(conn, batch_id)

    def get(self, batch_id: str) -> dict[str, CodePin]:
        with self.db.read() as conn:
            return self._read(conn, batch_id)

    def note_seen(self, batch_id: str, changes: Iterable[CodeChange]) -> None:
        """Record what a refused resume saw deployed, so ``job status`` can say the code changed."""
        t = now()
        self._update(batch_id, {c.step: {"seen_version": c.deployed.version, "seen_at": t} for c in changes})

    def clear_seen(self, batch_id: str, steps: Iterable[str]) -> None:
        """A run found these steps on the batch's own code again (the old release is back)."""
        self._update(batch_id, {step: {"seen_version": None, "seen_at": None} for step in steps})

    def accept(self, batch_id: str, changes: Iterable[CodeChange]) -> None:
        """A person's ``--accept-code-change``: the deployed versions become the batch's, recording
        when and what they replaced. The ledger's per-item check still holds after this."""
        t = now()
        self._update(
            batch_id,
            {
                c.step: {
                    "version": c.deployed.version,
                    "declared": c.deployed.declared,
                    "accepted_at": t,
                    "accepted_from": c.pinned.version,
                    "seen_version": None,
                    "seen_at": None,
                }
                for c in changes
            },
        )

    def _update(self, batch_id: str, values_by_step: Mapping[str, Mapping[str, Any]]) -> None:
        """Set columns of some steps' pins, in one transaction."""
        if not values_by_step:
            return
        c = batch_code.c
        with self.db.transaction() as conn:
            for step, values in values_by_step.items():
                conn.execute(
                    batch_code.update().where(c.batch_id == batch_id, c.step == step).values(**values)
                )

    @staticmethod
    def _read(conn: sa.Connection, batch_id: str) -> dict[str, CodePin]:
        rows = conn.execute(sa.select(batch_code).where(batch_code.c.batch_id == batch_id)).all()
        return {
            row.step: CodePin(
                step=row.step,
                code=StepCode(row.version, bool(row.declared)),
                pinned_at=row.pinned_at,
                seen_version=row.seen_version,
                seen_at=row.seen_at,
                accepted_at=row.accepted_at,
                accepted_from=row.accepted_from,
            )
            for row in rows
        }


def code_changes(
    pins: Mapping[str, CodePin],
    deployed: Mapping[str, StepCode],
    steps: Iterable[str],
    has_effects: Callable[[str], bool],
) -> list[CodeChange]:
    """The changes among ``steps`` (the ones about to run); a step the batch never pinned has none."""
    out = []
    for step in steps:
        pin, now_deployed = pins.get(step), deployed.get(step)
        if pin is None or now_deployed is None or pin.code.version == now_deployed.version:
            continue
        out.append(CodeChange(step, pin.code, now_deployed, has_effects(step)))
    return out


def effects_recorded(db: DurableDatabase, batch_id: str, scope: str | None, run_ids: Sequence[str]) -> bool:
    """Whether the batch has any effect in ``scope`` recorded: an item's key (``durable_batch_items``)
    or, for a batch from before items were recorded, a ledger row one of its runs wrote."""
    if not scope:
        return False
    with db.read() as conn:
        item = conn.execute(
            sa.select(batch_items.c.item)
            .where(batch_items.c.batch_id == batch_id, batch_items.c.scope == scope)
            .limit(1)
        ).first()
        if item is not None:
            return True
        if not run_ids:
            return False
        row = conn.execute(
            sa.select(idempotency.c.key)
            .where(idempotency.c.scope == scope, idempotency.c.owner_run.in_(list(run_ids)))
            .limit(1)
        ).first()
        return row is not None


def refusal(batch_id: str, changes: Sequence[CodeChange]) -> str:
    """The one line a refused resume says: which steps, both versions, and the two ways forward."""
    return (
        f"batch {batch_id!r} started on other code: {'; '.join(c.describe() for c in changes)}. "
        f"Deploy the code the batch started with and resume it, or, once you know the change keeps "
        f"every key and subject, `job resume --id {batch_id} --accept-code-change` (a step that would "
        "derive another key for an item still stops before sending)"
    )
