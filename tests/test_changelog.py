"""CHANGELOG.md's table of moved names is what a job author follows to update their imports, so
every name it says moved must really be where it says, and gone from the author face."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import durable_assets.kit as kit

CHANGELOG = Path(__file__).resolve().parents[1] / "CHANGELOG.md"

#: The "now" column's places that hold the moved names under the same name.
_PLACES = {
    "`kit.tables.X`": "durable_assets.kit.tables",
    "`kit.reports.X`": "durable_assets.kit.reports",
    "`kit.errors.X`": "durable_assets.errors",
    "`durable_assets.kit.runtime`": "durable_assets.kit.runtime",
}


def _moved_rows() -> list[tuple[list[str], str]]:
    rows = []
    for line in CHANGELOG.read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 2:
            continue
        for marker, module in _PLACES.items():
            if cells[1].startswith(marker):
                rows.append((re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", cells[0]), module))
    return rows


def test_every_moved_name_is_where_the_changelog_says() -> None:
    rows = _moved_rows()
    assert {module for _, module in rows} == set(_PLACES.values())
    for names, module in rows:
        place = importlib.import_module(module)
        for name in names:
            assert hasattr(place, name), f"{name} is not in {module}"
            assert name not in kit.__all__, f"{name} is still on the author face"


def test_the_author_face_the_changelog_counts() -> None:
    assert f"{len(kit.__all__)} names, three of" in CHANGELOG.read_text(encoding="utf-8")
