#!/usr/bin/env bash
# Install what a command needs, once, and nothing it does not use. Quiet: each step's output
# goes to .local/logs/<step>.log and the terminal gets one line per step that had work to do
# (none when everything is there; the log's end and its path when a step fails).
#   bootstrap.sh [demo]  what `make demo` and `make up` use: Java, Maven, PostgreSQL and
#                        python3-venv (apt), the Python environment .venv (the package and its
#                        connectors, no test tools), Kafka's jars (Maven Central), Mailpit
#                        (built from its Go module), Keycloak (Maven Central; the MCP
#                        story's and the MCP OAuth tests' authorization server)
#   bootstrap.sh dev     and the dev extras in .venv (pytest, ruff, mypy…): `make test-unit`,
#                        `make lint`, `make chaos`
#   bootstrap.sh test    and what the whole suite runs (`make test`): Debian's Chromium (browser
#                        tier), curl and xz (Jaeger's probe and UI archive), kustomize and
#                        kubeconform (deploy tier), Jaeger (the trace tests, `make traces`)
# AGENTLEDGER_EXTRAS adds extras (`make bench`: dev,bench).
source "$(dirname "$0")/common.sh"
HERE="$(dirname "$0")"

MODE="${1:-demo}"
case "$MODE" in demo|dev|test) ;; *) die "usage: bootstrap.sh [demo|dev|test]" ;; esac

SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"

# --- system packages (apt), before anything that needs them ---------------------------------
missing=()
command -v java >/dev/null || missing+=(default-jre-headless)
command -v mvn >/dev/null || missing+=(maven)
ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || missing+=(postgresql)
command -v psql >/dev/null || missing+=(postgresql-client)
python3 -c "import venv, ensurepip" 2>/dev/null || missing+=(python3-venv)
# keycloak.sh fetches its archive with curl.
command -v curl >/dev/null || missing+=(curl)
if [ "$MODE" = test ]; then
  # The browser tests drive Debian's Chromium (never a downloaded browser build).
  [ -x /usr/bin/chromium ] || missing+=(chromium fonts-dejavu-core fonts-liberation)
  # jaeger.sh: its health probe (curl, above) and its UI archive (tar -J needs xz).
  command -v xz >/dev/null || missing+=(xz-utils)
  # The official TypeScript MCP SDK's client (tests/e2e/ts_client): Node >= 20 and npm.
  command -v node >/dev/null || missing+=(nodejs)
  command -v npm >/dev/null || missing+=(npm)
fi

apt_install() {
  # DPkg::Lock::Timeout: apt's own wait, should another manager start between the check
  # (wait_for_apt) and this install.
  $SUDO apt-get -o "DPkg::Lock::Timeout=$APT_LOCK_WAIT_S" update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o "DPkg::Lock::Timeout=$APT_LOCK_WAIT_S" \
    install -y -qq --no-install-recommends "$@"
  # Debian's postgresql package starts its own cluster on 5432; ours runs separately on $PG_PORT.
}

if [ ${#missing[@]} -gt 0 ]; then
  # sudo asks for a password on the terminal, before the step sends output to its log.
  [ -z "$SUDO" ] || sudo -v
  wait_for_apt
  step apt "system packages: ${missing[*]} (apt)" apt_install "${missing[@]}"
fi

# --- the rest, side by side: downloads (pip, Maven) beside a compile (go) ---------------------
started=()
if [ ! -f "$LOCAL/kafka/libs/.complete" ]; then
  step_start kafka-jars "Apache Kafka's jars from Maven Central" bash "$HERE/kafka.sh" fetch
  started+=(kafka-jars)
fi
if ! bash "$HERE/mailpit.sh" installed; then
  step_start mailpit "Mailpit $(bash "$HERE/mailpit.sh" version), built from its Go module" \
    bash "$HERE/mailpit.sh" install
  started+=(mailpit)
fi
if ! bash "$HERE/keycloak.sh" installed; then
  step_start keycloak "Keycloak $(bash "$HERE/keycloak.sh" version) (the MCP story's OAuth server), from Maven Central" \
    bash "$HERE/keycloak.sh" install
  started+=(keycloak)
fi
if [ "$MODE" = test ]; then
  if ! bash "$HERE/gotools.sh" installed; then
    step_start gotools "kustomize and kubeconform, built from their Go modules" \
      bash "$HERE/gotools.sh" deploy
    started+=(gotools)
  fi
  if ! bash "$HERE/jaeger.sh" installed; then
    step_start jaeger "Jaeger $(bash "$HERE/jaeger.sh" version), built from its Go module" \
      bash "$HERE/jaeger.sh" install
    started+=(jaeger)
  fi
  # The TypeScript MCP client's SDK, at package-lock.json's versions (npm ci), in its own
  # directory: a stamp per lock file, so a changed lock reinstalls.
  TS_CLIENT="$ROOT/tests/e2e/ts_client"
  TS_STAMP="$TS_CLIENT/node_modules/.installed-$(sha256sum "$TS_CLIENT/package-lock.json" | cut -c1-16)"
  if [ ! -f "$TS_STAMP" ]; then
    install_ts_client() {
      (cd "$TS_CLIENT" && npm ci --no-audit --no-fund --loglevel=error) && touch "$TS_STAMP"
    }
    step_start ts-client "the TypeScript MCP SDK's client (npm ci in tests/e2e/ts_client)" install_ts_client
    started+=(ts-client)
  fi
fi

VENV="$ROOT/.venv"
EXTRAS="${AGENTLEDGER_EXTRAS:-}"
case "$MODE" in dev|test) EXTRAS="dev${EXTRAS:+,$EXTRAS}" ;; esac
HASH="$(cat "$ROOT/pyproject.toml" "$ROOT"/libs/agentledger-*/pyproject.toml | sha256sum | cut -c1-16)"
# One stamp for the package at this pyproject.toml, one per extra installed with it.
needed=("$VENV/.installed-$HASH")
for extra in ${EXTRAS//,/ }; do needed+=("$VENV/.installed-$HASH-$extra"); done

install_venv() {
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q -e "$ROOT${EXTRAS:+[$EXTRAS]}"
  # Connectors outside the library, each installed as its own distribution (found by entry
  # point): e-mail over SMTP, and the declarative HTTP connector.
  "$VENV/bin/pip" install -q -e "$ROOT/libs/agentledger-email" -e "$ROOT/libs/agentledger-http"
  # Stamps of an older pyproject.toml are stale.
  find "$VENV" -maxdepth 1 -name '.installed-*' ! -name ".installed-$HASH*" -delete
  touch "${needed[@]}"
}

for stamp in "${needed[@]}"; do
  if [ ! -f "$stamp" ]; then
    step_start venv "the Python environment .venv${EXTRAS:+ (with $EXTRAS)}" install_venv
    started+=(venv)
    break
  fi
done

[ ${#started[@]} -eq 0 ] || step_wait "${started[@]}"
