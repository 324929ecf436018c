#!/usr/bin/env bash
# Install what the local stack and the tests need, once: system packages (apt) and the
# project's Python environment in .venv. Idempotent and quick when nothing is missing.
source "$(dirname "$0")/common.sh"

SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"

missing=()
command -v java >/dev/null || missing+=(default-jre-headless)
command -v mvn >/dev/null || missing+=(maven)
ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || missing+=(postgresql)
command -v psql >/dev/null || missing+=(postgresql-client)
python3 -c "import venv, ensurepip" 2>/dev/null || missing+=(python3-venv)
# The browser tests drive Debian's Chromium (never a downloaded browser build).
[ -x /usr/bin/chromium ] || missing+=(chromium fonts-dejavu-core fonts-liberation)
# jaeger.sh: its health probe (curl) and its UI archive (tar -J needs xz).
command -v curl >/dev/null || missing+=(curl)
command -v xz >/dev/null || missing+=(xz-utils)
if [ ${#missing[@]} -gt 0 ]; then
  log "installing system packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
  # Debian's postgresql package starts its own cluster on 5432; ours runs separately on $PG_PORT.
fi

VENV="$ROOT/.venv"
# Extras to install: `dev` (tests, lint) always; `make bench` adds `bench` (DBOS, psutil…).
EXTRAS="${AGENTLEDGER_EXTRAS:-dev}"
HASH="$(cat "$ROOT/pyproject.toml" "$ROOT"/libs/agentledger-*/pyproject.toml | sha256sum | cut -c1-16)"
STAMP="$VENV/.installed-$HASH-${EXTRAS//,/+}"
if [ ! -f "$STAMP" ]; then
  log "installing the Python environment in .venv (extras: $EXTRAS)"
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip >&2
  "$VENV/bin/pip" install -q -e "$ROOT[$EXTRAS]" >&2
  # Connectors outside the library, each installed as its own distribution (found by entry
  # point): e-mail over SMTP, and the declarative HTTP connector.
  "$VENV/bin/pip" install -q -e "$ROOT/libs/agentledger-email" -e "$ROOT/libs/agentledger-http" >&2
  # Stamps of an older pyproject.toml are stale; every extras set includes `dev`.
  find "$VENV" -maxdepth 1 -name '.installed-*' ! -name ".installed-$HASH-*" -delete
  touch "$STAMP" "$VENV/.installed-$HASH-dev"
fi

# Mailpit (the e-mail connector's real SMTP server) is built from its Go module; the script
# fetches a Go toolchain from the Go module proxy when this machine has no usable Go.
bash "$ROOT/deploy/local/mailpit.sh" install
# kustomize and kubeconform, which the deploy tier runs over every overlay (same Go, same way).
bash "$ROOT/deploy/local/gotools.sh" deploy
# Jaeger (`make traces`, and the browser test that opens a trace in its UI): built from its Go
# module once (a few minutes), its UI unpacked from the archive beside the script.
bash "$ROOT/deploy/local/jaeger.sh" install
