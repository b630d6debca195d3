#!/usr/bin/env bash
# Idempotent setup on a fresh Debian machine with Python 3.11: system packages, the virtualenv,
# the package with its pinned Dagster family, and a running local Postgres for the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3

need_apt=()
command -v pg_ctlcluster >/dev/null || need_apt+=(postgresql)
# The browser test (tests/ui) drives Debian's chromium through Playwright; no browser download.
[ -x /usr/bin/chromium ] || need_apt+=(chromium)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]} from Debian" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -m pip install -q -e ".[dev]" 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -c "import dagster, dagster_postgres, psycopg2, stripe, playwright" \
  || { echo "setup: the Python dependencies did not install" >&2; exit 1; }

# Postgres (the suites run on it too). Debian's cluster, trust auth on 127.0.0.1:5432.
if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
  for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
fi
pg_isready -h 127.0.0.1 -p 5432 >&2 || echo "setup: Postgres is not running; Postgres tests will fail" >&2
