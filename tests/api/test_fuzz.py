"""Property-based fuzzing of the real `job serve` from its own /openapi.json (schemathesis).

Every check schemathesis has runs (`--checks all`): no 5xx; every status code, content type and
JSON body (event-stream payloads included) matches the document; invalid input is rejected and
valid input accepted; auth is not ignored (the served instance has a token, so the document
declares bearer auth and schemathesis also tries without it). Half of the generated batch IDs are
the served instance's finished batch, so the 200 paths are exercised, not only 404 and 422.

The schemathesis CLI is used rather than its pytest plugin, which reaches into pytest internals
that pytest 9 changed.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.api.conftest import Served
from tests.api.helpers import TOKEN

SCHEMATHESIS = Path(sys.executable).parent / "schemathesis"


@pytest.mark.slow
def test_api_conforms_to_its_openapi_document(served: Served, tmp_path: Path) -> None:
    config = tmp_path / "schemathesis.toml"
    config.write_text(
        f'[dictionaries.batches]\nvalues = ["{served.batch_id}"]\n\n'
        '[parameters]\n"path.id" = { dictionary = "batches", probability = 0.5 }\n'
    )
    result = subprocess.run(
        [
            str(SCHEMATHESIS),
            "--config-file",
            str(config),
            "run",
            f"{served.url}/openapi.json",
            "--header",
            f"Authorization: Bearer {TOKEN}",
            "--checks",
            "all",
            "--max-examples",
            "20",
            "--generation-database",
            "none",
            "--request-timeout",
            "30",
            "--no-color",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    report = result.stdout[-6000:] + result.stderr[-2000:]
    assert result.returncode == 0, report
    assert "No issues found" in result.stdout, report
    tested = re.search(r"Tested: (\d+)", result.stdout)
    assert tested and int(tested.group(1)) >= 5, report  # every route (the document's own is skipped)
