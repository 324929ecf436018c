# Shared helpers for the local (no-Docker) stack. Sourced, not run.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
LOCAL="${AGENTLEDGER_LOCAL_DIR:-$ROOT/.local}"
# Non-default ports so a developer's own Kafka/Postgres on 9092/5432 never collides with ours.
KAFKA_PORT="${AGENTLEDGER_KAFKA_PORT:-19092}"
KAFKA_CONTROLLER_PORT="${AGENTLEDGER_KAFKA_CONTROLLER_PORT:-19093}"
PG_PORT="${AGENTLEDGER_PG_PORT:-55432}"
# The physical standby of deploy/local/standby.sh, next to the primary by default.
PG_STANDBY_PORT="${AGENTLEDGER_PG_STANDBY_PORT:-$((PG_PORT + 1))}"
PG_USER=agentledger
PG_PASSWORD=agentledger
PG_DB=agentledger
PYTHON="${AGENTLEDGER_PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON=python3

log() { printf '%s %s\n' "[$(basename "$0" .sh)]" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# wait_until DEADLINE_SECONDS DESCRIPTION CMD... : poll CMD until it succeeds or the deadline passes.
wait_until() {
  local deadline=$(( $(date +%s) + $1 )); local what=$2; shift 2
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$deadline" ] || return 1
    sleep 0.5
  done
}

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
