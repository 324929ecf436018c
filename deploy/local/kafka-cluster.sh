#!/usr/bin/env bash
# Apache Kafka 4.x, KRaft, as a cluster of local processes from the same Maven Central jars:
# AGENTLEDGER_KAFKA_BROKERS brokers (ids 1..N, default 3) and a quorum of three dedicated
# controllers (ids 101-103), all on 127.0.0.1. Reached through deploy/local/kafka.sh when
# AGENTLEDGER_KAFKA_BROKERS > 1 (or a cluster was started in this .local), or directly for the
# per-node verbs.
#
# Dedicated controllers, not combined broker+controller nodes: losing two of three combined
# nodes also loses the controller quorum, and a cluster without a controller can shrink no ISR,
# so min.insync.replicas would never be what stops writes. With the quorum apart, losing two
# brokers looks the way it does in production: the survivor leads, its ISR is itself, and an
# acks=all write gets NOT_ENOUGH_REPLICAS. Three controllers so one can die and another lead.
#
# Usage: kafka-cluster.sh start|stop|status|bootstrap|quorum
#        kafka-cluster.sh start-node|stop-node|kill-node|node-pid ID
# Ports: brokers on AGENTLEDGER_KAFKA_PORTS (comma list), else KAFKA_PORT+0,+2,+4...;
# controllers on AGENTLEDGER_KAFKA_CONTROLLER_PORTS, else KAFKA_CONTROLLER_PORT+0,+2,+4...
source "$(dirname "$0")/common.sh"

KDIR="$LOCAL/kafka"
LIBS="$KDIR/libs"
CDIR="$KDIR/cluster"
BROKERS="${AGENTLEDGER_KAFKA_BROKERS:-$(cat "$CDIR/brokers" 2>/dev/null || echo 3)}"
[ "$BROKERS" -ge 2 ] && [ "$BROKERS" -le 9 ] || die "AGENTLEDGER_KAFKA_BROKERS must be 2..9 for a cluster"
CONTROLLERS=3
# Bounded heaps: up to six JVMs share a 2-core box with Postgres, the services and the tests.
BROKER_HEAP="${AGENTLEDGER_KAFKA_HEAP_OPTS:--Xms128m -Xmx512m}"
# A controller holds only the cluster metadata log (a few MB here).
CONTROLLER_HEAP="${AGENTLEDGER_KAFKA_CONTROLLER_HEAP_OPTS:--Xms64m -Xmx256m}"
LOG4J="$ROOT/deploy/local/kafka/log4j2.xml"
TOOLS_LOG4J="$ROOT/deploy/local/kafka/tools-log4j2.xml"

ports() {  # ports LIST BASE COUNT: the explicit comma list, else BASE, BASE+2, ...
  local list=$1 base=$2 n=$3 i
  if [ -n "$list" ]; then tr ',' ' ' <<<"$list"; return; fi
  for ((i = 0; i < n; i++)); do printf '%s ' $((base + 2 * i)); done
}
read -r -a BROKER_PORTS <<<"$(ports "${AGENTLEDGER_KAFKA_PORTS:-}" "$KAFKA_PORT" "$BROKERS")"
read -r -a CONTROLLER_PORTS <<<"$(ports "${AGENTLEDGER_KAFKA_CONTROLLER_PORTS:-}" "$KAFKA_CONTROLLER_PORT" "$CONTROLLERS")"
[ "${#BROKER_PORTS[@]}" -ge "$BROKERS" ] || die "fewer broker ports than brokers"
[ "${#CONTROLLER_PORTS[@]}" -ge "$CONTROLLERS" ] || die "fewer controller ports than controllers"

broker_ids() { seq 1 "$BROKERS"; }
controller_ids() { seq 101 $((100 + CONTROLLERS)); }
is_controller() { [ "$1" -gt 100 ]; }
port_of() { if is_controller "$1"; then echo "${CONTROLLER_PORTS[$(($1 - 101))]}"; else echo "${BROKER_PORTS[$(($1 - 1))]}"; fi; }
known() { [[ "$1" =~ ^[0-9]+$ ]] && { { [ "$1" -ge 1 ] && [ "$1" -le "$BROKERS" ]; } || { [ "$1" -ge 101 ] && [ "$1" -le $((100 + CONTROLLERS)) ]; }; }; }

bootstrap() { local id out=(); for id in $(broker_ids); do out+=("127.0.0.1:$(port_of "$id")"); done; (IFS=,; echo "${out[*]}"); }
controllers_bootstrap() { local id out=(); for id in $(controller_ids); do out+=("127.0.0.1:$(port_of "$id")"); done; (IFS=,; echo "${out[*]}"); }
voters() { local id out=(); for id in $(controller_ids); do out+=("$id@127.0.0.1:$(port_of "$id")"); done; (IFS=,; echo "${out[*]}"); }

node_dir() { echo "$CDIR/node-$1"; }
pidfile() { echo "$(node_dir "$1")/kafka.pid"; }

fetch() {
  [ -f "$LIBS/.complete" ] || bash "$ROOT/deploy/local/kafka.sh" fetch
}

configure() {  # configure ID: write the node's properties; format its storage once
  local id=$1 dir; dir=$(node_dir "$id")
  mkdir -p "$dir/data" "$dir/logs"
  local roles listeners advertised=""
  if is_controller "$id"; then
    roles=controller; listeners="CONTROLLER://127.0.0.1:$(port_of "$id")"
  else
    roles=broker; listeners="PLAINTEXT://127.0.0.1:$(port_of "$id")"
    advertised="advertised.listeners=$listeners"
  fi
  sed -e "s|@NODE_ID@|$id|" -e "s|@ROLES@|$roles|" -e "s|@LISTENERS@|$listeners|" \
      -e "s|@ADVERTISED@|$advertised|" -e "s|@VOTERS@|$(voters)|" -e "s|@DATA@|$dir/data|" \
      -e "s|@REPLICAS@|$((BROKERS < 3 ? BROKERS : 3))|g" -e "s|@MIN_ISR@|$((BROKERS < 3 ? 1 : 2))|g" \
      "$ROOT/deploy/local/kafka/cluster.properties.in" > "$dir/server.properties"
  if [ ! -f "$dir/data/meta.properties" ]; then
    java -cp "$LIBS/*" -Dlog4j2.configurationFile="$LOG4J" -Dkafka.logs.dir="$dir/logs" \
      kafka.tools.StorageTool format -t "$(cluster_id)" -c "$dir/server.properties" >/dev/null
  fi
}

cluster_id() {  # one id for every node, made once
  if [ ! -s "$CDIR/cluster.id" ]; then
    mkdir -p "$CDIR"
    java -cp "$LIBS/*" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n 1 > "$CDIR/cluster.id"
  fi
  cat "$CDIR/cluster.id"
}

launch() {  # launch ID: start the node's JVM (no wait)
  local id=$1 dir heap; dir=$(node_dir "$id")
  pid_alive "$(pidfile "$id")" && return 0
  if is_controller "$id"; then heap=$CONTROLLER_HEAP; else heap=$BROKER_HEAP; fi
  # setsid: the node must outlive the shell (and `make`) that started it.
  setsid nohup java $heap -XX:+UseG1GC -Dlog4j2.configurationFile="$LOG4J" \
    -Dkafka.logs.dir="$dir/logs" -cp "$LIBS/*" kafka.Kafka "$dir/server.properties" \
    >"$dir/logs/stdout.log" 2>&1 < /dev/null &
  echo $! > "$(pidfile "$id")"
}

tools() {  # the quorum describer, compiled once beside the jars (shared by every .local)
  local src="$ROOT/deploy/local/kafka/Quorum.java" out
  out="$(cd "$LIBS" && pwd -P)/../tools"
  if [ ! -f "$out/Quorum.class" ] || [ "$src" -nt "$out/Quorum.class" ]; then
    mkdir -p "$out"
    javac -nowarn -cp "$LIBS/*" -d "$out" "$src" >&2
  fi
  echo "$out"
}

quorum() {
  java -Xmx64m -XX:TieredStopAtLevel=1 -cp "$LIBS/*:$(tools)" \
    -Dlog4j2.configurationFile="$TOOLS_LOG4J" Quorum "$(controllers_bootstrap)"
}

# Ready when the broker is registered and unfenced: its own metadata lists it.
broker_ready() { "$PYTHON" "$ROOT/deploy/local/probe.py" kafka-broker "127.0.0.1:$(port_of "$1")" "$1"; }
# Ready when the quorum has a leader and this controller is a caught-up voter (or the leader).
controller_ready() {
  local since=$2
  quorum 2>/dev/null | "$PYTHON" -c '
import json, sys
q, me, since = json.load(sys.stdin), int(sys.argv[1]), int(sys.argv[2])
ok = q["leader"] == me or any(v["id"] == me and v["last_caught_up_ms"] >= since for v in q["voters"])
sys.exit(0 if q["leader"] >= 0 and ok else 1)' "$1" "$since"
}
cluster_ready() { "$PYTHON" "$ROOT/deploy/local/probe.py" kafka "$(bootstrap)" "$BROKERS"; }

tail_logs() { local id; for id in "$@"; do tail -n 20 "$(node_dir "$id")/logs/server.log" >&2 2>/dev/null || true; done; }

start() {
  command -v java >/dev/null || die "java is missing (run: make bootstrap)"
  fetch
  local id pids=()
  mkdir -p "$CDIR"
  # The shape sticks to this .local: a later `make up` without KAFKA_BROKERS brings it back.
  echo "$BROKERS" > "$CDIR/brokers"
  cluster_id >/dev/null  # made once, before the nodes format in parallel
  for id in $(controller_ids) $(broker_ids); do configure "$id" & pids+=($!); done
  for id in "${pids[@]}"; do wait "$id" || die "formatting a node failed"; done
  log "starting $CONTROLLERS controllers ($(voters)) and $BROKERS brokers ($(bootstrap))"
  for id in $(controller_ids) $(broker_ids); do launch "$id"; done
  # Six cold JVMs on 2 cores take 20-40 s; 120 s covers a loaded CI box.
  if ! wait_until 120 "kafka cluster" cluster_ready; then
    tail_logs $(controller_ids) $(broker_ids)
    die "the cluster did not register $BROKERS brokers within 120 s"
  fi
  log "ready: $(cluster_ready)"
}

start_node() {
  local id=$1 since
  known "$id" || die "no node $id in this cluster"
  fetch; configure "$id"
  since=$(( $(date +%s) * 1000 ))
  launch "$id"
  # A broker restarted after SIGKILL recovers its logs and catches up the metadata first.
  if is_controller "$id"; then
    wait_until 90 "controller $id" controller_ready "$id" "$since" || { tail_logs "$id"; die "controller $id did not rejoin the quorum within 90 s"; }
  else
    wait_until 90 "broker $id" broker_ready "$id" || { tail_logs "$id"; die "broker $id was not unfenced within 90 s"; }
  fi
  log "node $id ready"
}

stop_node() {  # stop_node ID SIGNAL
  # A controlled shutdown takes a few seconds; after 60 s the node is killed.
  local id=$1
  stop_recorded "$(pidfile "$id")" "$(node_dir "$id")/server.properties" "node $id" 60 "$2"
}

stop() {  # every node this cluster directory holds, whatever the counts are now
  local dir id pids=()
  # Brokers first (their controlled shutdown needs a controller), in parallel.
  for dir in "$CDIR"/node-*; do
    id=${dir##*-}; [ -d "$dir" ] && ! is_controller "$id" || continue
    stop_node "$id" TERM & pids+=($!)
  done
  [ "${#pids[@]}" -eq 0 ] || wait "${pids[@]}" 2>/dev/null || true
  for dir in "$CDIR"/node-*; do
    id=${dir##*-}; [ -d "$dir" ] && is_controller "$id" || continue
    stop_node "$id" TERM
  done
}

status() {
  local id rc=0 state
  for id in $(controller_ids) $(broker_ids); do
    if pid_alive "$(pidfile "$id")"; then state="up (pid $(cat "$(pidfile "$id")"))"; else state=down; rc=1; fi
    echo "kafka node $id (127.0.0.1:$(port_of "$id")): $state"
  done
  if out=$(cluster_ready 2>&1); then echo "kafka: $out"; else echo "kafka: not ready"; rc=1; fi
  return $rc
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  bootstrap) bootstrap ;;
  quorum) quorum ;;
  start-node) start_node "${2:?node id}" ;;
  stop-node) known "${2:?node id}" || die "no node $2"; stop_node "$2" TERM ;;
  kill-node) known "${2:?node id}" || die "no node $2"; stop_node "$2" KILL ;;
  node-pid) cat "$(pidfile "${2:?node id}")" ;;
  *) echo "usage: $0 start|stop|status|bootstrap|quorum|start-node ID|stop-node ID|kill-node ID|node-pid ID" >&2; exit 2 ;;
esac
