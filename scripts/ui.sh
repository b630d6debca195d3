#!/usr/bin/env bash
# The Dagster UI and daemon on this project's instance, bound to 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export DAGSTER_HOME="${DAGSTER_HOME:-$PWD/dagster_home}"
exec .venv/bin/dagster dev -w workspace.yaml -h 127.0.0.1 -p "${PORT:-3000}"
