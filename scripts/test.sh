#!/usr/bin/env bash
# Set everything up, then run the whole suite: lint, types, and every test tier.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
.venv/bin/ruff check durable_assets tests bench
.venv/bin/ruff format --check durable_assets tests bench
.venv/bin/mypy durable_assets
.venv/bin/pytest -q -p no:cacheprovider "$@"
