"""The settings sections: every variable parsed, bounded and named in its error; the README's
Configuration table is the same list (names, defaults, descriptions), so the two cannot drift."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from durable_assets import settings as settings_module
from durable_assets.configuration import SECTIONS, readme_table
from durable_assets.errors import UsageError
from durable_assets.kit.settings import CrashHooks, KitSettings
from durable_assets.ops.settings import ApiSettings, AutoResumeSettings, RetentionSettings, WebhookVariables
from durable_assets.refunds.settings import RefundSettings
from durable_assets.settings import InstanceSettings, Section, default_text, variable

REPO = Path(__file__).resolve().parent.parent


def _section_of(name: str) -> type[Section]:
    """The section that declares variable ``name`` (each is declared once)."""
    owners = [s for s in SECTIONS if name in {variable(f) for f in s.variables().values()}]
    assert len(owners) == 1, (name, owners)
    return owners[0]


def test_defaults_need_no_environment() -> None:
    for section in SECTIONS:
        assert section.from_env({}) == section()
    kit = KitSettings.from_env({})
    assert (kit.concurrency, kit.lease_ttl_s, kit.rate_limit, WebhookVariables().urls) == (16, 15.0, None, ())
    assert InstanceSettings.from_env({}).code_location == "durable_assets.definitions"


def test_every_variable_is_declared_once() -> None:
    names = [variable(f) for s in SECTIONS for f in s.variables().values()]
    # 52 documented (DURABLE_SCHEDULE_EXECUTOR and 5 of storage: #24; DURABLE_API_MAX_STALLED_PER_CLIENT:
    # #34; DURABLE_WORKER_DB_POOL: #35), 2 test hooks
    assert len(names) == len(set(names)) == 54
    assert set(SECTIONS) == {s for s in Section.registered if s.__module__.startswith("durable_assets.")}


@pytest.mark.parametrize(
    ("name", "raw", "field", "value"),
    [
        ("DURABLE_CONCURRENCY", " 4 ", "concurrency", 4),
        ("DURABLE_RATE_LIMIT", "2.5", "rate_limit", 2.5),
        ("DURABLE_STEP_DELAY_S", "0", "step_delay_s", 0.0),
        ("DURABLE_AUTO_RESUME_MAX_ATTEMPTS", "0", "max_attempts", 0),
        (
            "DURABLE_WEBHOOK_URLS",
            " http://a/h, https://b/h ,,",
            "urls",
            ("http://a/h", "https://b/h"),
        ),
        ("DURABLE_RETENTION_SCHEDULE", "Stopped", "schedule", "stopped"),
        ("DURABLE_CRASH_AT", " after_intent_commit:37 ", "crash_at", " after_intent_commit:37 "),
        ("DURABLE_CRASH_COUNTS", "/tmp/counts", "crash_counts", "/tmp/counts"),
        ("DURABLE_API_TOKEN", "s3cret", "token", "s3cret"),
        ("DURABLE_CODE_LOCATION", "  ", "code_location", "durable_assets.definitions"),  # blank = unset
    ],
)
def test_values_are_parsed_as_their_type(name: str, raw: str, field: str, value: object) -> None:
    assert getattr(_section_of(name).from_env({name: raw}), field) == value


@pytest.mark.parametrize(
    ("name", "raw", "says"),
    [
        # the CLI's wording since check_worker_env (tests/ops/test_cli_errors.py checks it end to end)
        ("DURABLE_LEASE_TTL_S", "abc", "DURABLE_LEASE_TTL_S='abc' is not a number; fix or unset it"),
        ("DURABLE_CONCURRENCY", "many", "DURABLE_CONCURRENCY='many' is not a whole number; fix or unset it"),
        ("DURABLE_CONCURRENCY", "2.5", "is not a whole number"),
        (
            "DURABLE_LEASE_TTL_S",
            "0",
            "DURABLE_LEASE_TTL_S='0' is out of range: use a number > 0, or unset it",
        ),
        ("DURABLE_LEASE_TTL_S", "inf", "is out of range: use a number > 0"),
        ("DURABLE_STEP_DELAY_S", "nan", "is out of range: use a number >= 0"),
        ("DURABLE_MAX_REFUNDS_PER_BATCH", "-1", "use a whole number >= 0, or unset it"),
        ("DURABLE_CONCURRENCY", "0", "use a whole number >= 1 and <= 256"),
        ("DURABLE_CONCURRENCY", "257", "use a whole number >= 1 and <= 256"),
        ("DURABLE_API_MAX_STREAMS", "0", "DURABLE_API_MAX_STREAMS='0' is out of range"),
        ("DURABLE_RETENTION_FAILED_DAYS", "soon", "DURABLE_RETENTION_FAILED_DAYS='soon' is not a number"),
        ("DURABLE_WEBHOOK_MAX_ATTEMPTS", "0", "use a whole number >= 1"),
        ("DURABLE_RETENTION_SCHEDULE", "off", "is not one of: running, stopped"),
        ("DURABLE_AUTO_RESUME_MAX_ATTEMPTS", "maybe", "is not a whole number"),
    ],
)
def test_a_bad_value_is_one_usage_error_naming_the_variable_and_the_range(
    name: str, raw: str, says: str
) -> None:
    with pytest.raises(UsageError) as raised:
        _section_of(name).from_env({name: raw})
    assert says in str(raised.value)
    assert str(raised.value).startswith(f"{name}=")
    assert raised.value.exit_code == 2


def test_bounds_hold_for_direct_construction_too() -> None:
    with pytest.raises(ValueError):
        KitSettings(lease_ttl_s=0)
    with pytest.raises(ValueError):
        KitSettings(step_delay_s=float("inf"))
    with pytest.raises(ValueError):
        RefundSettings(max_refunds_per_batch=-1)
    frozen = KitSettings()
    with pytest.raises(ValueError):
        frozen.concurrency = 5  # type: ignore[misc]


def test_secrets_stay_out_of_the_repr() -> None:
    env = {
        "DURABLE_API_TOKEN": "tok-123",
        "STRIPE_API_KEY": "sk_test_456",
        "DURABLE_WEBHOOK_SECRET": "whsec_x",
    }
    for section in (*SECTIONS, ApiSettings):
        shown = repr(section.from_env(env))
        assert "tok-123" not in shown and "sk_test_456" not in shown and "whsec_x" not in shown


def test_current_follows_the_environment_and_never_caches_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DURABLE_LEASE_TTL_S", "3")
    assert KitSettings.current().lease_ttl_s == 3.0
    assert (
        KitSettings.current() is KitSettings.current()
    )  # unchanged environment: the parsed object is reused
    monkeypatch.setenv("DURABLE_LEASE_TTL_S", "4.5")
    assert KitSettings.current().lease_ttl_s == 4.5
    monkeypatch.setenv("DURABLE_LEASE_TTL_S", "x")
    for _ in range(2):
        with pytest.raises(UsageError, match="DURABLE_LEASE_TTL_S='x'"):
            KitSettings.current()
    assert RetentionSettings.current().completed_days == 30.0  # another section is not concerned
    monkeypatch.delenv("DURABLE_LEASE_TTL_S")
    assert KitSettings.current().lease_ttl_s == 15.0
    assert AutoResumeSettings.from_env({"DURABLE_LEASE_TTL_S": "9"}).lease_ttl_s == 9.0


def test_every_variable_is_read_here_only() -> None:
    """No module reads os.environ for a variable of ours: it asks its section (kit/schedules.py
    reads a job's own ``input_env`` by name, kit/guardrails.py the variables a job's own guardrail
    resource names; ops/instance.py checks the variables an instance's own dagster.yaml names, such
    as DAGSTER_PG_URL, before Dagster reads them). Nothing writes one: the CLI opens its instance
    from the folder it resolved and hands it to its children (``settings.child_environment``), and
    the registry keeps the location a process built."""
    package = REPO / "durable_assets"
    allowed = {
        "settings.py",
        "kit/schedules.py",
        "kit/guardrails.py",
        "ops/instance.py",
    }
    readers = []
    for path in sorted(package.rglob("*.py")):
        where = str(path.relative_to(package))
        tree = ast.parse(path.read_text())
        reads = [
            node
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv")
        ]
        if reads and where not in allowed:
            readers.append(where)
    assert readers == []
    writes = [
        str(path.relative_to(package))
        for path in sorted(package.rglob("*.py"))
        if re.search(
            r"os\.environ\[[^]]+\]\s*=|os\.(putenv|environ\.(update|setdefault))\(", path.read_text()
        )
    ]
    assert writes == []


# --- the README table ---------------------------------------------------------------------------


def _readme_rows() -> list[tuple[str, str, str]]:
    text = (REPO / "README.md").read_text()
    section = text.split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    table = [line for line in section.splitlines() if line.startswith("|")]
    assert table[0] == "| variable | default | meaning |", table[0]
    rows = []
    for line in table[2:]:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip("|"))]
        assert len(cells) == 3, line
        name = re.fullmatch(r"`([A-Z0-9_]+)`", cells[0])
        assert name, f"one variable per row, in backticks: {line}"
        rows.append((name.group(1), cells[1], cells[2]))
    return rows


def test_the_readme_table_lists_every_variable_with_its_default_and_description() -> None:
    fields = [f for section in SECTIONS for f in section.public_fields().values()]
    rows = _readme_rows()
    hint = "regenerate the table: .venv/bin/python -m durable_assets.configuration"
    assert [r[0] for r in rows] == [variable(f) for f in fields], hint
    for (name, default, meaning), info in zip(rows, fields, strict=True):
        assert default == default_text(info), f"{name}: {hint}"
        assert meaning == info.description, f"{name}: {hint}"
        if isinstance(info.default, int | float) and not isinstance(info.default, bool):
            assert float(default) == info.default, name
        else:
            assert info.default in (None, (), False) or default == f"`{info.default}`", name


def test_the_readme_table_is_what_the_module_prints() -> None:
    text = (REPO / "README.md").read_text()
    assert readme_table() in text


def test_test_hooks_are_kept_out_of_the_readme() -> None:
    hooks = {n for s in SECTIONS for n in set(s.variables()) - set(s.public_fields())}
    assert hooks == {"crash_at", "crash_counts"} == set(CrashHooks.variables())
    table = readme_table()
    assert "DURABLE_CRASH_AT" not in table and "DURABLE_CRASH_COUNTS" not in table


def test_settings_imports_nothing_of_ours_but_the_errors() -> None:
    tree = ast.parse(Path(settings_module.__file__).read_text())
    ours = {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("durable_assets")
    } | {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if alias.name.startswith("durable_assets")
    }
    assert ours == {"durable_assets.errors"}
