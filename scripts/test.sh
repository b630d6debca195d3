#!/usr/bin/env bash
# Set up everything the suite needs (PostgreSQL, RabbitMQ and Debian's Chromium too), then run the
# suite: lint, types, and the test tiers. Extra arguments go to pytest.
#   scripts/test.sh            # the default tier: one example of each proof (what .ci/run runs)
#   scripts/test.sh --quick    # a developer's loop (minutes, not half an hour): lint, types, unit,
#                              # resource and materialize tests on SQLite; no real-process crash, daemon,
#                              # distributed, browser or `slow` tests, no Postgres/RabbitMQ/Chromium setup
#   scripts/test.sh --full     # the default tier plus the repeats: tests marked `full`, the full crash
#                              # enumeration (every point at every hit) and every random kill point
# Every wall-clock deadline follows the machine's measured slowness (tests/support/machine.py); the
# factor is the first line pytest prints, and the range it took the last.
set -euo pipefail
cd "$(dirname "$0")/.."
tier=default
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) tier=quick; shift ;;
    --full) tier=full; shift ;;
    *) break ;;
  esac
done
if [ $tier = quick ]; then
  echo "test: setting up (scripts/setup.sh)" >&2
  ./scripts/setup.sh
else
  echo "test: setting up (scripts/setup.sh --with-postgres --with-browser --with-rabbitmq)" >&2
  ./scripts/setup.sh --with-postgres --with-browser --with-rabbitmq
fi
echo "test: lint and format (ruff), types (mypy)" >&2
.venv/bin/ruff check durable_assets durable_assets_testing tests bench
.venv/bin/ruff format --check durable_assets durable_assets_testing tests bench
.venv/bin/mypy durable_assets durable_assets_testing
# Two workers, one test file each at a time: most tests wait on real processes (a killed batch, a
# resume, a browser) rather than on the CPU, and a file's module fixtures stay in one worker.
pytest=(.venv/bin/pytest -q -p no:cacheprovider -n 2 --dist loadfile --durations=10)
case $tier in
  quick)
    echo "test: the quick tier (SQLite; no crash, daemon, distributed, browser or slow tests)" >&2
    exec "${pytest[@]}" -m "not slow and not full" -k "not postgres" \
      --ignore=tests/crash --ignore=tests/distributed --ignore=tests/ui "$@" ;;
  full)
    echo "test: every tier, with the repeated proofs (--full: about an hour)" >&2
    export DURABLE_CRASH_ENUMERATE=full  # read by the crash tier as its modules are imported
    exec "${pytest[@]}" --full "$@" ;;
  *)
    echo "test: every test tier on two pytest workers (the slow crash and browser tiers take several minutes)" >&2
    exec "${pytest[@]}" "$@" ;;
esac
