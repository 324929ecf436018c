#!/usr/bin/env bash
# Apache Kafka 4.x, KRaft, single node (broker + controller) on 127.0.0.1, from Maven Central jars.
# With AGENTLEDGER_KAFKA_BROKERS > 1, or once a cluster was started in this .local (until
# AGENTLEDGER_KAFKA_BROKERS=1 is asked for), a cluster instead: deploy/local/kafka-cluster.sh.
# Usage: kafka.sh start|stop|status|fetch
source "$(dirname "$0")/common.sh"

if [ "${AGENTLEDGER_KAFKA_BROKERS:-$(cat "$LOCAL/kafka/cluster/brokers" 2>/dev/null || echo 1)}" -gt 1 ] \
    && [ "${1:-}" != fetch ]; then
  exec bash "$(dirname "$0")/kafka-cluster.sh" "$@"
fi

KDIR="$LOCAL/kafka"
LIBS="$KDIR/libs"
PIDFILE="$KDIR/kafka.pid"
PROPS="$KDIR/server.properties"
# Bounded heap: the broker shares a 2-core box with Postgres, the services and the tests.
HEAP_OPTS="${AGENTLEDGER_KAFKA_HEAP_OPTS:--Xms256m -Xmx768m}"
# The address clients connect to (listened on and advertised). Loopback by default; the
# partition tests give a private broker an address that network namespaces can reach
# (tests/netns.py), since a client inside one follows the advertised address.
KAFKA_HOST="${AGENTLEDGER_KAFKA_HOST:-127.0.0.1}"

fetch() {
  [ -f "$LIBS/.complete" ] && return 0
  command -v mvn >/dev/null || die "maven is missing (run: make bootstrap)"
  log "fetching Apache Kafka jars from Maven Central (first run only): $LOGS/kafka-jars.log"
  mkdir -p "$LIBS" "$LOGS"
  # -B: no colours nor progress bars in the log.
  mvn -B -f "$ROOT/deploy/local/kafka/pom.xml" dependency:copy-dependencies \
      -DincludeScope=runtime -DoutputDirectory="$LIBS" >> "$LOGS/kafka-jars.log" 2>&1 \
    || { tail -n 20 "$LOGS/kafka-jars.log" >&2; die "Maven could not fetch Kafka: $LOGS/kafka-jars.log"; }
  ls "$LIBS"/kafka_2.13-4.*.jar >/dev/null 2>&1 || die "no kafka_2.13 4.x jar in $LIBS"
  touch "$LIBS/.complete"
}

configure() {
  mkdir -p "$KDIR/data" "$KDIR/logs"
  sed -e "s|@DATA@|$KDIR/data|" -e "s|@PORT@|$KAFKA_PORT|g" -e "s|@HOST@|$KAFKA_HOST|g" \
      -e "s|@CONTROLLER_PORT@|$KAFKA_CONTROLLER_PORT|g" \
      "$ROOT/deploy/local/kafka/server.properties.in" > "$PROPS"
  if [ ! -f "$KDIR/data/meta.properties" ]; then
    local cluster_id
    cluster_id=$(java -cp "$LIBS/*" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n 1)
    log "formatting KRaft storage (cluster $cluster_id)"
    java -cp "$LIBS/*" -Dlog4j2.configurationFile="$ROOT/deploy/local/kafka/log4j2.xml" \
      -Dkafka.logs.dir="$KDIR/logs" \
      kafka.tools.StorageTool format --standalone -t "$cluster_id" -c "$PROPS" >> "$KDIR/logs/format.log" 2>&1 \
      || { cat "$KDIR/logs/format.log" >&2; die "could not format the KRaft storage"; }
  fi
}

ready() { "$PYTHON" "$ROOT/deploy/local/probe.py" kafka "$KAFKA_HOST:$KAFKA_PORT"; }

start() {
  if pid_alive "$PIDFILE"; then
    ready >/dev/null 2>&1 && { log "already running (pid $(cat "$PIDFILE"))"; return 0; }
  fi
  command -v java >/dev/null || die "java is missing (run: make bootstrap)"
  fetch
  configure
  log "starting Kafka on $KAFKA_HOST:$KAFKA_PORT"
  # setsid: the broker must outlive the shell (and `make`) that started it.
  setsid nohup java $HEAP_OPTS -XX:+UseG1GC \
    -Dlog4j2.configurationFile="$ROOT/deploy/local/kafka/log4j2.xml" \
    -Dkafka.logs.dir="$KDIR/logs" \
    -cp "$LIBS/*" kafka.Kafka "$PROPS" >"$KDIR/logs/stdout.log" 2>&1 < /dev/null &
  echo $! > "$PIDFILE"
  # A cold JVM on 2 cores takes 5-15 s; 90 s covers a loaded CI box.
  if ! wait_until 90 "kafka" ready; then
    tail -n 30 "$KDIR/logs/stdout.log" "$KDIR/logs/server.log" >&2 2>/dev/null || true
    die "Kafka did not answer a metadata request within 90 s"
  fi
  log "ready: $(ready)"
}

stop() {
  # The broker this script started, by the pid it recorded (never by a process pattern);
  # its controlled shutdown normally takes a few seconds, after 60 s it is killed.
  stop_recorded "$PIDFILE" "$PROPS" Kafka 60
  # A cluster started earlier with AGENTLEDGER_KAFKA_BROKERS=3 stops with a plain `down` too.
  if [ -d "$KDIR/cluster" ]; then
    env -u AGENTLEDGER_KAFKA_BROKERS bash "$(dirname "$0")/kafka-cluster.sh" stop
  fi
}

status() {
  if pid_alive "$PIDFILE" && out=$(ready 2>&1); then
    echo "kafka: up (pid $(cat "$PIDFILE")) $out"
  else
    echo "kafka: down"; return 1
  fi
}

case "${1:-}" in
  start) start ;; stop) stop ;; status) status ;; fetch) fetch ;;
  *) echo "usage: $0 start|stop|status|fetch" >&2; exit 2 ;;
esac
