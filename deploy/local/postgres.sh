#!/usr/bin/env bash
# PostgreSQL 15 from Debian packages, own cluster under .local/pg (or PG_HOME_ROOT, below),
# run as a non-root user, non-default port, wal_level=logical for the relay.
# Usage: postgres.sh start|stop [fast|immediate]|status|where   (where: print the cluster's directory)
source "$(dirname "$0")/common.sh"

# Absolute: as root the tools run from / (see as_pg), so a relative path would point elsewhere.
case "$LOCAL" in /*) ;; *) LOCAL="$PWD/$LOCAL" ;; esac
# As root the server runs as `postgres`, which cannot traverse a 0700 directory above the
# checkout (/root, a private home). Then the cluster lives here instead, in a directory
# `postgres` owns, and $LOCAL/pg.location records which one.
PG_HOME_ROOT=/var/lib/agentledger
PGDIR=""  # set by locate (stop, where) or place (start)
DATA=""
PG_BIN="${AGENTLEDGER_PG_BIN:-}"
if [ -z "$PG_BIN" ]; then
  for v in 15 16 17; do [ -x "/usr/lib/postgresql/$v/bin/postgres" ] && { PG_BIN="/usr/lib/postgresql/$v/bin"; break; }; done
fi

# runuser lives in sbin, which a shell's PATH may leave out (env -i, cron, some sudo setups):
# without it the cluster would be looked for in the wrong place.
RUNUSER="$(command -v runuser || echo /usr/sbin/runuser)"

# initdb/pg_ctl refuse to run as root: as root we run them as the `postgres` system user,
# from / because they fail on a working directory they cannot enter.
as_pg() {
  if [ "$(id -u)" = 0 ]; then (cd / && "$RUNUSER" -u postgres -- "$@"); else "$@"; fi
}

# Whether the server user can reach $LOCAL. As an ordinary user the server runs as you.
reachable() {
  [ "$(id -u)" != 0 ] || "$RUNUSER" -u postgres -- test -x "$LOCAL" 2>/dev/null
}

# The external directory for this $LOCAL: one per checkout path, stable across runs.
external_dir() {
  echo "$PG_HOME_ROOT/pg-$(printf '%s' "$(realpath -m "$LOCAL")" | sha256sum | cut -c1-16)"
}

# The cluster's directory, without creating anything: pg.location when recorded, otherwise
# where `place` would put it (so stop also finds a server whose .local was wiped).
locate() {
  if [ -s "$LOCAL/pg.location" ]; then PGDIR=$(head -n 1 "$LOCAL/pg.location")
  elif reachable; then PGDIR="$LOCAL/pg"
  else PGDIR=$(external_dir); fi
  DATA="$PGDIR/data"
}

# locate, and when the cluster must live outside the checkout, prepare that directory.
place() {
  mkdir -p "$LOCAL"
  if [ -s "$LOCAL/pg.location" ] || reachable; then locate; return 0; fi
  id postgres >/dev/null 2>&1 || die "no postgres system user (run: make bootstrap)"
  local dir; dir=$(external_dir)
  if [ -d "$dir" ]; then
    # Recorded nowhere: left by a wiped .local or a deleted checkout at this path. A wiped
    # .local means a fresh stack, as it does inside the checkout.
    log "removing the unrecorded cluster $dir left by an earlier .local at this path"
    if as_pg "$PG_BIN/pg_ctl" -D "$dir/data" status >/dev/null 2>&1; then
      as_pg "$PG_BIN/pg_ctl" -D "$dir/data" -m fast -w -t 60 stop >&2 \
        || die "could not stop the server running from $dir/data"
    fi
    rm -rf "$dir"
  fi
  log "postgres cannot enter $LOCAL (a 0700 directory above it?): the cluster lives in $dir"
  install -d -m 0755 -o root -g root "$PG_HOME_ROOT"
  install -d -m 0700 -o postgres -g postgres "$dir"
  echo "$dir" > "$LOCAL/pg.location"
  # For humans only (tail .local/pg/log/server.log); postgres is only ever given the real path.
  [ -e "$LOCAL/pg" ] || [ -L "$LOCAL/pg" ] || ln -s "$dir" "$LOCAL/pg"
  locate
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
  (umask 077 && printf '%s\n' "$PG_PASSWORD" > "$pwfile")
  [ "$(id -u)" = 0 ] && chown postgres "$pwfile"
  mkdir -p "$LOGS"
  as_pg "$PG_BIN/initdb" -D "$DATA" -U "$PG_USER" --pwfile="$pwfile" \
      --auth=scram-sha-256 --encoding=UTF8 --locale=C.UTF-8 >> "$LOGS/postgres-init.log" 2>&1 \
    || { tail -n 20 "$LOGS/postgres-init.log" >&2; die "initdb failed: $LOGS/postgres-init.log"; }
  rm -f "$pwfile"
  cat "$ROOT/deploy/local/postgres/postgresql.conf" >> "$DATA/postgresql.conf"
  cat >> "$DATA/postgresql.conf" <<CONF
port = $PG_PORT
unix_socket_directories = '$PGDIR/run'
CONF
}

start() {
  [ -n "$PG_BIN" ] || die "PostgreSQL server binaries not found (run: make bootstrap)"
  place
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

# stop immediate: a crash (no shutdown checkpoint; recovery at the next start).
stop() {
  local mode=${1:-fast}
  case "$mode" in fast|immediate) ;; *) die "stop mode must be fast or immediate" ;; esac
  locate
  if [ -f "$DATA/postmaster.pid" ]; then
    log "stopping PostgreSQL ($mode)"
    as_pg "$PG_BIN/pg_ctl" -D "$DATA" -m "$mode" -w -t 60 stop >&2 || true
  fi
}

status() {
  if out=$(ready 2>&1); then echo "postgres: up 127.0.0.1:$PG_PORT $out"; else echo "postgres: down"; return 1; fi
}

# Sourced by standby.sh for the functions above; run, it manages the primary.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  case "${1:-}" in
    start) start ;; stop) stop "${2:-fast}" ;; status) status ;;
    where) locate; echo "$PGDIR" ;;
    *) echo "usage: $0 start|stop [fast|immediate]|status|where" >&2; exit 2 ;;
  esac
fi
