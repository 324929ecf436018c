#!/usr/bin/env bash
# The local stack: Kafka + PostgreSQL as plain processes. Idempotent.
# Usage: stack.sh up|down|status
# AGENTLEDGER_PG_STANDBY=sync (or async) also starts a physical standby (standby.sh).
source "$(dirname "$0")/common.sh"
HERE="$(dirname "$0")"
STANDBY="${AGENTLEDGER_PG_STANDBY:-}"

write_env() {
  local bootstrap="127.0.0.1:$KAFKA_PORT" brokers=1
  if [ -s "$LOCAL/kafka/cluster/brokers" ] && [ "${AGENTLEDGER_KAFKA_BROKERS:-}" != 1 ]; then
    bootstrap=$(bash "$HERE/kafka-cluster.sh" bootstrap)
    brokers=$(cat "$LOCAL/kafka/cluster/brokers")
  fi
  mkdir -p "$LOCAL"
  cat > "$LOCAL/env" <<ENV
# Written by deploy/local/stack.sh up; '. .local/env' reaches the running stack.
export AGENTLEDGER_DATABASE_URL=postgresql://$PG_USER:$PG_PASSWORD@127.0.0.1:$PG_PORT/$PG_DB
export AGENTLEDGER_KAFKA_BOOTSTRAP=$bootstrap
# Replicas of every topic the services create: 1 on one broker, 3 on a cluster.
export AGENTLEDGER_KAFKA_REPLICATION_FACTOR=$(( brokers < 3 ? brokers : 3 ))
# The ports it runs on: deploy/local reads them back when a shell sets none.
export AGENTLEDGER_PG_PORT=$PG_PORT
export AGENTLEDGER_PG_STANDBY_PORT=$PG_STANDBY_PORT
export AGENTLEDGER_KAFKA_PORT=$KAFKA_PORT
export AGENTLEDGER_KAFKA_CONTROLLER_PORT=$KAFKA_CONTROLLER_PORT
ENV
}

# Whether a standby was ever built for this stack (down and status then include it).
has_standby() { [ -d "$("$HERE/standby.sh" where)/data" ]; }

case "${1:-}" in
  up)
    "$HERE/postgres.sh" start
    case "$STANDBY" in
      "") ;;
      sync) "$HERE/standby.sh" start && "$HERE/standby.sh" sync ;;
      async) "$HERE/standby.sh" start && "$HERE/standby.sh" async ;;
      *) die "AGENTLEDGER_PG_STANDBY must be sync, async or empty" ;;
    esac
    "$HERE/kafka.sh" start
    write_env
    ;;
  down)
    "$HERE/kafka.sh" stop
    "$HERE/postgres.sh" stop
    # After the primary: a fast shutdown sends its last WAL to the standby first.
    "$HERE/standby.sh" stop
    ;;
  status)
    rc=0
    "$HERE/postgres.sh" status || rc=1
    if has_standby; then "$HERE/standby.sh" status || rc=1; fi
    "$HERE/kafka.sh" status || rc=1
    exit $rc
    ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
