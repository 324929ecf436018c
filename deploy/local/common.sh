# Shared helpers for the local (no-Docker) stack. Sourced, not run.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
LOCAL="${AGENTLEDGER_LOCAL_DIR:-$ROOT/.local}"
# Install and build output (apt, pip, Maven, go, initdb): one file per step, never the terminal.
LOGS="$LOCAL/logs"

# The ports the stack was started on, as stack.sh up recorded them in $LOCAL/env: a shell that
# sets none (a fresh terminal, `make down` next week) reaches the same stack, not the default
# ports, where another checkout's stack may be.
for _port in AGENTLEDGER_KAFKA_PORT AGENTLEDGER_KAFKA_CONTROLLER_PORT AGENTLEDGER_PG_PORT \
             AGENTLEDGER_PG_STANDBY_PORT; do
  if [ -z "${!_port:-}" ] && [ -f "$LOCAL/env" ]; then
    _value=$(sed -n "s/^export $_port=\([0-9][0-9]*\)\$/\1/p" "$LOCAL/env" | tail -n 1)
    [ -z "$_value" ] || export "$_port=$_value"
  fi
done
unset _port _value
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

# took START: the seconds since START ($SECONDS), for a person ("12 s", "3 min 04 s").
took() {
  local s=$((SECONDS - $1))
  if [ "$s" -lt 60 ]; then echo "$s s"; else printf '%d min %02d s\n' $((s / 60)) $((s % 60)); fi
}

# One line per step on the terminal, the step's output in $LOGS/<name>.log:
#   step_start NAME TITLE CMD...   run CMD in the background (it may be a function of the script)
#   step_wait NAME...              wait for them; print "✓ TITLE (time)" for each, or "✗ TITLE
#                                  failed", the end of its log and the log's path; fails if any
#                                  failed
#   step NAME TITLE CMD...         both, for one step
# CMD runs under `set -e` in a subshell of its own (started in the background so that `set -e`
# holds inside it), so a failing command inside a function fails the step.
declare -A STEP_PID=() STEP_TITLE=() STEP_START=()

step_start() {
  local name=$1 title=$2; shift 2
  mkdir -p "$LOGS"
  printf '==> %s  [%s]\n' "$title" "$(date '+%F %T')" > "$LOGS/$name.log"
  ( set -e; "$@" ) >> "$LOGS/$name.log" 2>&1 < /dev/null &
  STEP_PID[$name]=$!
  STEP_TITLE[$name]=$title
  STEP_START[$name]=$SECONDS
}

step_wait() {
  local name rc failed=0 waiting=()
  for name in "$@"; do waiting+=("${STEP_TITLE[$name]}"); done
  # On a terminal, what is still running, replaced by the result lines.
  [ -t 2 ] && printf '  · %s …' "$(printf '%s; ' "${waiting[@]}" | sed 's/; $//')" >&2
  for name in "$@"; do
    rc=0
    wait "${STEP_PID[$name]}" || rc=$?
    [ -t 2 ] && printf '\r\033[K' >&2
    if [ "$rc" = 0 ]; then
      printf '  ✓ %s (%s)\n' "${STEP_TITLE[$name]}" "$(took "${STEP_START[$name]}")" >&2
    else
      failed=$rc
      printf '  ✗ %s failed (exit %d); the end of %s:\n' "${STEP_TITLE[$name]}" "$rc" \
        "$LOGS/$name.log" >&2
      tail -n 15 "$LOGS/$name.log" | sed 's/^/      /' >&2
    fi
  done
  return "$failed"
}

step() {
  local name=$1
  step_start "$@"
  step_wait "$name"
}

# The locks apt and dpkg take. Another package manager holding one (an unattended upgrade, a
# second terminal) must be waited for, not fail the install two seconds in.
APT_LOCKS=(${AGENTLEDGER_APT_LOCKS:-/var/lib/dpkg/lock-frontend /var/lib/dpkg/lock /var/lib/apt/lists/lock /var/cache/apt/archives/lock})
# Bounded: an upgrade finishes in minutes; a lock held longer is stuck or waits for a person.
APT_LOCK_WAIT_S="${AGENTLEDGER_APT_LOCK_WAIT_S:-600}"

# lock_holder FILE: "pid N (command)" of the process holding FILE's POSIX lock (/proc/locks).
lock_holder() {
  local inode pid
  inode=$(stat -c %i "$1" 2>/dev/null) || return 1
  pid=$(awk -v inode="$inode" '$2 == "POSIX" { n = split($6, id, ":"); if (id[n] == inode) { print $5; exit } }' /proc/locks)
  [ -n "$pid" ] || return 1
  echo "pid $pid ($(cat "/proc/$pid/comm" 2>/dev/null || echo gone))"
}

# wait_for_apt: return once no apt/dpkg lock is held, saying once what it waits for; fail with
# the holder's name after APT_LOCK_WAIT_S seconds.
wait_for_apt() {
  local deadline=$((SECONDS + APT_LOCK_WAIT_S)) said="" holder lock
  while :; do
    holder=""
    for lock in "${APT_LOCKS[@]}"; do holder=$(lock_holder "$lock") && break; done
    [ -n "$holder" ] || return 0
    if [ -z "$said" ]; then
      log "another package manager is running ($holder holds $lock): waiting for it, up to $((APT_LOCK_WAIT_S / 60)) min"
      said=1
    fi
    [ "$SECONDS" -lt "$deadline" ] || die "$holder still holds $lock after $APT_LOCK_WAIT_S s: let it finish (or stop it), then run the command again"
    sleep 1
  done
}
