#!/usr/bin/env bash
# Fetch Kafka Connect (worker-pom.xml) and the Debezium PostgreSQL plugin (plugin-pom.xml)
# from Maven Central into a cache:
#   $CONNECT_HOME/worker/*.jar                     the worker's classpath
#   $CONNECT_HOME/plugins/debezium-postgres/*.jar  one plugin.path entry
# CONNECT_HOME defaults to <repo>/.local/connect. A stamp holding the poms' hash makes a
# second run free and a pom change refetch. Prints CONNECT_HOME on success.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
HERE="$ROOT/deploy/connect"
CONNECT_HOME="${CONNECT_HOME:-$ROOT/.local/connect}"
command -v mvn >/dev/null || { echo "maven is missing (run: make bootstrap)" >&2; exit 1; }

stamp="$(cat "$HERE/worker-pom.xml" "$HERE/plugin-pom.xml" | sha256sum | cut -c1-16)"
if [ "$(cat "$CONNECT_HOME/.complete" 2>/dev/null)" = "$stamp" ]; then
  echo "$CONNECT_HOME"
  exit 0
fi
rm -rf "$CONNECT_HOME/worker" "$CONNECT_HOME/plugins"
mkdir -p "$CONNECT_HOME/worker" "$CONNECT_HOME/plugins/debezium-postgres"
mvn -q -B -f "$HERE/worker-pom.xml" dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$CONNECT_HOME/worker" >&2
# Kafka's own jars come from the worker: a plugin bringing a second, newer copy would be
# shadowed by the parent loader anyway, and only confuses whoever reads the directory.
mvn -q -B -f "$HERE/plugin-pom.xml" dependency:copy-dependencies \
    -DincludeScope=runtime -DexcludeGroupIds=org.apache.kafka,org.slf4j \
    -DoutputDirectory="$CONNECT_HOME/plugins/debezium-postgres" >&2
ls "$CONNECT_HOME"/worker/connect-runtime-*.jar >/dev/null
ls "$CONNECT_HOME"/plugins/debezium-postgres/debezium-connector-postgres-*.jar >/dev/null
echo "$stamp" > "$CONNECT_HOME/.complete"
echo "$CONNECT_HOME"
