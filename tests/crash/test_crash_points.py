"""Every named crash point, not random ones: a real `job` process SIGKILLs itself at an exact durable
boundary (``DURABLE_CRASH_AT=POINT:N``, :mod:`durable_assets.kit.crashpoints`), then `job resume`
finishes the batch, and the invariants are checked where the dead worker cannot lie about them.

A crash state is (job, point, hit) or, for double crashes, a kill during the resume of a kill. For
each state: the crashed process died by SIGKILL (exit -9), or, if that pass never came in this
run, it finished; then, read from outside every worker:

- every side effect exactly once at the provider (the embedded provider's file): charges and one
  refund per eligible invoice (and one notice each, at the mailbox), or one customer per legacy
  account and every balance exact with no adjustment key applied twice;
- the batch succeeded; a step committed before the kill was not executed again, and exactly the
  steps in flight at each kill were (``executions`` in the status JSON);
- the report is the one an uncrashed run of the same batch wrote (provider ids aside);
- one logical webhook delivery (``batch.succeeded``, one ``webhook-id``, verified by the receiver
  of tests/webhooks);
- for the retention points, `job prune` killed there and run again: one complete archive, the
  batch gone from storage, and its stored outputs, files, log and compute logs gone from the home.

Which hits exist is learned from an uncrashed reference run of each job (``DURABLE_CRASH_COUNTS``).
``DURABLE_CRASH_ENUMERATE=full`` explores every point of both jobs at every hit (first, middle and
last where a point has more than three) and four double crashes; by default a deterministic subset
runs that still touches every point once (each point on one of the two jobs, at its middle hit)
plus two double crashes. The count of states explored is printed at the end of the session.

Run: ``.venv/bin/pytest -m slow tests/crash/test_crash_points.py`` (add
``DURABLE_CRASH_ENUMERATE=full`` for the full enumeration).
"""

from __future__ import annotations

import base64
import csv
import json
import math
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from durable_assets.kit.crashpoints import CrashPoint, CrashSpec
from tests.support.credits import ProviderCredits, assert_credits_exact, expected_balances
from tests.support.homes import make_home
from tests.support.processes import REPO
from tests.webhooks.receiver import Receiver

from .helpers import (
    EXIT_CONFLICT,
    EXIT_OK,
    INTERRUPTED,
    EmbeddedProvider,
    Expected,
    InstanceReader,
    JobProcess,
    assert_refunded_exactly_once,
    instance_reader,
    job,
    job_env,
    notices_for,
    resume_until_accepted,
)

FULL = os.environ.get("DURABLE_CRASH_ENUMERATE", "").strip().lower() == "full"
#: A full-enumeration test explores up to three hits of a point in one test (152 s seen under load).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900 if FULL else 300)]
SECRET = "whsec_" + base64.b64encode(b"crash-points-suite-secret-32-byt").decode()
KILLED = -signal.SIGKILL

#: Points a `job run` passes (the run phase and its webhook); retention's are passed by `job prune`.
RUN_POINTS = [p for p in CrashPoint if p not in {CrashPoint.AFTER_REVIEW_RECORD}]
RETENTION_POINTS = [
    CrashPoint.ARCHIVE_WRITTEN,
    CrashPoint.ARCHIVE_RENAMED,
    CrashPoint.BATCH_DATA_DELETED,
    CrashPoint.BATCH_DELETED,
]
#: Passed only by a prune that archives to an object store
#: (tests/ops/test_retention_s3.py kills at that moment).
OBJECT_STORE_POINTS = [CrashPoint.ARCHIVE_STORED]
RUN_POINTS = [p for p in RUN_POINTS if p not in RETENTION_POINTS + OBJECT_STORE_POINTS]
#: Passed as often as a clock says, not the batch: the heartbeat, the progress throttle (0.5 s) and
#: the group commit (50 ms). Their hit counts vary from run to run, so a later hit may never come.
TIMED_POINTS = {
    CrashPoint.AFTER_LEASE_RENEWAL,
    CrashPoint.AFTER_PROGRESS_WRITE,
    CrashPoint.AFTER_RESULT_COMMIT,
}


# --- the two jobs -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pipeline:
    """One durable job as this suite drives and checks it."""

    job: str
    batch: str
    size: int
    report: str
    #: Report columns that hold ids the provider made up (different in every provider).
    provider_ids: tuple[str, ...]

    def run_args(self) -> list[str]:
        return ["run", "--job", self.job, "--id", self.batch, "--size", str(self.size)]

    def report_rows(self, home: Path) -> list[dict[str, str]]:
        with open(home / "batches" / self.batch / self.report, newline="") as f:
            rows = [{k: v for k, v in row.items() if k not in self.provider_ids} for row in csv.DictReader(f)]
        return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True))

    def assert_effects_exactly_once(self, home: Path, reference: Reference) -> None:
        if self.job == "refund_batch":
            expected = Expected.of(self.batch, self.size)
            provider = EmbeddedProvider(home)
            assert_refunded_exactly_once(provider.refunds(), expected)
            assert provider.stats()["refunds_created"] == expected.n
            assert notices_for(home, expected) == expected.n
            charges, distinct = _charges(home)
            assert charges == distinct == reference.charges, (charges, distinct, reference.charges)
        else:
            provider_state = ProviderCredits.of_store(home / "payments.db")
            assert_credits_exact(provider_state, expected_balances([(self.batch, self.size)]))


REFUNDS = Pipeline("refund_batch", "cp-refunds", 12, "refund_report.csv", ("charge_id", "provider_id"))
CREDITS = Pipeline(
    "credit_migration", "cp-credits", 8, "migration_report.csv", ("customer_id", "transaction_id")
)
PIPELINES = {p.job: p for p in (REFUNDS, CREDITS)}


def _charges(home: Path) -> tuple[int, int]:
    """Charges at the embedded provider, and how many distinct (metadata) they are."""
    conn = sqlite3.connect(f"file:{home / 'payments.db'}?mode=ro", uri=True)
    try:
        total, distinct = conn.execute("SELECT count(*), count(DISTINCT metadata) FROM charges").fetchone()
    finally:
        conn.close()
    return int(total), int(distinct)


# --- what the suite explored --------------------------------------------------------------------


@dataclass
class Explored:
    """Every crash state of this session: (what, how the crashed process ended)."""

    states: list[tuple[str, str]] = field(default_factory=list)

    def add(self, what: str, outcome: str) -> None:
        self.states.append((what, outcome))

    def summary(self) -> str:
        killed = sum(1 for _, o in self.states if o == "killed")
        return (
            f"crash states explored: {len(self.states)} ({killed} killed at their point, "
            f"{len(self.states) - killed} never reached it and finished; "
            f"enumeration {'full' if FULL else 'ci subset'})"
        )


EXPLORED = Explored()


# --- references: one uncrashed run of each job ----------------------------------------------------


@dataclass(frozen=True)
class Reference:
    home: Path
    counts: dict[str, int]  # passes per point in the `job run` process
    report: list[dict[str, str]]
    charges: int
    runs: int
    events: int  # stored events of the batch's runs (an archive must hold them all)


def _read_counts(path: Path) -> list[dict[str, int]]:
    return [json.loads(line)["counts"] for line in path.read_text().splitlines()] if path.exists() else []


class References:
    """Built lazily, once per job per session: a test of one job never pays for the other's."""

    def __init__(self, root: Path, receiver: Receiver) -> None:
        self.root = root
        self.receiver = receiver
        self._built: dict[str, Reference] = {}

    def __getitem__(self, pipeline: Pipeline) -> Reference:
        if pipeline.job not in self._built:
            self._built[pipeline.job] = self._build(pipeline)
        return self._built[pipeline.job]

    def _build(self, pipeline: Pipeline) -> Reference:
        root = self.root / f"reference-{pipeline.job}"
        home = make_home(root)
        counts = root / "counts.jsonl"
        env = _env(home, self.receiver, f"/reference-{pipeline.job}", DURABLE_CRASH_COUNTS=counts)
        done = job(pipeline.run_args(), env, root)
        assert done.proc.returncode == EXIT_OK, done.tail()
        (run_counts,) = _read_counts(counts)
        with instance_reader(home) as reader:
            runs = [r.run_id for r in _batch_runs(reader, pipeline.batch)]
            events = sum(len(reader.instance.all_logs(run_id)) for run_id in runs)
        return Reference(
            home,
            run_counts,
            pipeline.report_rows(home),
            _charges(home)[0] if pipeline is REFUNDS else 0,
            len(runs),
            events,
        )


def _batch_runs(reader: InstanceReader, batch: str) -> list[Any]:
    from durable_assets.ops.status import batch_runs

    return list(batch_runs(reader.instance, batch))


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    r = Receiver(SECRET)
    yield r
    r.close()


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory, receiver: Receiver) -> References:
    return References(tmp_path_factory.mktemp("references"), receiver)


def _env(home: Path, receiver: Receiver, path: str, **extra: object) -> dict[str, str]:
    return job_env(
        home,
        DURABLE_WEBHOOK_URLS=receiver.url(path),
        DURABLE_WEBHOOK_SECRET=SECRET,
        DURABLE_WEBHOOK_TIMEOUT_S=1,  # a dead deliverer's claim lapses after 3 s
        DURABLE_WEBHOOK_BACKOFF_BASE_S=0.05,
        **extra,
    )


# --- which states -----------------------------------------------------------------------------------


def hits_of(point: CrashPoint, passes: int) -> list[int]:
    """Every hit of a point passed at most three times; else the first, a middle and the last."""
    if passes <= 3:
        return list(range(1, passes + 1))
    return [1, math.ceil(passes / 2), passes]


def ci_hit(point: CrashPoint, passes: int) -> int:
    """The CI subset's one hit per point: the middle one (the first for a clock-driven point, whose
    later hits a slower or faster run may never reach)."""
    return 1 if point in TIMED_POINTS or passes <= 1 else math.ceil(passes / 2)


#: The CI subset: each run-phase point once, on one job or the other, so together they touch all.
CI_ASSIGNMENT: dict[CrashPoint, Pipeline] = {
    p: (REFUNDS if i % 2 == 0 else CREDITS) for i, p in enumerate(RUN_POINTS)
}

#: (job, kill in `job run`, kill in the `job resume` that follows), hits resolved at run time
#: (None: the CI hit of the point). The first two run in the CI subset too.
DOUBLE_CRASHES: list[tuple[Pipeline, CrashPoint, CrashPoint]] = [
    (REFUNDS, CrashPoint.AFTER_PROVIDER_ANSWER, CrashPoint.AFTER_INTENT_COMMIT),
    (CREDITS, CrashPoint.STEP_BODY_DONE, CrashPoint.RUN_END),
    (CREDITS, CrashPoint.AFTER_RESULT_COMMIT, CrashPoint.AFTER_PROVIDER_ANSWER),
    (REFUNDS, CrashPoint.ALL_STEPS_DONE, CrashPoint.WEBHOOK_SENT),
]


def _run_phase_params() -> list[Any]:
    if FULL:
        chosen = [(p, point) for p in PIPELINES.values() for point in RUN_POINTS]
    else:
        chosen = [(p, point) for point, p in CI_ASSIGNMENT.items()]
    return [pytest.param(p, point, id=f"{p.job}-{point.value}") for p, point in chosen]


# --- one crash state --------------------------------------------------------------------------------


@dataclass
class Kill:
    """What a crashed process left: whether it died, and the steps it left in flight."""

    died: bool
    in_flight: list[str]
    completed: list[str]


def _kill_state(reader: InstanceReader, batch: str, process: JobProcess) -> Kill:
    rc = process.proc.returncode
    assert rc in (KILLED, EXIT_OK), f"neither killed at its point nor finished\n{process.tail()}"
    status = reader.status(batch)
    steps = (status or {}).get("steps") or []
    return Kill(
        died=rc == KILLED,
        # in progress only: a step a kill left in flight shows `failed` at a later kill, once its run
        # was marked failed, and must not count twice
        in_flight=[s["step_name"] for s in steps if s["status"] in INTERRUPTED] if rc == KILLED else [],
        completed=[s["step_name"] for s in steps if s["status"] == "completed"],
    )


def _resume(pipeline: Pipeline, env: Mapping[str, str], logs: Path, reader: InstanceReader) -> JobProcess:
    attempts = resume_until_accepted(
        pipeline.batch, env, logs, reader, size=pipeline.size, job_name=pipeline.job
    )
    return attempts[-1]


def explore(
    pipeline: Pipeline,
    specs: Sequence[CrashSpec],
    tmp_path: Path,
    receiver: Receiver,
    reference: Reference,
) -> list[Kill]:
    """Run the batch with ``specs[0]`` armed, resume with each later spec armed in turn, then resume
    unarmed until done; check every invariant. Returns what each armed process left."""
    home = make_home(tmp_path / uuid.uuid4().hex[:8])
    path = f"/{tmp_path.name}-{uuid.uuid4().hex[:6]}"
    env = _env(home, receiver, path)
    kills: list[Kill] = []
    with instance_reader(home) as reader:
        first = job(pipeline.run_args(), {**env, "DURABLE_CRASH_AT": repr(specs[0])}, tmp_path)
        kills.append(_kill_state(reader, pipeline.batch, first))
        for spec in specs[1:]:
            if not kills[-1].died:
                break
            armed = _resume(pipeline, {**env, "DURABLE_CRASH_AT": repr(spec)}, tmp_path, reader)
            kills.append(_kill_state(reader, pipeline.batch, armed))
        if kills[-1].died:
            last = _resume(pipeline, env, tmp_path, reader)
            assert last.proc.returncode == EXIT_OK, last.tail()
        _assert_converged(pipeline, home, reader, kills, reference)
    _assert_one_logical_webhook(receiver, path)
    what = f"{pipeline.job} " + " then ".join(repr(s) for s in specs)
    EXPLORED.add(what, "killed" if kills[0].died else "finished")
    return kills


def _assert_converged(
    pipeline: Pipeline, home: Path, reader: InstanceReader, kills: list[Kill], reference: Reference
) -> None:
    status = reader.status(pipeline.batch)
    assert status is not None and status["status"] == "succeeded", status
    assert {s["status"] for s in status["steps"]} == {"completed"}, status["steps"]
    executions = {s["step_name"]: s["executions"] for s in status["steps"]}
    # A step committed before a kill ran once, ever; exactly the steps in flight at a kill ran again.
    committed_first = set(kills[0].completed) if kills[0].died else set(executions)
    assert all(executions[s] == 1 for s in committed_first), (executions, kills)
    redone = sum(len(k.in_flight) for k in kills)
    assert sum(executions.values()) == len(executions) + redone, (executions, kills)
    pipeline.assert_effects_exactly_once(home, reference)
    assert pipeline.report_rows(home) == reference.report, "the report differs from an uncrashed run's"


def _assert_one_logical_webhook(receiver: Receiver, path: str) -> None:
    got = receiver.deliveries(path)
    assert [p["type"] for p in got.values()] == ["batch.succeeded"], got
    assert {r.webhook_id for r in receiver.on(path)} == set(got), "a re-send must carry the same webhook-id"
    assert not [r for r in receiver.rejected() if r.path == path]


# --- the tests ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("pipeline", "point"), _run_phase_params())
def test_a_kill_at_a_named_point_is_finished_by_resume_with_every_effect_once(
    pipeline: Pipeline, point: CrashPoint, tmp_path: Path, receiver: Receiver, references: References
) -> None:
    reference = references[pipeline]
    passes = reference.counts.get(point.value, 0)
    assert passes >= 1, f"an uncrashed {pipeline.job} run never passes {point.value}: {reference.counts}"
    hits = hits_of(point, passes) if FULL else [ci_hit(point, passes)]
    for hit in hits:
        kills = explore(pipeline, [CrashSpec(point, hit)], tmp_path / f"hit{hit}", receiver, reference)
        if point not in TIMED_POINTS:  # the batch passes its own points deterministically
            assert kills[0].died, f"{point.value}:{hit} of {passes} passes was never reached"


@pytest.mark.parametrize(
    ("pipeline", "killed", "then"),
    [
        pytest.param(p, a, b, id=f"{p.job}-{a.value}-then-{b.value}")
        for p, a, b in (DOUBLE_CRASHES if FULL else DOUBLE_CRASHES[:2])
    ],
)
def test_a_kill_during_the_resume_of_a_kill(
    pipeline: Pipeline,
    killed: CrashPoint,
    then: CrashPoint,
    tmp_path: Path,
    receiver: Receiver,
    references: References,
) -> None:
    reference = references[pipeline]
    first = CrashSpec(killed, ci_hit(killed, reference.counts[killed.value]))
    kills = explore(pipeline, [first, CrashSpec(then, 1)], tmp_path, receiver, reference)
    assert kills[0].died and len(kills) == 2, kills
    assert kills[1].died, f"the resume never passed {then.value}"


@pytest.mark.parametrize("point", RETENTION_POINTS, ids=[p.value for p in RETENTION_POINTS])
@pytest.mark.parametrize("pipeline", list(PIPELINES.values()) if FULL else [REFUNDS], ids=lambda p: p.job)
def test_a_prune_killed_at_a_named_point_is_finished_by_the_next_prune(
    pipeline: Pipeline, point: CrashPoint, tmp_path: Path, references: References
) -> None:
    reference = references[pipeline]
    home = tmp_path / "dagster_home"
    shutil.copytree(reference.home, home)  # the reference's finished batch, in an instance of our own
    env = job_env(home)
    prune = ["prune", "--completed-days", "0", "--json"]
    crashed = job(prune, {**env, "DURABLE_CRASH_AT": f"{point.value}:1"}, tmp_path)
    assert crashed.proc.returncode == KILLED, crashed.tail()
    again = job(prune, env, tmp_path)
    assert again.proc.returncode == EXIT_OK, again.tail()
    archives = sorted((home / "archive").glob("*.jsonl.gz"))
    assert [a.name.split("--")[0] for a in archives] == [pipeline.batch], archives
    assert not list((home / "archive").glob(".*.tmp"))
    _assert_archive_complete(archives[0], reference)
    gone = job(["status", "--id", pipeline.batch], env, tmp_path)
    assert gone.proc.returncode == EXIT_CONFLICT, gone.tail()  # no such batch any more
    assert (reference.home / "batches" / pipeline.batch).is_dir()  # what there was to delete
    assert not (home / "batches" / pipeline.batch).exists()
    assert not (home / "logs" / f"{pipeline.batch}.log").exists()
    left = [p.relative_to(home) for p in (home / "storage").rglob("*") if p.is_file()]
    assert left == [], left  # the step outputs and the runs' compute logs went with the batch
    EXPLORED.add(f"{pipeline.job} prune {point.value}:1", "killed")


def _assert_archive_complete(path: Path, reference: Reference) -> None:
    from durable_assets.ops.retention.pruning import read_archive

    records = list(read_archive(path))
    kinds = [r["kind"] for r in records]
    assert kinds[0] == "batch" and kinds[-1] == "end", kinds[:3]
    events = kinds.count("event")
    assert kinds.count("run") == reference.runs and events == reference.events, (kinds.count("run"), events)
    assert records[-1] == {"kind": "end", "runs": reference.runs, "events": reference.events}
    assert "status" in kinds


_REVIEW_CHILD = textwrap.dedent(
    """
    import sys
    from durable_assets.kit.db import DurableDatabase
    from durable_assets.kit.effects import EffectRunner
    from durable_assets.kit.ledger import Intent, Ledger

    url, sent_log, owner, fence = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

    def perform(intent):
        with open(sent_log, "a") as log:
            log.write(intent.key + "\\n")
        wrong = 1 if intent.key == "k2" else 0  # the provider answers k2 with another amount
        return {"id": "x_" + intent.key, "amount": intent.params["amount"] + wrong}

    def verify(intent, result):
        return None if result["amount"] == intent.params["amount"] else "amount differs"

    runner = EffectRunner(ledger=Ledger(DurableDatabase(url)), scope="effect", owner=owner, fence=fence,
                          perform=perform, verify=verify, concurrency=1)
    report = runner.run([Intent(f"k{i}", {"amount": i}) for i in range(5)])
    print(sorted(report.results), sorted(report.review))
    """
)


def test_a_kill_right_after_a_review_is_recorded_never_sends_that_key_again(tmp_path: Path) -> None:
    """The review point, at the kit level: no synthetic batch gets an answer that does not match."""
    url, sent = f"sqlite:///{tmp_path / 'durable.db'}", tmp_path / "sent.log"

    def child(owner: str, fence: int, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", _REVIEW_CHILD, url, str(sent), owner, str(fence)],
            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", **env},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    crashed = child("run-a", 1, DURABLE_CRASH_AT=f"{CrashPoint.AFTER_REVIEW_RECORD.value}:1")
    assert crashed.returncode == KILLED, crashed.stderr
    resumed = child("run-b", 2)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.split("] [")[1].strip("]\n") == "'k2'", resumed.stdout  # still held for review
    sends = sent.read_text().split()
    assert sends.count("k2") == 1, sends  # recorded for review before the kill: never sent again
    assert sorted(set(sends)) == ["k0", "k1", "k2", "k3", "k4"]
    EXPLORED.add(f"kit effects {CrashPoint.AFTER_REVIEW_RECORD.value}:1", "killed")
