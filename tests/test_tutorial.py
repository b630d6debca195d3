"""docs/your-own-job.md, executed: its code becomes a module, its job survives a SIGKILL.

The document's ``# file: postcards.py`` blocks are joined into ``postcards.py`` exactly as
printed, and ``job`` serves it through ``DURABLE_CODE_LOCATION`` with no other wiring. The kill
lands while cards go out (the shop's own table is polled for it); after ``job resume`` every
customer has exactly one card, counted in the shop's file, which outlives the killed process.
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest

from tests.support.homes import make_home
from tests.support.polling import wait_until

from .crash.helpers import EXIT_OK, JobProcess, instance_reader, job, job_env
from .crash.helpers import resume_until_accepted as resume_after_kill

DOC = Path(__file__).resolve().parent.parent / "docs" / "your-own-job.md"
SIZE = 120
BATCH = "cards-1"

pytestmark = pytest.mark.slow


def tutorial_module() -> str:
    blocks = re.findall(r"```python\n# file: postcards\.py\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) == 3, "the tutorial's three postcards.py blocks"
    return "\n\n".join(blocks)


def _count(db: Path, sql: str) -> int:
    if not db.exists():
        return 0
    with sqlite3.connect(db, timeout=30) as conn:
        try:
            return int(conn.execute(sql).fetchone()[0])
        except sqlite3.OperationalError:  # the shop has not created its tables yet
            return 0


def test_the_tutorial_job_is_served_killed_and_resumed_exactly_once(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "postcards.py").write_text(tutorial_module())
    shop = tmp_path / "shop.db"
    home = make_home(tmp_path)
    logs = tmp_path / "logs"
    logs.mkdir()
    env = job_env(
        home,
        DURABLE_CODE_LOCATION="postcards",
        PYTHONPATH=str(code),
        PRINT_SHOP_DB=str(shop),
        PRINT_SHOP_LATENCY_MS=40,  # 120 cards, 4 at a time: ~1.2 s of sending to kill inside
    )

    listed = job(["jobs", "--json"], env, logs, timeout=60)
    assert listed.proc.returncode == EXIT_OK, listed.tail()
    [described] = json.loads(listed.stdout)
    assert described["name"] == "postcards"
    assert [(s["step_name"], s["effect_scope"]) for s in described["steps"]] == [
        ("recipients", None),
        ("postcards", "postcard"),
    ]

    worker = JobProcess(["run", "--job", "postcards", "--id", BATCH, "--size", str(SIZE)], env, logs)
    wait_until(
        lambda: _count(shop, "SELECT count(*) FROM cards") >= 10 or worker.proc.poll() is not None,
        timeout=120,
        what="the first cards",
    )
    assert worker.proc.poll() is None, f"the batch ended before the kill\n{worker.tail()}"
    worker.sigkill()
    worker.reap_group()
    at_kill = _count(shop, "SELECT count(*) FROM cards")
    assert 0 < at_kill < SIZE, at_kill

    with instance_reader(home) as reader:
        attempts = resume_after_kill(BATCH, env, logs, reader)
    assert attempts[-1].proc.returncode == EXIT_OK, attempts[-1].tail()

    assert _count(shop, "SELECT count(*) FROM cards") == SIZE
    assert _count(shop, "SELECT count(DISTINCT recipient) FROM cards") == SIZE
    # Answers are recorded a chunk at a time, so a card sent but not yet recorded at the kill is
    # asked for again on resume, with its key: the shop answers from memory and prints nothing.
    assert SIZE <= _count(shop, "SELECT count(*) FROM requests") <= SIZE + at_kill + 4
    status = job(["status", "--id", BATCH, "--json"], env, logs, timeout=60)
    st = json.loads(status.stdout)
    assert st["job"] == "postcards" and st["status"] == "succeeded" and len(st["run_ids"]) == 2
    assert [s["status"] for s in st["steps"]] == ["completed", "completed"]
