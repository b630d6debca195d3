"""The layers stay layers: the kit and the operations layer never import a pipeline.

Read from the source (``ast``), not from ``sys.modules``, so a lazy import inside a function counts
too. The rules:

- ``errors`` (the one exception hierarchy) imports nothing of ours: every layer can raise and
  catch by type, and a usage error at the CLI needs neither Dagster nor the kit.
- ``settings`` (the settings machinery and the instance's variables) imports only the errors;
  each layer and pipeline declares its own section on top of it.
- ``kit`` imports only the kit, ``durable_assets.errors``, ``durable_assets.settings`` and
  third-party code: it is the library users build on.
- the kit has two declared faces: the author face ``durable_assets.kit`` (at most 30 names, with
  the named modules ``kit.tables``, ``kit.reports`` and ``kit.errors``) and the runtime face
  ``durable_assets.kit.runtime``. Every other kit module is private to the kit.
- ``ops`` (CLI, HTTP API, webhooks, metrics, retention) imports the kit through its two faces and
  the provider adapter, never a pipeline: it finds jobs through the registry, so it serves any
  registered job.
- a pipeline imports the kit only through its author face (``from durable_assets.kit import X``
  with ``X`` in ``__all__``, or a named module's ``__all__``), never ``ops``, and never another
  pipeline.
- ``payments`` (the provider: store, embedded, gateway) imports the kit through its two faces and
  neither ops nor a pipeline.
- ``durable_assets_testing`` (development tools: the HTTP simulator) sits outside the runtime: it
  may import the provider and the errors, and nothing under ``durable_assets`` imports it but
  ``job provider serve``, lazily, inside the function that runs that command.
- ``location`` (a code location's ``Definitions``: the kit's jobs with the operations layer's daemon
  parts) sits above both and imports no pipeline and no provider; nothing imports it but code
  locations (``durable_assets/definitions.py``, a user's module), so no layer can reach it.
- ``configuration`` (the README's table, collected from every layer's and pipeline's section)
  sits above everything; nothing in the package imports it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import durable_assets.kit
import durable_assets.kit.reports
import durable_assets.kit.runtime
import durable_assets.kit.tables
from tests.support.machine import scaled

PACKAGE = Path(durable_assets.kit.__file__).parent.parent
TESTING = PACKAGE.parent / "durable_assets_testing"
PIPELINES = ("refunds", "credit_migration")


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names) for every import in the file; relative imports resolved against the package."""
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.extend((alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module == "durable_assets":
            # ``from durable_assets import kit`` imports the module ``durable_assets.kit``.
            found.extend((f"durable_assets.{alias.name}", []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.module, [alias.name for alias in node.names]))
    return [(m, names) for m, names in found if m == "durable_assets" or m.startswith("durable_assets.")]


def _modules(layer: str) -> list[Path]:
    single = PACKAGE / f"{layer}.py"
    return [single] if single.is_file() else sorted((PACKAGE / layer).rglob("*.py"))


def _layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _violations(layer: str, allowed: set[str]) -> list[str]:
    return [
        f"{path.relative_to(PACKAGE.parent)} imports {module}"
        for path in _modules(layer)
        for module, _names in _imports(path)
        if _layer_of(module) not in allowed
    ]


def test_the_kit_imports_only_itself() -> None:
    assert _modules("kit")
    assert _violations("kit", {"kit", "settings", "errors"}) == []


def test_errors_and_settings_are_at_the_bottom() -> None:
    assert _violations("errors", set()) == []
    assert _violations("settings", {"errors"}) == []


def test_the_operations_layer_never_imports_a_pipeline() -> None:
    assert _modules("ops")
    assert _violations("ops", {"kit", "ops", "payments", "settings", "errors"}) == []


def test_the_provider_imports_no_pipeline_and_no_operations() -> None:
    assert _violations("payments", {"kit", "payments", "settings", "errors"}) == []


def test_the_location_is_above_the_kit_and_the_operations_layer() -> None:
    assert _violations("location", {"kit", "ops", "settings", "errors"}) == []
    importers = [
        f"{path.relative_to(PACKAGE.parent)}"
        for layer in ("kit", "ops", "payments", "settings", "errors", *PIPELINES)
        for path in _modules(layer)
        for module, _names in _imports(path)
        if _layer_of(module) == "location"
    ]
    assert importers == []


def test_the_configuration_table_is_above_everything() -> None:
    importers = [
        f"{path.relative_to(PACKAGE.parent)}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for module, _names in _imports(path)
        if _layer_of(module) == "configuration"
    ]
    assert importers == []


#: The kit's only readers of the environment, and why each must read it itself. Every other value
#: reaches kit code through resource and executor config, set where a code location is wired
#: (``durable_assets.location.definitions``), so a job author sees each knob where it is passed.
_KIT_ENVIRONMENT_READERS = {
    # A test hook: every process (a run worker, a Celery task's child) arms itself from
    # DURABLE_CRASH_AT on its first crash point; no config reaches a process before that.
    "crashpoints.py",
    # The Celery app (DURABLE_BROKER_URL, DURABLE_BROKER_QUEUE): a `job worker` and a run's
    # orchestrator must meet on the same broker, and the URL's password must not travel in config.
    "celery_app.py",
    # A DailyBatches schedule reads the input variable its job names (``input_env``) at each tick.
    "schedules.py",
    # `job resume` compares a guardrail resource's EnvVar-configured fields with this shell's.
    "guardrails.py",
}


def _reads_environment(node: ast.AST) -> bool:
    """``os.environ``, ``os.getenv``, or a settings section read (``XSettings.current()``,
    ``XSettings.from_env()``); a ``current`` of anything else (a schema's revision) is not one."""
    if not isinstance(node, ast.Attribute):
        return False
    if node.attr in ("environ", "getenv"):
        return True
    section = isinstance(node.value, ast.Name) and node.value.id.endswith(("Settings", "Hooks"))
    return node.attr in ("current", "from_env") and section


def test_the_kit_reads_the_environment_only_where_listed() -> None:
    readers = set()
    for path in _modules("kit"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if _reads_environment(node):
                readers.add(str(path.relative_to(PACKAGE / "kit")))
    assert readers == _KIT_ENVIRONMENT_READERS


#: The author face's named modules: ``from durable_assets.kit import tables`` or ``kit.tables.X``.
AUTHOR_MODULES = {"tables": durable_assets.kit.tables, "reports": durable_assets.kit.reports}
FACES = (durable_assets.kit, durable_assets.kit.runtime)


def _kit_misuse(path: Path, *, runtime: bool) -> list[str]:
    """What ``path`` takes from the kit outside its faces: ``from durable_assets.kit[.tables |
    .reports | .runtime] import X`` with X not offered there, any other kit module, or ``kit.X``
    (and ``kit.tables.X``) read as an attribute. ``runtime``: whether the runtime face is allowed."""
    public = set(durable_assets.kit.__all__)
    wrong = []
    for module, names in _imports(path):
        offered = public if module == "durable_assets.kit" else None
        if runtime and module == "durable_assets.kit.runtime":
            offered = set(durable_assets.kit.runtime.__all__)
        if module.removeprefix("durable_assets.kit.") in AUTHOR_MODULES:
            offered = set(AUTHOR_MODULES[module.removeprefix("durable_assets.kit.")].__all__)
        if _layer_of(module) == "kit" and (offered is None or not set(names) <= offered):
            wrong.append(f"{module} {sorted(set(names) - (offered or set())) or '(a private module)'}")
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        if isinstance(node.value, ast.Name) and node.value.id == "kit" and node.attr not in public:
            wrong.append(f"kit.{node.attr}")
        inner = node.value
        if isinstance(inner, ast.Attribute) and isinstance(inner.value, ast.Name) and inner.value.id == "kit":
            named = AUTHOR_MODULES.get(inner.attr)
            if named is not None and node.attr not in named.__all__:
                wrong.append(f"kit.{inner.attr}.{node.attr}")
    return [f"{path.relative_to(PACKAGE.parent)}: {w}" for w in wrong]


@pytest.mark.parametrize("pipeline", [p for p in PIPELINES if (PACKAGE / p).is_dir()])
def test_a_pipeline_uses_only_the_kits_author_face(pipeline: str) -> None:
    wrong = [w for path in _modules(pipeline) for w in _kit_misuse(path, runtime=False)]
    for path in _modules(pipeline):
        wrong.extend(
            f"{path.relative_to(PACKAGE.parent)}: {module}"
            for module, _names in _imports(path)
            if _layer_of(module) not in ("kit", "payments", "settings", "errors", pipeline)
        )
    assert wrong == []


def test_the_author_face_is_at_most_30_names() -> None:
    """Issue #36: a job author learns one short list; tables and reports are named modules."""
    names = len(durable_assets.kit.__all__)
    assert names <= 30, durable_assets.kit.__all__
    readme = " ".join((PACKAGE.parent / "README.md").read_text().split())
    page = " ".join((PACKAGE.parent / "docs" / "your-own-job.md").read_text().split())
    assert f"`durable_assets.kit` ({names} names" in readme and f"author face is {names} names" in page


@pytest.mark.parametrize("layer", ["ops", "payments", "location", "definitions"])
def test_the_operations_layer_and_the_provider_reach_the_kit_only_through_its_two_faces(layer: str) -> None:
    """What ``ops/`` and ``payments/`` may rely on is declared in ``kit/runtime.py`` (and the author
    face); a kit module they reached directly could change under them without anyone noticing."""
    assert _modules(layer)
    assert [w for path in _modules(layer) for w in _kit_misuse(path, runtime=True)] == []


def test_each_face_is_importable_and_documented() -> None:
    for face in (*FACES, *AUTHOR_MODULES.values()):
        for name in face.__all__:
            value = getattr(face, name)
            ours = (getattr(value, "__module__", None) or "").startswith("durable_assets.")
            if callable(value) and not isinstance(value, str) and ours:  # Dagster documents its own
                assert (value.__doc__ or "").strip(), f"{face.__name__}.{name} has no docstring"


def _declared_imports(face: ModuleType) -> set[tuple[str, str]]:
    """(module, name) of the face's ``TYPE_CHECKING`` imports: what mypy and readers see."""
    tree = ast.parse(Path(str(face.__file__)).read_text())
    guard = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    found = set()
    for node in ast.walk(guard):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.update((node.module, alias.name) for alias in node.names)
    return found


@pytest.mark.parametrize("face", FACES, ids=lambda f: f.__name__)
def test_a_faces_lazy_names_are_what_it_declares(face: ModuleType) -> None:
    """Each face imports its names on first use (kit/_lazy.py) from its ``_SOURCES`` table: that
    table and the ``TYPE_CHECKING`` imports readers see name the same things, and nothing else
    is exported that way."""
    table = {(module, name) for module, names in face._SOURCES.items() for name in names}
    for name, module in getattr(face, "_MODULES", {}).items():
        parent, _, leaf = module.rpartition(".")
        table.add((parent, leaf))
        assert name == leaf
    assert _declared_imports(face) == table
    assert set(face.__all__) == {name for _module, name in table}
    assert "Nope" not in dir(face)
    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        face.Nope  # noqa: B018


def test_a_usage_error_imports_neither_dagster_nor_pandas() -> None:
    """Issue #25: `job` answers a usage error at once; importing Dagster alone takes seconds."""
    probe = (
        "import sys\n"
        "from durable_assets.ops import cli\n"
        "try:\n"
        "    cli.main(['run'])\n"
        "except SystemExit as exc:\n"
        "    assert exc.code == cli.EXIT_USAGE, exc.code\n"
        "heavy = sorted(m for m in ('dagster', 'pandas', 'sqlalchemy') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=scaled(60))
    assert done.returncode == 0, done.stderr
    assert "error: the following arguments are required" in done.stderr


#: Kit modules that no kit module or pipeline imports and that still serve a job author: Dagster
#: loads them by name from the instance's dagster.yaml (the launcher, the compute log manager) or
#: the job's executor config.
_LOADED_BY_DAGSTER = {"launcher", "compute_logs"}


def test_every_kit_module_is_reached_through_a_face() -> None:
    """A kit module no face offers and no kit module imports serves nobody: it is dead, or
    operator infrastructure that belongs in ``ops/``."""
    used: set[str] = set()
    for face in FACES:
        used.update(m.split(".")[2] for m in face._SOURCES if m.startswith("durable_assets.kit."))
    used.update(m.split(".")[-1] for m in durable_assets.kit._MODULES.values())
    for path in _modules("kit"):
        for module, names in _imports(path):
            if module.startswith("durable_assets.kit."):
                used.add(module.split(".")[2])
            elif module == "durable_assets.kit":
                used.update(names)
    kit = PACKAGE / "kit"
    modules = {p.stem for p in kit.glob("*.py") if p.stem not in ("__init__", "runtime", "_lazy")}
    unused = sorted(modules - used - _LOADED_BY_DAGSTER)
    assert unused == [], f"kit modules no face reaches (move them to ops/ or offer them): {unused}"


def _testing_imports(path: Path) -> list[tuple[str, str]]:
    """(module, enclosing function or ``<module>``) for every import of ``durable_assets_testing``."""
    found: list[tuple[str, str]] = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            modules: list[str] = []
            if isinstance(child, ast.Import):
                modules = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom) and child.module:
                modules = [child.module]
            found.extend((m, function) for m in modules if m.split(".")[0] == "durable_assets_testing")
            scope = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else function
            visit(child, scope)

    visit(ast.parse(path.read_text(), str(path)), "<module>")
    return found


#: The one way the runtime reaches the testing package: `job provider serve` loads the simulator
#: inside the function that dispatches the command, so no other command (and no import) loads it.
_SIMULATOR_COMMAND = ("durable_assets/ops/cli.py", "durable_assets_testing.simulator", "_dispatch")


def test_the_runtime_never_imports_the_testing_package() -> None:
    found = [
        (str(path.relative_to(PACKAGE.parent)), module, function)
        for path in sorted(PACKAGE.rglob("*.py"))
        for module, function in _testing_imports(path)
    ]
    assert set(found) <= {_SIMULATOR_COMMAND}, found
    assert found, "job provider serve no longer imports the simulator: update this rule"


def test_the_testing_package_imports_only_the_provider_and_the_errors() -> None:
    wrong = [
        f"{path.relative_to(PACKAGE.parent)} imports {module}"
        for path in sorted(TESTING.rglob("*.py"))
        for module, _names in _imports(path)
        if _layer_of(module) not in ("payments", "errors")
    ]
    assert sorted(TESTING.rglob("*.py"))
    assert wrong == []


#: The database layer: the one place that knows which backend it runs on (locking reads, the
#: clock, inserts that skip or update, advisory locks), and the revisions written for each backend.
_BACKEND_AWARE = ("kit/db.py", "kit/schema_migrations.py", "kit/migrations/")


def _names_the_backend(node: ast.AST) -> bool:
    if isinstance(node, ast.Attribute) and node.attr == "is_postgres":
        return True
    if isinstance(node, ast.Attribute) and node.attr == "name":  # ``conn.dialect.name``
        return isinstance(node.value, ast.Attribute) and node.value.attr == "dialect"
    return isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sqlalchemy.dialects")


def test_no_module_outside_the_database_layer_names_the_backend() -> None:
    """Issue #36: what differs between SQLite and Postgres sits behind ``DurableDatabase``
    (``insert_ignore``, ``upsert``, ``clock``, ``lock_rows_in_order``); a module that branches on
    the backend itself is one more place a third backend, or a fix, would have to find."""
    wrong = sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if not str(path.relative_to(PACKAGE)).startswith(_BACKEND_AWARE)
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if _names_the_backend(node)
    )
    assert wrong == []
