"""README's architecture map names every module, so it cannot go stale unnoticed (issue #36).

The map is the fenced block that opens with ``durable_assets/``. A package's section runs from its
``  name/`` line to the next line at the same indent; every module of the package (its
subpackages' too, except Alembic's ``migrations/``) must be named there as ``file.py``.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.processes import REPO

README = REPO / "README.md"


def _map() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index("```\ndurable_assets/\n") + len("```\n")
    return text[start : text.index("\n```", start)]


def _sections(block: str) -> dict[str, str]:
    """``{"kit": text, ...}`` for each two-space-indented package line, and ``""`` for the rest."""
    sections: dict[str, list[str]] = {"": []}
    current = ""
    for line in block.splitlines():
        head = re.match(r"^ {2}(\w+)/", line)
        if head:
            current = head.group(1)
            sections[current] = []
        elif re.match(r"^ {0,2}\S", line):
            current = ""
        sections[current].append(line)
    return {name: "\n".join(lines) for name, lines in sections.items()}


def _modules(root: Path) -> list[Path]:
    return [
        p
        for p in sorted(root.rglob("*.py"))
        if p.name != "__init__.py" and "migrations" not in p.relative_to(root).parts
    ]


def test_the_readme_map_names_every_module() -> None:
    block = _map()
    sections = _sections(block)
    missing = []
    for root in (REPO / "durable_assets", REPO / "durable_assets_testing"):
        for path in _modules(root):
            rel = path.relative_to(root)
            if root.name == "durable_assets_testing":
                where = block[block.index("durable_assets_testing/") :]
            elif len(rel.parts) == 1:
                where = "\n".join(ln for ln in block.splitlines() if re.match(r"^ {2}\w", ln))
            else:
                where = sections.get(rel.parts[0], "")
            if not re.search(rf"(?<![\w/]){re.escape(path.name)}", where):
                missing.append(str(path.relative_to(REPO)))
    assert missing == [], f"README's architecture map does not name: {missing}"


def test_the_readme_map_names_no_module_that_is_gone() -> None:
    block = _map()
    named = set(re.findall(r"(?<![\w/])(\w+\.py)\b", block))
    existing = {
        p.name for root in ("durable_assets", "durable_assets_testing") for p in (REPO / root).rglob("*.py")
    }
    assert named - existing == set()
