#!/usr/bin/env bash
# Mailpit: the real SMTP server (with an HTTP search API) the e-mail connector is tested
# against (libs/agentledger-email). Built from its Go module; tests start their own instance
# on free ports (tests/mailpit.py).
#   mailpit.sh install   build it into .local/bin once (needs Go; idempotent)
#   mailpit.sh path      print the binary's path
source "$(dirname "$0")/common.sh"

VERSION="v1.33.1"
BIN="$LOCAL/bin/mailpit"

case "${1:-}" in
  install)
    if [ -x "$BIN" ] && [ "$(cat "$BIN.version" 2>/dev/null)" = "$VERSION" ]; then exit 0; fi
    command -v go >/dev/null || die "Go is needed to build Mailpit (apt-get install golang-go)"
    log "building Mailpit $VERSION into $LOCAL/bin (go install)"
    mkdir -p "$LOCAL/bin"
    GOBIN="$LOCAL/bin" GOFLAGS=-mod=mod go install "github.com/axllent/mailpit@$VERSION" >&2
    echo "$VERSION" > "$BIN.version"
    ;;
  path)
    echo "$BIN"
    ;;
  *)
    die "usage: mailpit.sh install|path"
    ;;
esac
