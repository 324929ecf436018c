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

# recorded_pid PIDFILE MARK: the pid a script recorded when it started a process, if that
# process is alive and its command line still names MARK (e.g. its config file): a pid the
# system recycled for someone else's process is never signalled.
recorded_pid() {
  local pf=$1 mark=$2 pid cmd
  pid_alive "$pf" || return 1
  pid=$(cat "$pf")
  if [ -r "/proc/$pid/cmdline" ]; then
    cmd=$(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null) || return 1
    [[ "$cmd" == *"$mark"* ]] || return 1
  fi
  echo "$pid"
}

# Whether PID has exited: gone, or a zombie its parent has not reaped yet (it acts no more).
exited() {
  kill -0 "$1" 2>/dev/null || return 0
  local state; state=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
  [ "$state" = Z ]
}

# stop_recorded PIDFILE MARK WHAT GRACE_S [SIGNAL]: stop the process recorded in PIDFILE (see
# recorded_pid) with SIGNAL (TERM: a graceful shutdown), KILL it if it is still there after
# GRACE_S seconds, and forget the pid file. Never by a command-line pattern: only what our
# scripts started and recorded is stopped.
stop_recorded() {
  local pf=$1 mark=$2 what=$3 grace=$4 sig=${5:-TERM} pid
  if pid=$(recorded_pid "$pf" "$mark"); then
    log "stopping $what (pid $pid)"
    kill -"$sig" "$pid" 2>/dev/null || true
    if ! wait_until "$grace" "$what exit" exited "$pid"; then
      log "forcing $what (pid $pid)"
      kill -KILL "$pid" 2>/dev/null || true
      wait_until 10 "$what killed" exited "$pid" || log "$what (pid $pid) survived KILL"
    fi
  fi
  rm -f "$pf"
}
