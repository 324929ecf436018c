#!/usr/bin/env bash
# A physical streaming standby of the local primary (postgres.sh): pg_basebackup -R through a
# physical replication slot, its own cluster next to the primary's and its own port
# (AGENTLEDGER_PG_STANDBY_PORT, default primary + 1). Idempotent, like the other scripts.
# Usage: standby.sh start|stop [fast|immediate]|status|sync|async|promote|remove|where
#   sync     make it the primary's synchronous standby (every commit waits for its flush)
#   async    back to asynchronous (commits parked for it complete)
#   stop immediate   a crash: no shutdown checkpoint, recovery at the next start
#   promote  make it a primary (after the old primary is stopped: see docs/operations.md)
#   remove   stop it, make the primary asynchronous, drop its slot and its cluster
source "$(dirname "$0")/postgres.sh"

# Its walreceiver's application_name (cluster_name) and its slot on the primary: the name
# synchronous_standby_names lists.
NAME=agentledger_standby
SDIR=""
SDATA=""

slocate() {
  locate
  SDIR="$PGDIR-standby"
  SDATA="$SDIR/data"
}

spsql() { PG_PORT="$PG_STANDBY_PORT" psql_ "$@"; }

primary_up() { psql_ postgres -c "select 1" >/dev/null 2>&1; }

# The primary's view of its standby: "<state> <sync_state>", empty when not connected.
replication() {
  psql_ postgres -c "select state || ' ' || sync_state from pg_stat_replication where application_name = '$NAME'"
}

streaming() { case "$(replication)" in streaming*) return 0 ;; *) return 1 ;; esac; }
is_sync() { [ "$(replication)" = "streaming sync" ]; }

named_sync() { [ "$(psql_ postgres -c "show synchronous_standby_names")" = "$NAME" ]; }
names_none() { [ -z "$(psql_ postgres -c "show synchronous_standby_names")" ]; }
not_in_recovery() { [ "$(spsql postgres -c "select pg_is_in_recovery()")" = f ]; }

running() { as_pg "$PG_BIN/pg_ctl" -D "$SDATA" status >/dev/null 2>&1; }

# Whether the standby's cluster is a copy of the running primary (same system identifier):
# a primary initialised again (a wiped .local) makes it stale.
same_cluster() {
  local mine theirs
  mine=$(as_pg "$PG_BIN/pg_controldata" -D "$SDATA" 2>/dev/null | sed -n 's/^Database system identifier: *//p')
  theirs=$(psql_ postgres -c "select system_identifier from pg_control_system()")
  [ -n "$mine" ] && [ "$mine" = "$theirs" ]
}

basebackup() {
  log "copying the primary into $SDATA (pg_basebackup, slot $NAME)"
  if [ "$(id -u)" = 0 ]; then
    install -d -m 0700 -o postgres -g postgres "$SDIR" "$SDIR/run" "$SDIR/log"
  else
    mkdir -p -m 0700 "$SDIR" "$SDIR/run" "$SDIR/log"
  fi
  # A slot left by an earlier standby would hold WAL from its old position: start afresh.
  psql_ postgres -c "select pg_drop_replication_slot('$NAME') from pg_replication_slots where slot_name = '$NAME' and not active" >/dev/null
  # -R writes primary_conninfo (with the password) and primary_slot_name into
  # postgresql.auto.conf, plus standby.signal; -C creates the physical slot, so the primary
  # keeps every WAL segment the standby has not received while it is away.
  as_pg env PGPASSWORD="$PG_PASSWORD" "$PG_BIN/pg_basebackup" -h 127.0.0.1 -p "$PG_PORT" \
      -U "$PG_USER" -D "$SDATA" -R -X stream -c fast -C -S "$NAME" >&2 \
    || die "pg_basebackup failed"
  sed -i -e "s/^port = .*/port = $PG_STANDBY_PORT/" \
      -e "s|^unix_socket_directories = .*|unix_socket_directories = '$SDIR/run'|" \
      "$SDATA/postgresql.conf"
  printf "cluster_name = '%s'\n" "$NAME" >> "$SDATA/postgresql.conf"
  # The copy carries the primary's ALTER SYSTEM settings: a promoted standby must not wait
  # for a synchronous standby (itself, by name) that will never connect.
  sed -i -e '/^synchronous_standby_names/d' "$SDATA/postgresql.auto.conf"
}

start() {
  [ -n "$PG_BIN" ] || die "PostgreSQL server binaries not found (run: make bootstrap)"
  primary_up || die "the primary does not answer on 127.0.0.1:$PG_PORT (run: postgres.sh start)"
  slocate
  if [ -f "$SDATA/PG_VERSION" ] && ! same_cluster; then
    log "$SDATA is not a copy of the running primary: rebuilding it"
    running && as_pg "$PG_BIN/pg_ctl" -D "$SDATA" -m immediate -w stop >&2
    rm -rf "$SDATA"
  fi
  [ -f "$SDATA/PG_VERSION" ] || basebackup
  if running; then
    log "already running"
  else
    # The port line follows the current setting even when the cluster pre-exists.
    sed -i "s/^port = .*/port = $PG_STANDBY_PORT/" "$SDATA/postgresql.conf"
    log "starting the standby on 127.0.0.1:$PG_STANDBY_PORT"
    as_pg "$PG_BIN/pg_ctl" -D "$SDATA" -l "$SDIR/log/server.log" -w -t 60 start >&2 \
      || { tail -n 30 "$SDIR/log/server.log" >&2; die "pg_ctl start failed"; }
  fi
  if [ -f "$SDATA/standby.signal" ]; then
    wait_until 60 "streaming" streaming \
      || { tail -n 30 "$SDIR/log/server.log" >&2; die "the standby is not streaming from the primary"; }
    # Back in its role: a synchronous standby reports `sync` once it has caught up.
    if named_sync; then
      wait_until 60 "sync" is_sync || die "the standby did not become synchronous again: '$(replication)'"
    fi
    log "streaming: $(replication)"
  else
    log "promoted earlier: running as a primary"
  fi
}

stop() {
  local mode=${1:-fast}
  case "$mode" in fast|immediate) ;; *) die "stop mode must be fast or immediate" ;; esac
  slocate
  if [ -f "$SDATA/postmaster.pid" ]; then
    log "stopping the standby ($mode)"
    as_pg "$PG_BIN/pg_ctl" -D "$SDATA" -m "$mode" -w -t 60 stop >&2 || true
  fi
}

set_sync() {
  # synchronous_commit=on: a commit returns once the standby has flushed its WAL (the
  # default, written out so a local setting elsewhere cannot weaken it).
  psql_ postgres -c "alter system set synchronous_standby_names = '$NAME'" \
      -c "alter system set synchronous_commit = 'on'" -c "select pg_reload_conf()" >/dev/null
  wait_until 30 "sync" is_sync || die "the standby did not become synchronous: '$(replication)'"
  log "synchronous: $(replication)"
}

set_async() {
  psql_ postgres -c "alter system reset synchronous_standby_names" \
      -c "alter system reset synchronous_commit" -c "select pg_reload_conf()" >/dev/null
  wait_until 30 "async" names_none || die "the primary still names a synchronous standby"
  log "asynchronous"
}

promote() {
  slocate
  running || die "the standby is not running"
  [ -f "$SDATA/standby.signal" ] || { log "already promoted"; return 0; }
  log "promoting the standby on 127.0.0.1:$PG_STANDBY_PORT"
  as_pg "$PG_BIN/pg_ctl" -D "$SDATA" -w -t 60 promote >&2 || die "pg_ctl promote failed"
  wait_until 30 "promoted" not_in_recovery || die "the standby is still in recovery"
}

remove() {
  stop immediate
  if primary_up; then
    set_async
    # An inactive slot would hold WAL for a standby that never returns (up to
    # max_slot_wal_keep_size).
    psql_ postgres -c "select pg_drop_replication_slot('$NAME') from pg_replication_slots where slot_name = '$NAME'" >/dev/null
  fi
  log "removing $SDIR"
  rm -rf "$SDIR"
}

status() {
  local out
  if out=$(spsql postgres -c "select case when pg_is_in_recovery() then 'standby' else 'promoted' end" 2>&1); then
    echo "postgres standby: up 127.0.0.1:$PG_STANDBY_PORT $out replication='$(replication 2>/dev/null || true)'"
  else
    echo "postgres standby: down"; return 1
  fi
}

case "${1:-}" in
  start) start ;; stop) stop "${2:-fast}" ;; status) status ;;
  sync) set_sync ;; async) set_async ;; promote) promote ;; remove) remove ;;
  where) slocate; echo "$SDIR" ;;
  *) echo "usage: $0 start|stop [fast|immediate]|status|sync|async|promote|remove|where" >&2; exit 2 ;;
esac
