"""docs/contract.md and the code say the same thing (#23): the interface a clone documents is the
interface it has.

Read from the document itself: every ``job`` subcommand and option it names is one the parser
accepts, and every subcommand the parser has is named there; the status JSON's fields and words
are the models' and enums'; its exit codes are the CLI's; its environment variables are read
somewhere in the code or the shipped instance configurations. Nothing in the repository points at
a contract outside it.
"""

from __future__ import annotations

import argparse
import json
import re
import signal

from durable_assets.ops import cli
from durable_assets.ops.status_model import (
    BatchStatus,
    BatchStatusModel,
    ProgressModel,
    StepModel,
    StepStatus,
)
from tests.support.processes import REPO

DOC = REPO / "docs" / "contract.md"
#: Named in the contract, built by another open issue; each entry leaves this list with its code.
PENDING_OPTIONS: dict[tuple[str, str], str] = {}


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(actions[0].choices) if actions else {}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


def _commands_in_doc(text: str) -> list[tuple[str, set[str]]]:
    """(subcommand path, options) of every ``job ...`` in backquotes, e.g. ("provider serve", {...})."""
    found = []
    for usage in re.findall(r"`job ([a-z][^`]*)`", text):
        words = re.findall(r"[a-z][a-z-]*", usage.split("[")[0].split("--")[0])  # init-home is one word
        options = set(re.findall(r"--[a-z][a-z-]*", usage))
        found.append((" ".join(words), options))
    return found


def _parser_for(path: str) -> argparse.ArgumentParser | None:
    parser: argparse.ArgumentParser | None = cli.build_parser()
    for word in path.split():
        parser = _subparsers(parser).get(word) if parser else None
    return parser


def test_every_command_and_option_in_the_doc_exists() -> None:
    text = DOC.read_text()
    commands = _commands_in_doc(text)
    assert len(commands) >= 12, commands
    top = _options(cli.build_parser())
    for path, options in commands:
        if path == "":  # `job --verbose COMMAND`
            assert options <= top, options
            continue
        parser = _parser_for(path)
        assert parser is not None, f"docs/contract.md names `job {path}`, which the CLI does not have"
        missing = {o for o in options - _options(parser) - top if (path, o) not in PENDING_OPTIONS}
        assert not missing, f"`job {path}`: {sorted(missing)} named in docs/contract.md, not accepted"


def test_every_subcommand_of_the_cli_is_in_the_doc() -> None:
    named = {path for path, _ in _commands_in_doc(DOC.read_text())}
    parser = cli.build_parser()
    for name, sub in _subparsers(parser).items():
        nested = _subparsers(sub)
        paths = [f"{name} {n}" for n in nested] if nested else [name]
        for path in paths:
            assert path in named, f"`job {path}` is not documented in docs/contract.md"


def test_pending_options_are_still_pending_or_documented() -> None:
    """An option built since it was listed pending must leave the list (and the test then holds it)."""
    for (path, option), issue in PENDING_OPTIONS.items():
        parser = _parser_for(path)
        assert parser is not None
        if option in _options(parser):
            raise AssertionError(f"`job {path} {option}` ({issue}) exists now: drop it from PENDING_OPTIONS")


def _status_example(text: str) -> dict[str, object]:
    block = re.search(r"### `job status --id ID --json`.*?```json\n(.*?)```", text, re.S)
    assert block, "the status JSON example is gone from docs/contract.md"
    return dict(json.loads(block.group(1)))


def test_status_json_fields_and_words_are_the_models() -> None:
    """The example's fields exist; every other field of the models is named in the document too
    (the provider object in the contract's prose, the rest in "Beyond the users' contract")."""
    text = DOC.read_text()
    example = _status_example(text)
    named = set(re.findall(r"[`\"]([a-z_]+)[`\"]", text))  # `field` in prose, "field" in JSON
    batch_fields = set(BatchStatusModel.model_fields)
    assert set(example) <= batch_fields, set(example) - batch_fields
    assert batch_fields - set(example) <= named, batch_fields - set(example) - named
    progress = example["progress"]
    assert isinstance(progress, dict) and set(progress) <= set(ProgressModel.model_fields)
    steps = example["steps"]
    step_fields = set(StepModel.model_fields)
    assert isinstance(steps, list) and set(steps[0]) <= step_fields, set(steps[0]) - step_fields
    assert step_fields - set(steps[0]) <= named, step_fields - set(steps[0]) - named
    words = str(example["status"]).split(" | ")
    assert set(words) == {s.value for s in BatchStatus}, words
    step_words = str(steps[0]["status"]).split(" | ")
    assert set(step_words) == {s.value for s in StepStatus}, step_words


def test_exit_codes_are_the_clis() -> None:
    text = DOC.read_text()
    section = text[text.index("Exit codes:") : text.index("### `job status")]
    documented = {int(c) for c in re.findall(r"`(\d+)`", section)}
    code = {cli.EXIT_OK, cli.EXIT_FAILED, cli.EXIT_USAGE, cli.EXIT_CONFLICT, cli.EXIT_NEEDS_REVIEW}
    interrupted = {cli.EXIT_INTERRUPTED, 128 + signal.SIGTERM}  # Ctrl-C, SIGTERM (BatchInterruptedError)
    assert documented == code | interrupted


def test_environment_variables_are_read_somewhere() -> None:
    names = set(re.findall(r"\b((?:DURABLE|DAGSTER|STRIPE)_[A-Z_]+)\b", DOC.read_text()))
    assert {"DAGSTER_HOME", "DURABLE_PAYMENTS_URL", "STRIPE_API_KEY"} <= names
    sources = [*(REPO / "durable_assets").rglob("*.py"), *(REPO / "dagster_home").rglob("dagster.yaml")]
    code = "\n".join(p.read_text() for p in sources)
    missing = sorted(n for n in names if n not in code)
    assert not missing, f"named in docs/contract.md, read nowhere: {missing}"


def test_nothing_points_outside_the_repository_for_the_contract() -> None:
    files = [REPO / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "durable_assets").rglob("*.py")]
    stale = [
        str(p.relative_to(REPO)) for p in files if re.search(r"shared/CONTRACT|\bCONTRACT\.md", p.read_text())
    ]
    assert not stale, f"point these at docs/contract.md: {stale}"
    readme = (REPO / "README.md").read_text()
    assert "docs/contract.md" in readme and ".venv/bin/job" in readme and ".venv/bin/activate" in readme


def test_every_option_named_anywhere_in_the_doc_is_accepted() -> None:
    """Options in prose too (the simulator's fault options, ``--invoices``)."""

    def every(parser: argparse.ArgumentParser) -> set[str]:
        return _options(parser).union(*(every(s) for s in _subparsers(parser).values()))

    accepted = every(cli.build_parser()) | {o for _, o in PENDING_OPTIONS}
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*[a-z]", DOC.read_text()))
    assert {"--latency-ms", "--invoices"} <= named
    assert named <= accepted, sorted(named - accepted)


def test_every_jobs_graph_url_in_the_docs_opens_exactly_its_groups() -> None:
    """README and docs/ui.md link each durable job's whole graph with every group of its steps open."""
    from dagster import AssetKey

    from durable_assets.definitions import defs
    from durable_assets.ops.registry import durable_jobs

    docs = (REPO / "README.md").read_text() + (REPO / "docs" / "ui.md").read_text()
    for job in durable_jobs():
        groups = []
        for step in job.steps:
            group = defs.get_assets_def(AssetKey(step.key)).group_names_by_key[AssetKey(step.key)]
            if group not in groups:
                groups.append(group)
        url = re.search(
            rf"http://127\.0\.0\.1:3000/asset-groups~job:%22{job.name}%22\?expanded=([^)\s]+)", docs
        )
        assert url, f"no graph URL for {job.name} in README.md or docs/ui.md"
        assert url.group(1).split(",") == [f"global@global:{g}" for g in groups], (job.name, url.group(1))
