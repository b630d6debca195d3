"""The `job` CLI's error paths (issue #14): options checked before a batch exists, malformed input
files refused up front, one line per error."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest
from dagster import ConfigurableResource, asset

from durable_assets.ops import cli
from tests.conftest import REPO, job_cli
from tests.support.machine import scaled
from tests.support.network import free_port

JOB = REPO / ".venv" / "bin" / "job"

HEADER = (
    "invoice_id,customer_id,customer_email,charge_id,currency,amount_charged,contracted_amount,"
    "already_refunded,service_period,charged_at,cancelled_at"
)
ROW = "I{n},C{n},c{n}@x.com,ch_{n},usd,12.00,10.00,0,2026-10,2026-10-01T00:00:00Z,"


def _one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--id", "x", "--size", "99999999999"],
        ["run", "--id", "x", "--size", "0"],
        ["run", "--id", "x", "--size", "ten"],
        ["run", "--id", "a b"],
        ["run", "--id", "x" * 65],
        ["status", "--id", "../etc"],
        ["resume", "--id", ""],
        ["cancel", "--id", "-x-"],
        ["serve", "--port", "65536"],
        ["serve", "--port", "-1"],
        ["serve", "--host", ""],
        ["serve", "--host", "no-such-host.invalid"],
        ["provider", "serve", "--port", "99999"],
        ["provider", "serve", "--error-rate", "1.5"],
        ["provider", "serve", "--lost-response-rate", "nan"],
        ["provider", "serve", "--latency-ms", "-5"],
        ["provider", "serve", "--rate-limit", "0"],
        ["provider", "serve", "--rate-limit", "inf"],
        ["provider", "serve", "--db", "/no/such/dir/sim.db"],
        ["provider", "serve", "--db", "/tmp"],
        ["prune", "--completed-days", "-1"],
        ["prune", "--failed-days", "inf"],
        ["prune", "--ledger-days", "soon"],
        ["prune", "--archive-dir", "/etc/hostname/archive"],
        ["backfill", "--from", "2026-02-30", "--to", "2026-03-01"],
        ["backfill", "--from", "2026-03-02", "--to", "2026-03-01"],
        ["backfill", "--from", "2020-01-01", "--to", "2026-03-01"],
    ],
)
def test_every_bad_option_is_exit_2_with_one_line(
    dagster_home: Path, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse's own exit
        code = int(exc.code or 0)
    assert code == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "error:" in line
    assert not (dagster_home / "history").exists() and not (dagster_home / "storage").exists()  # no instance


def test_size_bound_is_the_steps_bound() -> None:
    from durable_assets.refunds.assets import InvoiceSource

    bounds = {type(m).__name__: m for m in InvoiceSource.model_fields["size"].metadata}
    assert bounds["Le"].le == cli.MAX_SIZE and bounds["Ge"].ge == 1


def test_out_of_range_size_leaves_the_id_unused(dagster_home: Path) -> None:
    # Issue #14, defect 7: the batch used to be created, then step 1 failed with a pydantic error (exit 1).
    bad = job_cli("run", "--id", "big", "--size", "99999999999")
    assert bad.returncode == 2
    assert "--size" in _one_error_line(bad.stderr)
    assert job_cli("status", "--id", "big").returncode == 3  # no batch


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("DURABLE_CONCURRENCY", "many", "DURABLE_CONCURRENCY='many' is not a whole number"),
        ("DURABLE_MAX_REFUNDS_PER_BATCH", "-1", "DURABLE_MAX_REFUNDS_PER_BATCH='-1' is out of range"),
        ("DURABLE_LEASE_TTL_S", "0", "DURABLE_LEASE_TTL_S='0' is out of range"),
    ],
)
def test_malformed_worker_setting_is_exit_2_naming_the_variable(
    dagster_home: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    name: str,
    value: str,
    says: str,
) -> None:
    monkeypatch.setenv(name, value)
    assert cli.main(["run", "--id", "envy", "--size", "5"]) == 2
    assert says in _one_error_line(capsys.readouterr().err)


@pytest.mark.slow
def test_misaligned_csv_is_refused_before_the_batch_naming_file_and_line(
    dagster_home: Path, tmp_path: Path
) -> None:
    path = tmp_path / "shifted.csv"
    path.write_text(
        "\n".join([HEADER, ROW.format(n=1), ROW.format(n=2) + ",surplus", ROW.format(n=3)]) + "\n"
    )
    for option in ("--input", "--invoices"):
        bad = job_cli("run", "--id", "shifted", option, str(path))
        assert bad.returncode == 2
        line = _one_error_line(bad.stderr)
        assert str(path) in line and "line 3 has 12 fields" in line
    assert job_cli("status", "--id", "shifted").returncode == 3  # the ID was not used


def test_trailing_comma_csv_runs_unshifted(dagster_home: Path, tmp_path: Path) -> None:
    # Issue #14, defect 5: every row ending in a comma made pandas take invoice_id as the index and
    # shift every value, so every row was quarantined with nonsense reasons.
    path = tmp_path / "export.csv"
    path.write_text("\n".join([HEADER, *(ROW.format(n=n) + "," for n in range(1, 4))]) + "\n")
    result = job_cli("run", "--id", "export", "--input", str(path))
    quarantine = (dagster_home / "batches" / "export" / "quarantine.csv").read_text().splitlines()
    assert quarantine[1:] == [], quarantine  # header only: nothing quarantined
    report = (dagster_home / "batches" / "export" / "refund_report.csv").read_text()
    assert all(f"I{n}" in report for n in range(1, 4)), report
    assert result.returncode == 4, result.stderr  # refunds of unknown charges are held for review


# --- errors are one line; Dagster's output goes to the batch's log (issue #14, defect 6) -----------

PROGRESS = re.compile(r"^step \d+/\d+ ")


def _messages(stderr: str) -> list[str]:
    """stderr without the progress lines (those are not errors)."""
    return [line for line in stderr.splitlines() if line.strip() and not PROGRESS.match(line)]


@pytest.mark.slow
def test_refused_step_is_one_line_naming_the_setting_and_the_log(dagster_home: Path) -> None:
    # Before: 97 lines of Dagster ERROR logs and stack traces, and a reason naming
    # RefundLimits.max_refunds_per_batch instead of the variable to change (defect 9).
    env = {**os.environ, "DURABLE_MAX_REFUNDS_PER_BATCH": "1"}
    run = job_cli("run", "--id", "ceiling", "--size", "50", env=env)
    assert run.returncode == 1
    log = dagster_home / "logs" / "ceiling.log"
    assert _messages(run.stderr) == [
        line for line in run.stderr.splitlines() if line.startswith("error: batch ceiling failed at step 4")
    ], run.stderr
    (line,) = _messages(run.stderr)
    assert "DURABLE_MAX_REFUNDS_PER_BATCH" in line and "RefundLimits" not in line
    assert f"full log: {log}" in line
    text = log.read_text()
    assert "Stack Trace" in text and "RefundCeilingExceededError" in text and "enforce_guardrails" in text

    verbose = job_cli("--verbose", "run", "--id", "ceiling2", "--size", "50", env=env)
    assert verbose.returncode == 1
    assert "Stack Trace" in verbose.stderr and "enforce_guardrails" in verbose.stderr  # everything
    assert "enforce_guardrails" in (dagster_home / "logs" / "ceiling2.log").read_text()  # and the log too


@pytest.mark.slow
def test_canceled_batch_is_one_line(dagster_home: Path) -> None:
    env = {**os.environ, "DURABLE_STEP_DELAY_S": "4"}
    proc = subprocess.Popen(
        [str(JOB), "run", "--id", "stopme", "--size", "20"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while job_cli("status", "--id", "stopme").returncode != 0:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.5)
        assert job_cli("cancel", "--id", "stopme").returncode == 0
        _, stderr = proc.communicate(timeout=scaled(120))
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    (line,) = _messages(stderr)
    assert line.startswith("error: batch stopme canceled at step") and "job resume --id stopme" in line
    assert "stopme.log" in line and "Traceback" not in stderr


@pytest.mark.slow  # the step retries a dead provider with backoff: about two minutes
def test_dead_provider_is_one_line_naming_the_setting_before_the_batch_exists(dagster_home: Path) -> None:
    # Before: 308 to 1,010 lines of chained stack traces; then a batch that failed at step 1. Now the
    # provider's account is asked before the batch exists (#20), so a dead one leaves the ID unused.
    port = free_port()  # closed again before the run: nothing listens there
    env = {
        **os.environ,
        "DURABLE_PAYMENTS_URL": f"http://127.0.0.1:{port}",
        "STRIPE_API_KEY": "sk_test_x",
        "DURABLE_PROVIDER_DOWN_BUDGET_S": "5",
    }
    run = job_cli("run", "--id", "dead", "--size", "3", env=env, timeout=280)
    assert run.returncode == 2, run.stderr
    (line,) = _messages(run.stderr)
    assert line.startswith("error: ") and f"DURABLE_PAYMENTS_URL=http://127.0.0.1:{port}" in line, line
    assert "start it, or correct DURABLE_PAYMENTS_URL" in line, line
    assert job_cli("status", "--id", "dead", env=env).returncode == 3  # no batch was created


@pytest.mark.parametrize("argv", [["prune", "--dry-run"], ["list", "--json"], ["--help"]])
def test_reader_gone_is_not_a_traceback(dagster_home: Path, argv: list[str]) -> None:
    # `job prune --dry-run | head -3` ended in a BrokenPipeError traceback.
    proc = subprocess.Popen([str(JOB), *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first write, like `| head -0`
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=scaled(60)) == 0, stderr
    assert stderr == ""


def test_prune_dry_run_piped_to_head(dagster_home: Path) -> None:
    shell = subprocess.run(
        ["bash", "-o", "pipefail", "-c", f"'{JOB}' prune --dry-run | head -1"],
        capture_output=True,
        text=True,
        timeout=scaled(60),
        check=False,
    )
    assert shell.returncode == 0 and shell.stdout.startswith("would prune") and shell.stderr == ""


# --- messages name what the user changes, never a Python field (issue #14, defect 9) -------------


def test_ceiling_errors_name_the_variable_to_raise() -> None:
    import pandas as pd

    from durable_assets.refunds.assets import enforce_guardrails
    from durable_assets.refunds.errors import RefundCeilingExceededError
    from durable_assets.refunds.resources import RefundLimits

    candidates = pd.DataFrame(
        {
            "invoice_id": ["A", "B", "C"],
            "currency": ["usd"] * 3,
            "refund_cents": [100, 200, 300],
            "refundable_cents": [100, 200, 300],
        }
    )
    with pytest.raises(RefundCeilingExceededError) as count:
        enforce_guardrails(candidates, RefundLimits(max_refunds_per_batch=2))
    assert "DURABLE_MAX_REFUNDS_PER_BATCH to at least 3" in str(count.value)
    assert "RefundLimits" not in str(count.value) and "max_refunds_per_batch" not in str(count.value)
    with pytest.raises(RefundCeilingExceededError) as amount:
        enforce_guardrails(candidates, RefundLimits(max_amount_per_batch_cents=500))
    assert "DURABLE_MAX_AMOUNT_PER_BATCH_CENTS to at least 600" in str(amount.value)


def test_settings_errors_name_the_option_or_variable() -> None:
    from durable_assets.errors import UsageError, WebhookConfigError
    from durable_assets.ops.retention.pruning import RetentionPolicy
    from durable_assets.ops.webhooks.outbox import WebhookSettings

    with pytest.raises(UsageError, match=r"--failed-days / DURABLE_RETENTION_FAILED_DAYS"):
        RetentionPolicy(failed_days=-1)
    env = {
        "DURABLE_WEBHOOK_URLS": "http://127.0.0.1:9/hook",
        "DURABLE_WEBHOOK_SECRET": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        "DURABLE_WEBHOOK_MAX_ATTEMPTS": "lots",
    }
    with pytest.raises(
        WebhookConfigError, match=r"^DURABLE_WEBHOOK_MAX_ATTEMPTS='lots' is not a whole number"
    ):
        WebhookSettings.from_env(env)


def test_busy_port_and_bad_server_setting_are_one_line_exit_2(
    dagster_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        assert cli.main(["provider", "serve", "--port", port, "--db", str(tmp_path / "sim.db")]) == 2
        line = _one_error_line(capsys.readouterr().err)
        assert f"127.0.0.1:{port}" in line and "--port" in line
    monkeypatch.setenv("DURABLE_API_HEARTBEAT_S", "often")
    assert cli.main(["serve", "--port", "0"]) == 2
    assert "DURABLE_API_HEARTBEAT_S='often'" in _one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("key", [None, "sk_test_refused"])
def test_a_provider_that_cannot_be_used_is_exit_2_before_the_batch_exists(
    dagster_home: Path, tmp_path: Path, key: str | None
) -> None:
    """#23 item 3: a missing or refused STRIPE_API_KEY is a usage error, found before the batch
    exists, so the ID stays unused and no step ever runs against an unusable provider."""
    from tests.support.simulator import ThreadedSimulator

    with ThreadedSimulator(tmp_path / "sim.db", api_keys=["sk_test_the_right_one"]) as sim:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("STRIPE_", "DURABLE_"))}
        env |= {"DURABLE_PAYMENTS_URL": sim.url, **({"STRIPE_API_KEY": key} if key else {})}
        run = job_cli("run", "--id", "nokey", "--size", "5", env=env)
        assert run.returncode == 2, (run.stdout, run.stderr)
        line = _one_error_line(run.stderr)
        assert "STRIPE_API_KEY" in line, line
        status = job_cli("status", "--id", "nokey", env=env)
        assert status.returncode == 3, status.stderr  # no batch: the ID was not used up
        assert sim.server.store.stats()["refund_requests"] == 0


def _env(**settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DURABLE_", "DAGSTER_"))}
    return {**env, **settings}


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--id", "loc-1", "--size", "5"],
        ["status", "--id", "loc-1"],
        ["list"],
        ["cancel", "--id", "loc-1"],
    ],
)
def test_a_code_location_that_does_not_exist_is_exit_2_naming_it(
    dagster_home: Path, tmp_path: Path, argv: list[str]
) -> None:
    """Every command, also those that never import the location (status, list), and nothing made."""
    p = subprocess.run(
        [str(JOB), *argv],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_env(DAGSTER_HOME=str(dagster_home), DURABLE_CODE_LOCATION="nosuch_location"),
        timeout=scaled(120),
    )
    assert p.returncode == 2, p.stderr
    line = _one_error_line(p.stderr)
    assert "nosuch_location" in line and "DURABLE_CODE_LOCATION" in line, line
    assert not (dagster_home / "logs").exists() and not list(dagster_home.glob("batches/*"))


def test_dagster_home_that_is_a_file_is_exit_2_naming_it(tmp_path: Path) -> None:
    a_file = tmp_path / "home.txt"
    a_file.write_text("not a folder")
    for argv in (["status", "--id", "x"], ["run", "--id", "x", "--size", "5"]):
        p = subprocess.run(
            [str(JOB), *argv], capture_output=True, text=True, env=_env(DAGSTER_HOME=str(a_file)), timeout=120
        )
        assert p.returncode == 2, p.stderr
        line = _one_error_line(p.stderr)
        assert f"DAGSTER_HOME={a_file} is a file, not a folder" in line, line
    assert a_file.read_text() == "not a folder"


def test_a_postgres_home_without_its_url_is_exit_2_naming_the_variable(tmp_path: Path) -> None:
    """The shipped Postgres instance reads DAGSTER_PG_URL: unset, one line, not Dagster's config dump."""
    from tests.support.homes import shipped_home

    home = shipped_home(tmp_path, "postgres")
    for argv in (["status", "--id", "x"], ["run", "--id", "x", "--size", "5"], ["list"]):
        p = subprocess.run(
            [str(JOB), *argv], capture_output=True, text=True, env=_env(DAGSTER_HOME=str(home)), timeout=120
        )
        assert p.returncode == 2, p.stderr
        line = _one_error_line(p.stderr)
        assert line.startswith("error: DAGSTER_PG_URL is not set"), line
        assert "storage.postgres.postgres_url" in line and "DagsterInvalidConfigError" not in line, line
    assert sorted(f.name for f in home.iterdir()) == ["dagster.yaml"]  # nothing made


def test_other_instance_folders_dagster_refuses_are_one_line_each(tmp_path: Path) -> None:
    """Found while looking for the CLI's other `unexpected ...` paths from the environment (#39)."""
    from durable_assets.ops.instance import INSTANCE_YAML

    bad_key = tmp_path / "bad-key"
    bad_key.mkdir()
    (bad_key / "dagster.yaml").write_text("bogus_section: 1\n" + INSTANCE_YAML)
    cases = {
        "/proc/no-such-home": "cannot make the instance folder DAGSTER_HOME=/proc/no-such-home",
        str(bad_key): 'Received unexpected config entry "bogus_section" at the root',
    }
    for home, expected in cases.items():
        p = subprocess.run(
            [str(JOB), "status", "--id", "x"],
            capture_output=True,
            text=True,
            env=_env(DAGSTER_HOME=home),
            timeout=scaled(120),
        )
        assert p.returncode == 2, p.stderr
        assert expected in _one_error_line(p.stderr)


@pytest.mark.slow
def test_a_relative_dagster_home_is_the_folder_the_shell_means(tmp_path: Path) -> None:
    """Dagster itself wants an absolute path; `DAGSTER_HOME=here/home job ...` means ./here/home."""
    p = subprocess.run(
        [str(JOB), "run", "--id", "rel-1", "--size", "5"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_env(DAGSTER_HOME="here/home"),
        timeout=scaled(180),
    )
    assert p.returncode in (0, 4), p.stderr
    assert (tmp_path / "here" / "home" / "dagster.yaml").is_file()
    assert (tmp_path / "here" / "home" / "logs" / "rel-1.log").is_file()


@pytest.mark.slow
def test_an_unset_resource_env_var_is_exit_2_naming_it_and_the_id_stays_unused(tmp_path: Path) -> None:
    """A code location's resource reads ``EnvVar("PRINT_SHOP_DB")`` (docs/your-own-job.md's job, as
    printed) from a shell that lacks it: one line naming the variable and the resource field, exit 2
    (was: exit 1, "unexpected DagsterInvalidConfigError" and Dagster's config dump), no batch made;
    set, the same command runs the same ID."""
    from tests.crash.helpers import job_env
    from tests.support.homes import make_home
    from tests.support.tutorial import tutorial_folder

    folder, home = tutorial_folder(tmp_path), make_home(tmp_path)
    env = job_env(home, DURABLE_CODE_LOCATION="postcards", PRINT_SHOP_LATENCY_MS="0")
    assert "PRINT_SHOP_DB" not in env
    run = job_cli("run", "--id", "no-shop", "--size", "5", env=env, cwd=folder)
    assert run.returncode == 2, (run.stdout, run.stderr)
    line = _one_error_line(run.stderr)
    assert line == (
        "error: environment variable PRINT_SHOP_DB is not set (resource 'shop' reads it for 'path'); "
        "set it and run the command again"
    ), line
    assert job_cli("status", "--id", "no-shop", env=env, cwd=folder).returncode == 3  # no batch
    env["PRINT_SHOP_DB"] = str(tmp_path / "shop.db")
    again = job_cli("run", "--id", "no-shop", "--size", "5", env=env, cwd=folder)
    assert again.returncode == 0, (again.stdout, again.stderr)


class _Shop(ConfigurableResource):
    path: str
    latency_ms: int = 0


@asset
def _cards(shop: _Shop) -> int:
    return 1


def test_every_unset_env_var_is_named_with_the_field_that_reads_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dagster's own refusal (the pinned version's words) becomes our one line; any other config
    error is left as Dagster says it."""
    from dagster import DagsterInvalidConfigError, EnvVar, materialize

    from durable_assets.ops.runner import unset_variables_error

    for name in ("DA_TEST_SHOP_PATH", "DA_TEST_SHOP_LATENCY"):
        monkeypatch.delenv(name, raising=False)
    shop = _Shop(path=EnvVar("DA_TEST_SHOP_PATH"), latency_ms=EnvVar.int("DA_TEST_SHOP_LATENCY"))
    with pytest.raises(DagsterInvalidConfigError) as refused:
        materialize([_cards], resources={"shop": shop})
    named = unset_variables_error(refused.value)
    assert named is not None and named.exit_code == 2
    assert str(named) == (
        "environment variables DA_TEST_SHOP_PATH, DA_TEST_SHOP_LATENCY are not set (DA_TEST_SHOP_PATH: "
        "resource 'shop' reads it for 'path'; DA_TEST_SHOP_LATENCY: resource 'shop' reads it for "
        "'latency_ms'); set them and run the command again"
    )
    monkeypatch.setenv("DA_TEST_SHOP_PATH", "/tmp/shop.db")
    monkeypatch.setenv("DA_TEST_SHOP_LATENCY", "soon")  # set, but not an int: not ours to reword
    with pytest.raises(DagsterInvalidConfigError) as invalid:
        materialize([_cards], resources={"shop": shop})
    assert unset_variables_error(invalid.value) is None
