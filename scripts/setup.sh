#!/usr/bin/env bash
# Idempotent setup on a Debian machine with Python 3.11: does only what is missing, and says what.
#   scripts/setup.sh                                   # the demo and the UI: .venv with the package
#   scripts/setup.sh --with-postgres --with-browser --with-rabbitmq   # the test suite (scripts/test.sh)
# System packages come from Debian's apt and need root (sudo is used when present). Verbose output
# of apt and pip goes to .setup/*.log; on a failure its last lines are printed and setup exits 1.
set -euo pipefail
cd "$(dirname "$0")/.."

with_browser=0 with_postgres=0 with_rabbitmq=0
for arg in "$@"; do
  case "$arg" in
    --with-browser) with_browser=1 ;;    # Debian's chromium, driven by Playwright in tests/ui
    --with-postgres) with_postgres=1 ;;  # a running local PostgreSQL (Postgres tiers of the suite)
    --with-rabbitmq) with_rabbitmq=1 ;;  # a running local RabbitMQ (the distributed tier's broker)
    -h | --help) sed -n '2,6p' "$0"; exit 0 ;;
    *) echo "setup: unknown option $arg (see --help)" >&2; exit 2 ;;
  esac
done

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
LOGS="$PWD/.setup"
mkdir -p "$LOGS"
STAGES=5
as_root=()  # apt-get and pg_ctlcluster need root: sudo when we are not root (and have it)
if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null; then as_root=(sudo env DEBIAN_FRONTEND=noninteractive); fi
say() { echo "setup: $*" >&2; }
stage() { say "[$1/$STAGES] $2"; }
fail() {  # $1: what failed, $2: its log
  say "FAILED: $1. Last lines of $2:"
  tail -n 25 "$2" | cut -c1-300 | sed "s/^/  | /" >&2
  exit 1
}

# --- 1. system packages (only what this command needs and the machine lacks) ---------------------
need_apt=() why=()
if ! "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null; then  # Debian ships venv apart from python3
  need_apt+=(python3-venv) why+=("python3-venv for .venv")
fi
if [ $with_postgres = 1 ] && ! command -v pg_ctlcluster >/dev/null; then
  need_apt+=(postgresql) why+=("postgresql for the Postgres tests")
fi
if [ $with_postgres = 1 ] && ! command -v faketime >/dev/null; then  # the clock-skew tests' other clocks
  need_apt+=(faketime) why+=("faketime for the clock-skew tests")
fi
amqp_up() { (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null; }  # anything answering on RabbitMQ's port
if [ $with_rabbitmq = 1 ] && ! amqp_up && ! command -v rabbitmq-server >/dev/null; then
  need_apt+=(rabbitmq-server) why+=("rabbitmq-server for the distributed tests")
fi
if [ $with_browser = 1 ] && [ ! -x /usr/bin/chromium ]; then
  need_apt+=(chromium) why+=("chromium for the browser tests")
fi
if [ ${#need_apt[@]} -eq 0 ]; then
  stage 1 "system packages: nothing to install"
else
  stage 1 "system packages: installing $(IFS=,; echo "${why[*]}" | sed 's/,/, /g') from Debian (apt, as root; ~1-3 min; log: $LOGS/apt.log)"
  if [ "$(id -u)" != 0 ] && [ ${#as_root[@]} -eq 0 ]; then
    say "FAILED: installing ${need_apt[*]} needs root: run this as root, or 'apt-get install ${need_apt[*]}' as root first"
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive  # no debconf questions; its notices go to the log
  {
    echo "### $(date -u +%FT%TZ) apt-get update && apt-get install ${need_apt[*]}"
    "${as_root[@]}" apt-get update &&
      "${as_root[@]}" apt-get install -y "${need_apt[@]}"
  } >>"$LOGS/apt.log" 2>&1 || fail "apt-get could not install ${need_apt[*]}" "$LOGS/apt.log"
fi

# --- 2. the virtualenv ---------------------------------------------------------------------------
if [ -x .venv/bin/python ]; then
  stage 2 ".venv: present ($(.venv/bin/python --version 2>&1))"
else
  stage 2 "creating .venv with $("$PYTHON" --version 2>&1)"
  "$PYTHON" -m venv .venv || { say "FAILED: $PYTHON -m venv .venv"; exit 1; }
fi

# --- 3. Python packages (pip only when pyproject.toml's requirements are not all met) -------------
# Every requirement (with the dev extra) installed at an accepted version, the package itself and
# its console scripts present: nothing to do, no network.
requirements_met() {
  .venv/bin/python - <<'EOF' 2>/dev/null
import os, sys, tomllib
from importlib.metadata import PackageNotFoundError, version
from importlib.util import find_spec
from pathlib import Path
from packaging.requirements import Requirement

pyproject = tomllib.loads(Path("pyproject.toml").read_text())
project = pyproject["project"]
version(project["name"])
# Every top-level package is found through the install, not through this folder: an editable
# install made before a package was added (durable_assets_testing) does not know it.
sys.path = [entry for entry in sys.path if entry not in ("", os.getcwd())]
for pattern in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]:
    if "." not in pattern:
        assert find_spec(pattern) is not None, pattern
for name in project.get("scripts", {}):
    assert (Path(".venv/bin") / name).exists(), name
for line in project["dependencies"] + project["optional-dependencies"]["dev"]:
    req = Requirement(line)
    if req.marker is None or req.marker.evaluate({"extra": "dev"}):
        assert req.specifier.contains(version(req.name), prereleases=True), line
EOF
}
if requirements_met; then
  stage 3 "Python packages: all of pyproject.toml's requirements are installed"
else
  log="$LOGS/pip.log"
  stage 3 "installing Python packages into .venv (first time: ~2 min; log: $log)"
  : >"$log"
  (
    .venv/bin/python -m pip install --upgrade pip &&
      .venv/bin/python -m pip install --progress-bar off -e ".[dev]"
  ) >>"$log" 2>&1 &
  pip_pid=$!
  # One line every 20 s, so a long install is never silent: how far pip got.
  last=$SECONDS
  while kill -0 "$pip_pid" 2>/dev/null; do
    sleep 1
    if ((SECONDS - last >= 20)); then
      last=$SECONDS
      collected=$(grep -c '^Collecting' "$log" || true)
      now=$(grep -E '^(Collecting|Installing collected|Building)' "$log" | tail -n1 | cut -c1-70 || true)
      say "      ... ${SECONDS} s, ${collected} packages resolved; ${now:-starting}"
    fi
  done
  wait "$pip_pid" || fail "pip could not install the package" "$log"
  requirements_met || fail "pip finished, but pyproject.toml's requirements are still not met" "$log"
  say "      done: $(grep -c '^Collecting' "$log" || true) packages resolved, in ${SECONDS} s"
fi

# --- 4. PostgreSQL (Debian's cluster, trust auth on 127.0.0.1:5432), for the test suite ----------
if [ $with_postgres = 0 ]; then
  stage 4 "PostgreSQL: not needed here (SQLite in dagster_home/); scripts/test.sh asks for it"
elif pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
  stage 4 "PostgreSQL: running on 127.0.0.1:5432"
else
  cluster=$(ls /etc/postgresql 2>/dev/null | head -n1)
  stage 4 "PostgreSQL: starting Debian's cluster ${cluster:-?}/main on 127.0.0.1:5432 (log: $LOGS/postgres.log)"
  [ -n "$cluster" ] || { say "FAILED: no cluster under /etc/postgresql (is the postgresql package installed?)"; exit 1; }
  "${as_root[@]}" pg_ctlcluster --skip-systemctl-redirect "$cluster" main start >>"$LOGS/postgres.log" 2>&1 || true
  for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
  pg_isready -q -h 127.0.0.1 -p 5432 || fail "PostgreSQL did not start on 127.0.0.1:5432" "$LOGS/postgres.log"
fi

# --- 5. RabbitMQ (Debian's rabbitmq-server, guest/guest on 127.0.0.1:5672), for the distributed tier
if [ $with_rabbitmq = 0 ]; then
  stage 5 "RabbitMQ: not needed here (only \`job worker\` / --executor celery use it); scripts/test.sh asks for it"
elif amqp_up; then
  stage 5 "RabbitMQ: running on 127.0.0.1:5672"
else
  stage 5 "RabbitMQ: starting Debian's rabbitmq-server on 127.0.0.1:5672 (log: $LOGS/rabbitmq.log)"
  "${as_root[@]}" rabbitmq-server -detached >>"$LOGS/rabbitmq.log" 2>&1 || true
  for _ in $(seq 1 60); do amqp_up && break; sleep 1; done
  amqp_up || fail "RabbitMQ did not start on 127.0.0.1:5672" "$LOGS/rabbitmq.log"
fi
say "ready"
