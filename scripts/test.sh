#!/usr/bin/env bash
# Set up everything the suite needs (PostgreSQL and Debian's Chromium too), then run the whole
# suite: lint, types, and every test tier. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "test: setting up (scripts/setup.sh --with-postgres --with-browser --with-rabbitmq)" >&2
./scripts/setup.sh --with-postgres --with-browser --with-rabbitmq
echo "test: lint and format (ruff), types (mypy)" >&2
.venv/bin/ruff check durable_assets durable_assets_testing tests bench
.venv/bin/ruff format --check durable_assets durable_assets_testing tests bench
.venv/bin/mypy durable_assets durable_assets_testing
echo "test: every test tier on two pytest workers (the slow crash and browser tiers take several minutes)" >&2
# Two workers, one test file each at a time: most tests wait on real processes (a killed batch, a
# resume, a browser) rather than on the CPU, and a file's module fixtures stay in one worker.
.venv/bin/pytest -q -p no:cacheprovider -n 2 --dist loadfile "$@"
