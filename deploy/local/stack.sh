#!/usr/bin/env bash
# The local stack: Kafka + PostgreSQL as plain processes. Idempotent.
# Usage: stack.sh up|down|status
source "$(dirname "$0")/common.sh"
HERE="$(dirname "$0")"

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
ENV
}

case "${1:-}" in
  up)
    "$HERE/postgres.sh" start
    "$HERE/kafka.sh" start
    write_env
    ;;
  down)
    "$HERE/kafka.sh" stop
    "$HERE/postgres.sh" stop
    ;;
  status)
    rc=0
    "$HERE/postgres.sh" status || rc=1
    "$HERE/kafka.sh" status || rc=1
    exit $rc
    ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
