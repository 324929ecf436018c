#!/usr/bin/env bash
# PostgreSQL 15 from Debian packages, own cluster under .local/pg, run as a non-root user,
# non-default port, wal_level=logical for the relay.
# Usage: postgres.sh start|stop|status
source "$(dirname "$0")/common.sh"

PGDIR="$LOCAL/pg"
DATA="$PGDIR/data"
PG_BIN="${AGENTLEDGER_PG_BIN:-}"
if [ -z "$PG_BIN" ]; then
  for v in 15 16 17; do [ -x "/usr/lib/postgresql/$v/bin/postgres" ] && { PG_BIN="/usr/lib/postgresql/$v/bin"; break; }; done
fi

# initdb/pg_ctl refuse to run as root: as root we run them as the `postgres` system user.
as_pg() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

psql_() {
  local db=$1; shift
  PGPASSWORD="$PG_PASSWORD" PGCONNECT_TIMEOUT=3 "$PG_BIN/psql" -X -q -t -A -v ON_ERROR_STOP=1 \
    -h 127.0.0.1 -p "$PG_PORT" -U "$PG_USER" -d "$db" "$@"
}

ready() {
  psql_ "$PG_DB" -c "select 'postgres ' || current_setting('server_version') || ' wal_level=' || current_setting('wal_level')"
}

init() {
  [ -f "$DATA/PG_VERSION" ] && return 0
  log "initialising cluster in $DATA"
  mkdir -p "$PGDIR/run" "$PGDIR/log"
  [ "$(id -u)" = 0 ] && chown -R postgres:postgres "$PGDIR"
  local pwfile="$PGDIR/.pw"
  printf '%s\n' "$PG_PASSWORD" > "$pwfile"
  [ "$(id -u)" = 0 ] && chown postgres "$pwfile"
  as_pg "$PG_BIN/initdb" -D "$DATA" -U "$PG_USER" --pwfile="$pwfile" \
      --auth=scram-sha-256 --encoding=UTF8 --locale=C.UTF-8 >&2
  rm -f "$pwfile"
  cat "$ROOT/deploy/local/postgres/postgresql.conf" >> "$DATA/postgresql.conf"
  cat >> "$DATA/postgresql.conf" <<CONF
port = $PG_PORT
unix_socket_directories = '$PGDIR/run'
CONF
}

start() {
  [ -n "$PG_BIN" ] || die "PostgreSQL server binaries not found (run: make bootstrap)"
  if ready >/dev/null 2>&1; then log "already running"; return 0; fi
  init
  if as_pg "$PG_BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
    log "server running, checking database"
  else
    # Make sure the port line matches the current setting even if the cluster pre-exists.
    sed -i "s/^port = .*/port = $PG_PORT/" "$DATA/postgresql.conf"
    log "starting PostgreSQL on 127.0.0.1:$PG_PORT"
    as_pg "$PG_BIN/pg_ctl" -D "$DATA" -l "$PGDIR/log/server.log" -w -t 60 start >&2 \
      || { tail -n 30 "$PGDIR/log/server.log" >&2; die "pg_ctl start failed"; }
  fi
  wait_until 30 "postgres" psql_ postgres -c "select 1" || die "PostgreSQL did not answer select 1 within 30 s"
  if [ -z "$(psql_ postgres -c "select 1 from pg_database where datname = '$PG_DB'")" ]; then
    psql_ postgres -c "create database $PG_DB" >/dev/null
  fi
  log "ready: $(ready)"
}

stop() {
  if [ -f "$DATA/postmaster.pid" ]; then
    log "stopping PostgreSQL"
    as_pg "$PG_BIN/pg_ctl" -D "$DATA" -m fast -w -t 60 stop >&2 || true
  fi
}

status() {
  if out=$(ready 2>&1); then echo "postgres: up 127.0.0.1:$PG_PORT $out"; else echo "postgres: down"; return 1; fi
}

case "${1:-}" in
  start) start ;; stop) stop ;; status) status ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
