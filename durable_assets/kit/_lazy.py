"""Names of a face of the kit imported on first use, from a table the face declares.

Why lazy: a process that needs one small module (the CLI's ``--executor`` choices for a usage
error) must not pay for Dagster and pandas by importing a face (issue #25: a usage error answers
at once). Each face lists its names twice, as ``TYPE_CHECKING`` imports for mypy and readers and
as this table for the interpreter; ``tests/test_architecture.py`` checks the two agree.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(
    face: str, sources: Mapping[str, tuple[str, ...]], modules: Mapping[str, str] | None = None
) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """``(__all__, __getattr__, __dir__)`` for the module ``face``, whose names come from
    ``sources`` (module: the names it gives) and ``modules`` (name: a whole module the face
    offers, so ``kit.tables`` works after ``from durable_assets import kit``). A looked-up name is
    stored on the face, so the next lookup is an ordinary attribute read."""
    modules = dict(modules or {})
    where = {name: module for module, names in sources.items() for name in names}
    where.update(modules)
    faces = importlib.import_module(face)

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {face!r} has no attribute {name!r}")
        imported = importlib.import_module(module)
        value = imported if name in modules else getattr(imported, name)
        setattr(faces, name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(faces), *where})

    return sorted(where), __getattr__, __dir__
