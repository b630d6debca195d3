"""One served instance for the HTTP contract and fuzzing tests: a finished batch, a token, a real server."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.api.helpers import TOKEN, ApiServer
from tests.crash.helpers import job, job_env
from tests.support.homes import make_home

FINISHED = "done-1"
#: A finished batch of each durable job: the contract holds for every registered job.
FINISHED_BY_JOB = {"refund_batch": FINISHED, "credit_migration": "credits-done-1"}


@dataclass
class Served:
    url: str
    home: Path
    batch_id: str  # the default job's
    batches: dict[str, str]  # job name -> its finished batch

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="session")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("served")
    home = make_home(root)
    env = job_env(home, DURABLE_API_TOKEN=TOKEN)
    for job_name, batch_id in FINISHED_BY_JOB.items():
        batch = job(["run", "--job", job_name, "--id", batch_id, "--size", "20"], env, root)
        assert batch.proc.returncode == 0, batch.tail()
    server = ApiServer(env, root)
    try:
        yield Served(server.url, home, FINISHED, dict(FINISHED_BY_JOB))
    finally:
        server.close()
