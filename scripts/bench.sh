#!/usr/bin/env bash
# The benchmark suite (issue #8): set up, then run every scenario and print one table.
#   scripts/bench.sh                # quick sizes, all scenarios (< 10 min on a 2-core machine)
#   scripts/bench.sh --full         # the issue's full sizes
#   scripts/bench.sh --only 1,3     # some scenarios;  --json PATH (default bench/results/latest.json)
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh >&2
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec .venv/bin/python -m bench "$@"
