#!/usr/bin/env bash
# Set up what the demo needs (no browser, no PostgreSQL), then run a 1000-invoice demo batch on the
# repository's instance (dagster_home/, SQLite) and print where to look.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "demo: setting up (scripts/setup.sh)" >&2
./scripts/setup.sh
export DAGSTER_HOME="$PWD/dagster_home"
id="demo-$(date -u +%Y%m%d-%H%M%S)"
echo "demo: running batch $id: 1000 synthetic invoices, refunds through the embedded provider (about 10 s)" >&2
.venv/bin/job run --id "$id"
echo "demo: its state, step by step (job status --id $id)" >&2
.venv/bin/job status --id "$id"
echo
echo "Look at it in the Dagster UI: ./scripts/ui.sh, then open"
echo "  http://127.0.0.1:3000/runs?q%5B0%5D=tag%3Adurable%2Fbatch%3D$id   (its run)"
echo "  http://127.0.0.1:3000/assets/issued_refunds?view=partitions&partition=$id   (its refunds)"
