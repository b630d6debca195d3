#!/usr/bin/env bash
# Set everything up, then run a 1000-invoice demo batch on the repository's instance (dagster_home/).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export DAGSTER_HOME="$PWD/dagster_home"
id="demo-$(date -u +%Y%m%d-%H%M%S)"
.venv/bin/job run --id "$id"
.venv/bin/job status --id "$id"
echo
echo "Look at it in the Dagster UI:  ./scripts/ui.sh   (then open http://127.0.0.1:3000)"
