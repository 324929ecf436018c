#!/usr/bin/env bash
# Jaeger: a real trace store and UI for the spans the services export over OTLP (`make traces`).
# Built from its Go module (github.com/jaegertracing/jaeger, program cmd/jaeger) into
# .local/bin, run with in-memory storage and OTLP ingest (deploy/local/jaeger.yaml).
#   jaeger.sh install   build it once and unpack its UI (idempotent)
#   jaeger.sh installed succeed when this version is built and its UI unpacked
#   jaeger.sh version   print the version it builds
#   jaeger.sh ui        unpack the UI only; print its directory
#   jaeger.sh path      print the binary's path
#   jaeger.sh start     start it (pid recorded in .local/jaeger/jaeger.pid), wait until healthy
#   jaeger.sh stop      stop what start started (by its recorded pid)
#   jaeger.sh status    say whether it answers
#   jaeger.sh env       print the OTEL_* settings that send a process's spans to it
# Ports are settings: AGENTLEDGER_JAEGER_UI_PORT (16686), AGENTLEDGER_JAEGER_OTLP_PORT (14317,
# gRPC; HTTP is +1), AGENTLEDGER_JAEGER_HEALTH_PORT (13133), AGENTLEDGER_JAEGER_QUERY_PORT
# (16685).
source "$(dirname "$0")/common.sh"

VERSION="v1.75.0"
BIN="$LOCAL/bin/jaeger"
CONFIG="$ROOT/deploy/local/jaeger.yaml"
# The UI: jaeger-ui v1.74.0 built once (`npm install && npm run build` in its packages/jaeger-ui,
# the legacy-browser bundle left out; its LICENSE inside) and committed as an archive, because
# no registry this project can reach serves it built and its source lives only on GitHub.
UI_VERSION="v1.74.0"
UI_ARCHIVE="$ROOT/deploy/local/jaeger-ui-$UI_VERSION.tar.xz"
UI_ASSETS="${AGENTLEDGER_JAEGER_UI_ASSETS:-$LOCAL/jaeger-ui}"
JDIR="$LOCAL/jaeger"
PIDFILE="$JDIR/jaeger.pid"
UI_PORT="${AGENTLEDGER_JAEGER_UI_PORT:-16686}"
OTLP_PORT="${AGENTLEDGER_JAEGER_OTLP_PORT:-14317}"
HEALTH_PORT="${AGENTLEDGER_JAEGER_HEALTH_PORT:-13133}"
QUERY_PORT="${AGENTLEDGER_JAEGER_QUERY_PORT:-16685}"

install_ui() {
  if [ -f "$UI_ASSETS/index.html" ] && [ "$(cat "$UI_ASSETS/.version" 2>/dev/null)" = "$UI_VERSION" ]; then
    return 0
  fi
  rm -rf "$UI_ASSETS" && mkdir -p "$UI_ASSETS"
  tar -C "$UI_ASSETS" -xJf "$UI_ARCHIVE"
  echo "$UI_VERSION" > "$UI_ASSETS/.version"
}

installed() {
  [ -x "$BIN" ] && [ "$(cat "$BIN.version" 2>/dev/null)" = "$VERSION" ] \
    && [ -f "$UI_ASSETS/index.html" ] && [ "$(cat "$UI_ASSETS/.version" 2>/dev/null)" = "$UI_VERSION" ]
}

install() {
  install_ui
  if [ -x "$BIN" ] && [ "$(cat "$BIN.version" 2>/dev/null)" = "$VERSION" ]; then return 0; fi
  local go build
  go="$(bash "$ROOT/deploy/local/gotools.sh" go)"
  log "building jaeger $VERSION into $LOCAL/bin ($("$go" env GOVERSION); a few minutes once)"
  # Jaeger's go.mod has replace directives, which `go install pkg@version` refuses: build it
  # as a tool of a scratch module instead (`go get -tool`), as the module's docs advise.
  build="$(mktemp -d)"
  # `go get -tool` needs a module at go >= 1.24: state the version Jaeger's go.mod asks for,
  # so an older Go that can switch (>= 1.21) fetches that toolchain instead of refusing.
  (cd "$build" && "$go" mod init agentledger.local/jaeger >/dev/null 2>&1 \
    && "$go" mod edit -go=1.24.0 \
    && "$go" get -tool "github.com/jaegertracing/jaeger/cmd/jaeger@$VERSION" >&2 \
    && "$go" build -o "$build/jaeger" github.com/jaegertracing/jaeger/cmd/jaeger >&2)
  mkdir -p "$LOCAL/bin"
  mv "$build/jaeger" "$BIN"
  rm -rf "$build"
  echo "$VERSION" > "$BIN.version"
}

healthy() { curl -fsS "http://127.0.0.1:$HEALTH_PORT/status" 2>/dev/null | grep -q '"healthy":true'; }

start() {
  # `make traces` builds it the first time: one line here, the go output in the log.
  installed || step jaeger "Jaeger $VERSION, built from its Go module" install
  if recorded_pid "$PIDFILE" "$CONFIG" >/dev/null && healthy; then
    log "already running (pid $(cat "$PIDFILE")): http://127.0.0.1:$UI_PORT"; return 0
  fi
  mkdir -p "$JDIR"
  JAEGER_UI_PORT="$UI_PORT" JAEGER_OTLP_GRPC_PORT="$OTLP_PORT" \
    JAEGER_OTLP_HTTP_PORT="$((OTLP_PORT + 1))" JAEGER_HEALTH_PORT="$HEALTH_PORT" \
    JAEGER_QUERY_GRPC_PORT="$QUERY_PORT" JAEGER_UI_ASSETS="$UI_ASSETS" \
    setsid "$BIN" --config="file:$CONFIG" > "$JDIR/jaeger.log" 2>&1 < /dev/null &
  echo $! > "$PIDFILE"
  wait_until 60 "jaeger healthy" healthy || die "jaeger did not become healthy: $JDIR/jaeger.log"
  log "ready: UI http://127.0.0.1:$UI_PORT, OTLP gRPC 127.0.0.1:$OTLP_PORT"
}

case "${1:-}" in
  install) install ;;
  installed) installed ;;
  version) echo "$VERSION" ;;
  ui) install_ui; echo "$UI_ASSETS" ;;
  path) echo "$BIN" ;;
  start) start ;;
  stop) stop_recorded "$PIDFILE" "$CONFIG" jaeger 10 ;;
  status)
    if healthy; then echo "jaeger: up http://127.0.0.1:$UI_PORT"; else echo "jaeger: down"; fi ;;
  env)
    echo "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:$OTLP_PORT"
    echo "OTEL_EXPORTER_OTLP_PROTOCOL=grpc"
    echo "OTEL_METRICS_EXPORTER=none"  # Jaeger stores spans; metrics go to a collector
    echo "AGENTLEDGER_TRACES_URL=http://127.0.0.1:$UI_PORT" ;;
  *) die "usage: jaeger.sh install|installed|version|ui|path|start|stop|status|env" ;;
esac
