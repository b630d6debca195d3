"""A deploy between the crash and the resume: a batch finishes on the code it started with, or stops
before it sends anything under a changed key.

The tutorial's postcard job (docs/your-own-job.md, as printed) is killed with SIGKILL while cards go
out; then its file is rewritten, as a deploy would, and `job resume` runs on the new code. The
print shop's own SQLite file counts cards and requests: it outlives every process, so "nothing was
sent" and "every customer got exactly one card" are read from the side effect itself.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from dagster import RunsFilter
from prometheus_client.parser import text_string_to_metric_families

from durable_assets.kit.tags import AUTO_RESUMED_BY_TAG
from durable_assets.ops.metrics import render_metrics
from tests.support.homes import make_home
from tests.support.polling import wait_until
from tests.support.tutorial import shop_count, tutorial_folder
from tests.webhooks.receiver import Receiver

from .conftest import ServedTutorial
from .helpers import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    JobProcess,
    instance_reader,
    job,
    job_env,
    kill_mid_sending,
    resume_until_accepted,
)
from .lost_host import LostHost, postcards_served_by_a_daemon, run_of

pytestmark = pytest.mark.slow

SIZE = 120
CARDS = "SELECT count(*) FROM cards"
REQUESTS = "SELECT count(*) FROM requests"
#: The tutorial's key, and the same key spelled another way by a later release.
OLD_KEY = 'Intent(f"postcard:{name}", {"to": name})'
NEW_KEY = 'Intent(f"card-for:{name}", {"to": name})'
#: A refactor that renames the key and names a subject the tutorial's intent did not have.
NEW_KEY_AND_SUBJECT = 'Intent(f"card-for:{name}", {"to": name}, subject=f"recipient:{name}")'


#: (the reader's folder, the environment `job` runs with there, the shop's file, the logs)
Setup = tuple[Path, dict[str, str], Path, Path]


@pytest.fixture(params=["sqlite", "postgres"])
def setup(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Setup]:
    """The tutorial's folder and a fresh instance on each backend."""
    pg_url = request.getfixturevalue("pg_database") if request.param == "postgres" else None
    folder = tutorial_folder(tmp_path)
    home = make_home(tmp_path, pg_url)
    shop = tmp_path / "shop.db"
    logs = tmp_path / "logs"
    logs.mkdir()
    env = job_env(home, DURABLE_CODE_LOCATION="postcards", PRINT_SHOP_DB=str(shop), PRINT_SHOP_LATENCY_MS=40)
    yield folder, env, shop, logs


def _deploy(folder: Path, old: str, new: str) -> None:
    """A release that changes one line of the job's file (the same file, as a deploy replaces it)."""
    path = folder / "postcards.py"
    text = path.read_text()
    assert old in text, f"{old!r} is not in the tutorial's postcards.py"
    path.write_text(text.replace(old, new))


#: The batch :func:`killed` leaves mid-sending (each test has an instance of its own).
KILLED = "deploy"


@pytest.fixture
def killed(setup: Setup) -> Setup:
    """The tutorial's batch ``KILLED`` started and its worker killed mid-sending: where a new
    release meets a batch the old code began, as every deploy test here starts."""
    folder, env, shop, logs = setup
    run = ["run", "--job", "postcards", "--id", KILLED, "--size", str(SIZE)]
    kill_mid_sending(folder, env, logs, run, shop, CARDS, SIZE)
    return setup


def _status(batch: str, env: dict[str, str], logs: Path, folder: Path) -> dict[str, object]:
    p = job(["status", "--id", batch, "--json"], env, logs, timeout=60, cwd=folder)
    assert p.proc.returncode == EXIT_OK, p.tail()
    return dict(json.loads(p.stdout))


def _resume(batch: str, env: dict[str, str], logs: Path, folder: Path, *extra: str) -> JobProcess:
    """`job resume` once the dead worker's lease has lapsed (it answers 3 until then)."""
    with instance_reader(Path(env["DAGSTER_HOME"])) as reader:
        wait_until(lambda: not reader.lease_live(batch), timeout=60, what="the dead worker's lease to lapse")
    return job(["resume", "--id", batch, *extra], env, logs, cwd=folder)


def test_a_key_spelled_anew_is_refused_and_the_old_code_finishes_exactly(
    killed: Setup,
) -> None:
    folder, env, shop, logs = killed
    batch = KILLED
    requests = shop_count(shop, REQUESTS)

    _deploy(folder, OLD_KEY, NEW_KEY)
    refused = _resume(batch, env, logs, folder)
    assert refused.proc.returncode == EXIT_USAGE, refused.tail()
    error = refused.stderr.strip().splitlines()[-1]
    assert "sent_cards" in error and "--accept-code-change" in error and "recorded effects" in error, error
    assert shop_count(shop, REQUESTS) == requests  # refused before anything ran
    code = _status(batch, env, logs, folder)["code"]
    assert isinstance(code, dict) and code["changed"] == ["sent_cards"], code
    assert code["deployed"]["sent_cards"] != code["pinned"]["sent_cards"]

    # Accepting the change knowingly does not let a new key out: the ledger's per-item record stops it.
    accepted = _resume(batch, env, logs, folder, "--accept-code-change")
    assert accepted.proc.returncode == EXIT_FAILED, accepted.tail()
    assert "would go out under another key" in accepted.stderr, accepted.tail()
    assert "postcard:" in accepted.stderr and "card-for:" in accepted.stderr, accepted.tail()
    assert shop_count(shop, REQUESTS) == requests  # nothing sent under the new key

    # The code the batch started with, back: it finishes, every customer with exactly one card (the
    # pin now names the accepted release, so going back is a change to accept too).
    _deploy(folder, NEW_KEY, OLD_KEY)
    back = _resume(batch, env, logs, folder, "--accept-code-change")
    assert back.proc.returncode == EXIT_OK, back.tail()
    assert shop_count(shop, CARDS) == SIZE
    assert shop_count(shop, "SELECT count(DISTINCT recipient) FROM cards") == SIZE
    assert shop_count(shop, "SELECT count(*) FROM cards WHERE key NOT LIKE 'postcard:%'") == 0


def test_a_key_and_its_subject_changed_are_refused_and_the_old_code_finishes_exactly(killed: Setup) -> None:
    """A refactor that renames the key and gives the effect a subject: nothing goes out under the
    new identity, accepted or not (the subject guard alone would not stop a new subject)."""
    folder, env, shop, logs = killed
    batch = KILLED
    requests = shop_count(shop, REQUESTS)

    _deploy(folder, OLD_KEY, NEW_KEY_AND_SUBJECT)
    assert _resume(batch, env, logs, folder).proc.returncode == EXIT_USAGE
    accepted = _resume(batch, env, logs, folder, "--accept-code-change")
    assert accepted.proc.returncode == EXIT_FAILED, accepted.tail()
    assert "would go out under another key" in accepted.stderr, accepted.tail()
    assert "subject" in accepted.stderr and "recipient:" in accepted.stderr, accepted.tail()
    assert shop_count(shop, REQUESTS) == requests

    _deploy(folder, NEW_KEY_AND_SUBJECT, OLD_KEY)
    back = _resume(batch, env, logs, folder, "--accept-code-change")
    assert back.proc.returncode == EXIT_OK, back.tail()
    assert shop_count(shop, CARDS) == SIZE
    assert shop_count(shop, "SELECT count(DISTINCT recipient) FROM cards") == SIZE


def test_accepting_a_change_that_keeps_every_key_finishes_exactly(killed: Setup) -> None:
    """A release that changes the job's file but no key (here a comment): refused until a person
    accepts it; accepted, the batch finishes on it and every customer has exactly one card."""
    folder, env, shop, logs = killed
    batch = KILLED
    job_file = folder / "postcards.py"
    job_file.write_text(job_file.read_text() + "\n# release 2: the same keys\n")
    refused = _resume(batch, env, logs, folder)
    assert refused.proc.returncode == EXIT_USAGE, refused.tail()
    accepted = _resume(batch, env, logs, folder, "--accept-code-change")
    assert accepted.proc.returncode == EXIT_OK, accepted.tail()
    assert "code change accepted" in accepted.stderr, accepted.tail()
    assert shop_count(shop, CARDS) == SIZE
    assert shop_count(shop, "SELECT count(DISTINCT recipient) FROM cards") == SIZE
    code = _status(batch, env, logs, folder)["code"]
    assert isinstance(code, dict) and code["changed"] == [] and code["accepted"] is not None, code


def test_the_old_code_back_resumes_without_any_acceptance(
    killed: Setup,
) -> None:
    folder, env, shop, logs = killed
    batch = KILLED
    _deploy(folder, OLD_KEY, NEW_KEY)
    assert _resume(batch, env, logs, folder).proc.returncode == EXIT_USAGE
    _deploy(folder, NEW_KEY, OLD_KEY)  # the operator deploys the old release back
    with instance_reader(Path(env["DAGSTER_HOME"])) as reader:
        attempts = resume_until_accepted(batch, env, logs, reader, cwd=folder)
    assert attempts[-1].proc.returncode == EXIT_OK, attempts[-1].tail()
    assert shop_count(shop, CARDS) == SIZE
    assert shop_count(shop, "SELECT count(DISTINCT recipient) FROM cards") == SIZE
    code = _status(batch, env, logs, folder)["code"]
    assert isinstance(code, dict) and code["changed"] == [] and code["accepted"] is None, code


def test_a_changed_step_that_recorded_no_effects_runs_on_the_new_code_and_the_log_says_so(
    setup: Setup,
) -> None:
    """Killed (SIGKILL, by the kit's named crash point) as the read-only first step starts, after
    the batch pinned its code: both steps change, neither has effects, so the resume runs them on
    the new release (whose keys are the only ones the batch ever uses) and says so."""
    folder, env, shop, logs = setup
    batch = "deploy-3"
    killed = job(
        ["run", "--job", "postcards", "--id", batch, "--size", str(SIZE)],
        {**env, "DURABLE_CRASH_AT": "step_start:1"},
        logs,
        cwd=folder,
    )
    assert killed.proc.returncode == -9, killed.tail()
    assert shop_count(shop, REQUESTS) == 0

    _deploy(folder, OLD_KEY, NEW_KEY)
    resumed = _resume(batch, env, logs, folder)
    assert resumed.proc.returncode == EXIT_OK, resumed.tail()
    for step in ("recipients", "sent_cards"):
        assert f"step {step} runs on new code" in resumed.stderr, resumed.tail()
    log = (Path(env["DAGSTER_HOME"]) / "logs" / f"{batch}.log").read_text()
    assert "step recipients runs on code" in log and "step sent_cards runs on code" in log
    assert shop_count(shop, CARDS) == SIZE
    assert shop_count(shop, "SELECT count(*) FROM cards WHERE key LIKE 'card-for:%'") == SIZE


OUTS = """
import os

from dagster import DynamicPartitionsDefinition

from durable_assets.kit import DurableJob, DurableJobs, durable_asset
from durable_assets.location import definitions
from shapes import Shape

BATCHES = DynamicPartitionsDefinition(name="out_batches")


@durable_asset(label="Making", partitions_def=BATCHES)
def made() -> Shape:
    return Shape(3)


@durable_asset(label="Using", partitions_def=BATCHES)
def used(made: Shape) -> int:
    if os.environ.get("FAIL_USE"):
        raise RuntimeError("not this time")
    return made.n


durable_jobs = DurableJobs([DurableJob("outs", assets=[made, used], partitions=BATCHES, description="x")])
defs = definitions(durable_jobs)
"""


def test_an_output_that_older_code_wrote_fails_with_one_line_naming_the_step(tmp_path: Path) -> None:
    """A class that moved between the run and the resume: one line, never an unpickling traceback."""
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "outs.py").write_text(OUTS)
    (folder / "shapes.py").write_text("class Shape:\n    def __init__(self, n):\n        self.n = n\n")
    logs = tmp_path / "logs"
    logs.mkdir()
    env = job_env(make_home(tmp_path), DURABLE_CODE_LOCATION="outs")
    first = job(["run", "--job", "outs", "--id", "o-1"], {**env, "FAIL_USE": "1"}, logs, cwd=folder)
    assert first.proc.returncode == EXIT_FAILED, first.tail()

    (folder / "shapes.py").write_text("class Form:\n    def __init__(self, n):\n        self.n = n\n")
    (folder / "outs.py").write_text(OUTS.replace("Shape", "Form"))
    resumed = job(["resume", "--id", "o-1"], env, logs, cwd=folder)
    assert resumed.proc.returncode == EXIT_FAILED, resumed.tail()
    [line] = [ln for ln in resumed.stderr.splitlines() if ln.startswith("error:")]
    assert "the stored output of step made was written by other code" in line, resumed.tail()
    assert "the batch started on fp-" in line and "deployed: fp-" in line, line
    assert "Traceback" not in resumed.stderr


@pytest.mark.timeout(600)  # a loaded 2-core machine: four processes start; most of it is startup
def test_the_daemon_leaves_a_batch_whose_code_changed_to_a_person_and_tells_why(
    home: Path, served_tutorial: ServedTutorial
) -> None:
    """The tutorial's job launched as the UI launches it; its host dies mid-sending, and the host
    comes back with a release that spells the key anew. Run monitoring fails the run from its lease;
    the auto-resume sensor, running the new release, leaves the batch failed, and the operator
    hears why where a held batch is heard: the signed `batch.failed` webhook's status JSON and
    `/metrics`. The old release back, `job resume` finishes it: every customer one card."""
    batch, size = "cards-deploy", 400
    folder, shop, logs = served_tutorial
    secret = "whsec_" + base64.b64encode(os.urandom(32)).decode()
    hooks = Receiver(secret)
    env, code, dev = postcards_served_by_a_daemon(
        home, folder, shop, logs, DURABLE_WEBHOOK_URLS=hooks.url(), DURABLE_WEBHOOK_SECRET=secret
    )
    try:
        with instance_reader(home) as reader:
            host = LostHost(reader, dev, code, batch)
            # Without Dagster's own run retry: its drop of a retry to an unreachable location is what
            # the lost-host tests assert; here the story starts where the automatic resume decides.
            host.launch("postcard_batches", size, tags={"dagster/max_retries": "0"})
            host.wait_mid_effects(lambda: shop_count(shop, CARDS) >= 10, "cards from the worker")
            host.kill()
            requests = shop_count(shop, REQUESTS)  # final for the first run: every writer is dead
            failed_after = host.wait_failed_from_its_lease()
            print(f"\nrun monitoring failed the run {failed_after:.1f} s after the kill")
            _deploy(folder, OLD_KEY, NEW_KEY)  # the host comes back with the new release
            code.start()

            def decided() -> str | None:
                return run_of(reader.instance, host.first_run).tags.get(AUTO_RESUMED_BY_TAG)

            verdict = wait_until(
                decided, timeout=150, what="the automatic resume's decision", detail=host.story
            )
            assert verdict == "none: code changed since the batch started", host.story()
            failed = wait_until(
                lambda: [p for p in hooks.deliveries().values() if p["type"] == "batch.failed"],
                timeout=120,
                what="the signed batch.failed webhook",
                detail=host.story,
            )
            instance = reader.instance
            assert not instance.get_runs(RunsFilter(tags={"dagster/parent_run_id": host.first_run}))
            assert shop_count(shop, REQUESTS) == requests  # nothing ran on the new release
            [notice] = failed
            assert notice["data"]["code"]["changed"] == ["sent_cards"], notice["data"]["code"]
            errors = [s["error"] for s in notice["data"]["steps"] if s.get("error")]
            assert any("code changed since the batch started" in e for e in errors), errors
            [family] = [
                f
                for f in text_string_to_metric_families(render_metrics(instance))
                if f.name == "durable_batches_code_changed"
            ]
            assert [s.value for s in family.samples] == [1.0]

        _deploy(folder, NEW_KEY, OLD_KEY)  # the operator deploys the batch's own release back
        back = job(["resume", "--id", batch], env, logs, cwd=folder)
        assert back.proc.returncode == EXIT_OK, back.tail()
        assert shop_count(shop, CARDS) == size
        assert shop_count(shop, "SELECT count(DISTINCT recipient) FROM cards") == size
        assert shop_count(shop, "SELECT count(*) FROM cards WHERE key NOT LIKE 'postcard:%'") == 0
        assert _status(batch, env, logs, folder)["code"] == {
            **notice["data"]["code"],
            "deployed": notice["data"]["code"]["pinned"],
            "changed": [],
        }
    finally:
        dev.stop(grace_s=5)  # nothing left to keep: the assertions read storages that outlive it
        code.stop()
        hooks.close()
