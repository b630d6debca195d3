#!/usr/bin/env bash
# The Dagster UI and daemon on this project's instance, bound to 127.0.0.1 (PORT, default 3000).
#   scripts/ui.sh               # setup (what is missing only), then `dagster dev`
#   scripts/ui.sh --no-setup    # straight to `dagster dev` (the tests; setup already done)
#
# Ctrl-C or SIGTERM stops everything within 5 s: webserver, daemon, code servers and any run worker
# still executing (its batch continues with `job resume --id ID` or the UI's "Re-execute from
# failure"; nothing is refunded twice). Left alone, `dagster dev` stops its code server only once
# runs in flight end, and ignores SIGTERM entirely when started with SIGINT ignored (as `cmd &`
# in a script, or under CI), so this script owns the stop. (Started with SIGINT ignored itself, it
# cannot trap SIGINT either: stop it with SIGTERM then.)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --no-setup ]; then shift; else ./scripts/setup.sh; fi
export DAGSTER_HOME="${DAGSTER_HOME:-$PWD/dagster_home}"

#: What `dagster dev` gets to shut down by itself before SIGKILL: ~2 s when idle on a quiet machine
#: (measured), more on a loaded one; never while a run is in flight (its code server waits for the
#: run to end). Then SIGKILL, so that the whole stop stays under 5 s.
GRACE_MS=2500

# Its own session, so that its whole tree (webserver, daemon, code servers, run workers) is one
# process group we can signal, and never the terminal's group or our caller's. SIGINT is reset to
# its default first: dagster maps SIGTERM to whatever SIGINT does, and bash starts background
# commands with SIGINT ignored.
#
# `dagster dev` is what this project runs (its `dg dev` successor needs a `dg` project layout):
# Dagster's SupersessionWarning about it says nothing a user of this script can act on.
export PYTHONWARNINGS="${PYTHONWARNINGS:+$PYTHONWARNINGS,}ignore:Function \`dev_command\` is superseded"
dev=(setsid .venv/bin/python -c
  'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])'
  .venv/bin/dagster dev -w workspace.yaml -h 127.0.0.1 -p "${PORT:-3000}" "$@")
# Dagster colours every log line, terminal or not; a log file gets them as plain text.
no_ansi() { sed -u 's/\x1b\[[0-9;]*[A-Za-z]//g'; }
if [ -t 1 ] && [ -t 2 ]; then
  "${dev[@]}" &
else
  "${dev[@]}" > >(no_ansi) 2> >(no_ansi >&2) &
fi
group=$!

now_us() { echo "${EPOCHREALTIME//[!0-9]/}"; }  # wall clock in µs, no fork
alive() { kill -0 -- "-$group" 2>/dev/null; }

stop() {  # $1: the signal to pass on (INT or TERM)
  trap '' INT TERM  # a second Ctrl-C does not cut the stop short
  echo "ui: stopping dagster dev (process group $group)" >&2
  kill -s "$1" -- "-$group" 2>/dev/null || true
  local deadline=$(($(now_us) + GRACE_MS * 1000))
  while alive && (($(now_us) < deadline)); do sleep 0.1; done
  alive || return 0
  echo "ui: $GRACE_MS ms passed; SIGKILL to what is left of the group:" >&2
  if command -v ps >/dev/null; then ps -o pid=,args= -g "$group" | cut -c1-100 >&2 || true; fi
  kill -s KILL -- "-$group" 2>/dev/null || true
}

trap 'stop INT; exit 130' INT
trap 'stop TERM; exit 143' TERM
echo "ui: dagster dev on http://127.0.0.1:${PORT:-3000} (DAGSTER_HOME=$DAGSTER_HOME); Ctrl-C stops it" >&2
rc=0
wait "$group" || rc=$?
# dagster dev ended by itself (a crash, or a signal sent to it directly): leave nothing behind.
if alive; then stop TERM; fi
exit "$rc"
