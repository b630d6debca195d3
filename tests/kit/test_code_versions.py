"""The code a batch started with (kit/code_versions.py) and each item's key (the ledger's record):
versions that follow the source a key depends on, the rule for which change stops a step, and the
per-item check that holds whatever the versions say, on both backends."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_assets.errors import IdempotencyKeyMismatchError, KeyDriftError
from durable_assets.kit.code_versions import (
    FINGERPRINT_PREFIX,
    CodeChange,
    CodePins,
    StepCode,
    _source_digest,
    code_changes,
)
from durable_assets.kit.db import DurableDatabase
from durable_assets.kit.effects import EffectRunner
from durable_assets.kit.ledger import Intent, Ledger, unambiguous_items

JOB = """
from dagster import AssetExecutionContext, DynamicPartitionsDefinition
from durable_assets.kit import DurableJob, durable_asset

BATCHES = DynamicPartitionsDefinition(name="b")


@durable_asset(label="One", partitions_def=BATCHES)
def one(context: AssetExecutionContext) -> int:
    return 1


@durable_asset(label="Two", partitions_def=BATCHES, effect_scope="two"{declared})
def two(context: AssetExecutionContext, one: int) -> int:
    return one + 1


job = DurableJob("versions_job", assets=[one, two], partitions=BATCHES, description="x")
"""


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A package ``vpkg`` with a job module and a keys module beside it, importable afresh."""
    root = tmp_path / "src"
    (root / "vpkg").mkdir(parents=True)
    (root / "vpkg" / "__init__.py").write_text("")
    (root / "vpkg" / "keys.py").write_text("def key(x):\n    return f'k:{x}'\n")
    monkeypatch.syspath_prepend(str(root))
    yield root / "vpkg"
    for name in [m for m in sys.modules if m == "vpkg" or m.startswith("vpkg.")]:
        del sys.modules[name]


def _versions(package: Path, declared: str = "") -> dict[str, StepCode]:
    (package / "job.py").write_text(JOB.format(declared=declared))
    for name in [m for m in sys.modules if m.startswith("vpkg.")]:
        del sys.modules[name]
    _source_digest.cache_clear()
    return dict(importlib.import_module("vpkg.job").job.code_versions)


def test_a_change_beside_the_step_changes_its_version(package: Path) -> None:
    before = _versions(package)
    assert set(before) == {"one", "two"}
    assert all(v.version.startswith(FINGERPRINT_PREFIX) and not v.declared for v in before.values())
    assert before["one"] != before["two"]  # each step its own version
    assert _versions(package) == before  # stable across imports
    (package / "keys.py").write_text("def key(x):\n    return f'key:{x}'\n")  # only the key function
    after = _versions(package)
    assert after["two"] != before["two"] and after["one"] != before["one"]


def test_a_declared_code_version_is_the_steps_version(package: Path) -> None:
    versions = _versions(package, declared=', code_version="7"')
    assert versions["two"] == StepCode("7", declared=True)
    (package / "keys.py").write_text("# the author says nothing changed\n")
    assert _versions(package, declared=', code_version="7"')["two"] == StepCode("7", declared=True)


def _pin(step: str, version: str, declared: bool = False) -> object:
    from durable_assets.kit.code_versions import CodePin

    return CodePin(step, StepCode(version, declared), pinned_at=0.0)


def test_which_change_only_a_person_may_cross() -> None:
    pins = {"a": _pin("a", "fp-1"), "b": _pin("b", "fp-2"), "c": _pin("c", "1", declared=True)}
    deployed = {"a": StepCode("fp-1"), "b": StepCode("fp-9"), "c": StepCode("2", declared=True)}
    effects = {"b": False, "c": False}
    changes = code_changes(pins, deployed, ["a", "b", "c", "new"], lambda s: effects[s])  # type: ignore[arg-type]
    assert [(c.step, c.stops) for c in changes] == [("b", False), ("c", True)]
    with_effects = CodeChange("b", StepCode("fp-2"), StepCode("fp-9"), has_effects=True)
    assert with_effects.stops and "recorded effects" in with_effects.describe()


def test_pins_are_kept_noted_and_accepted(durable_db_url: str) -> None:
    pins = CodePins(DurableDatabase(durable_db_url))
    first = pins.pin("b1", {"a": StepCode("fp-1"), "b": StepCode("fp-2")})
    again = pins.pin("b1", {"a": StepCode("fp-8"), "b": StepCode("fp-9"), "c": StepCode("fp-3")})
    assert {s: p.code.version for s, p in again.items()} == {"a": "fp-1", "b": "fp-2", "c": "fp-3"}
    assert again["a"].pinned_at == first["a"].pinned_at
    change = CodeChange("b", StepCode("fp-2"), StepCode("fp-9"), has_effects=True)
    pins.note_seen("b1", [change])
    assert pins.get("b1")["b"].seen_version == "fp-9"
    pins.accept("b1", [change])
    b = pins.get("b1")["b"]
    assert (b.code.version, b.accepted_from, b.seen_version) == ("fp-9", "fp-2", None)
    assert b.accepted_at is not None


def test_a_key_spelled_anew_for_a_recorded_item_is_drift(durable_db_url: str) -> None:
    ledger = Ledger(DurableDatabase(durable_db_url))
    old = [Intent(f"old-{i}", {"n": i}, subject=f"s{i}") for i in range(3)]
    ledger.claim("scope", old, owner="run-1", batch_id="b1")
    assert ledger.item_drift("b1", "scope", unambiguous_items(old)) == []
    respelled = [Intent(f"new-{i}", {"n": i}, subject=f"s{i}") for i in range(3)]
    drift = ledger.item_drift("b1", "scope", unambiguous_items(respelled))
    assert [(d.recorded_key, d.key) for d in drift] == [(f"old-{i}", f"new-{i}") for i in range(3)]
    resubjected = [Intent(f"old-{i}", {"n": i}, subject=f"charge-{i}") for i in range(3)]
    assert (
        "subject s0 then, charge-0 now"
        in ledger.item_drift("b1", "scope", unambiguous_items(resubjected))[0].describe()
    )
    both = [Intent(f"new-{i}", {"n": i}, subject=f"charge-{i}") for i in range(3)]
    assert (
        ledger.item_drift("b1", "scope", unambiguous_items(both))[0]
        .describe()
        .endswith(": key old-0 then, new-0 now; subject s0 then, charge-0 now")
    )
    # Another batch with the same items has its own record; a named item survives changed params.
    assert ledger.item_drift("b2", "scope", unambiguous_items(respelled)) == []
    named = [Intent("k-1", {"v": 1}, item="invoice-1")]
    ledger.claim("named", named, owner="run-1", batch_id="b1")
    later = [Intent("k-1b", {"v": 1, "added": True}, item="invoice-1")]
    assert [d.item for d in ledger.item_drift("b1", "named", unambiguous_items(later))] == ["invoice-1"]


def test_an_effect_runner_with_drift_sends_nothing(durable_db_url: str) -> None:
    ledger = Ledger(DurableDatabase(durable_db_url))
    sent: list[str] = []

    def runner() -> EffectRunner:
        return EffectRunner(
            ledger=ledger,
            scope="cards",
            owner="run-1",
            perform=lambda i: sent.append(i.key) or {"ok": True},
            batch_id="b1",
        )

    runner().run([Intent(f"card:{n}", {"to": n}) for n in "abc"])
    assert sorted(sent) == ["card:a", "card:b", "card:c"]
    sent.clear()
    with pytest.raises(
        KeyDriftError,
        match=r"3 of this batch's cards items .* \(e\.g\. item \{\"to\":\"a\"\}: key card:a then, "
        r"postcard:a now\)",
    ):
        runner().run([Intent(f"postcard:{n}", {"to": n}) for n in "abcd"])
    assert sent == []  # not even the new item "d"
    runner().run([Intent(f"card:{n}", {"to": n}) for n in "abcd"])
    assert sent == ["card:d"]


def test_two_keys_for_one_named_item_are_refused_and_unnamed_twins_are_left_out() -> None:
    with pytest.raises(IdempotencyKeyMismatchError, match="stands for two keys"):
        unambiguous_items([Intent("a", {"x": 1}, item="i"), Intent("b", {"x": 2}, item="i")])
    twins = unambiguous_items([Intent("a", {"x": 1}), Intent("b", {"x": 1}), Intent("c", {"x": 2})])
    assert [i.key for i in twins.values()] == ["c"]
