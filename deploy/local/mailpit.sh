#!/usr/bin/env bash
# Mailpit: the real SMTP server (with an HTTP search API) the e-mail connector is tested
# against (libs/agentledger-email). Built from its Go module; tests start their own instance
# on free ports (tests/mailpit.py), the demo its own.
#   mailpit.sh install   build it into .local/bin once (idempotent)
#   mailpit.sh installed succeed when this version is built
#   mailpit.sh version   print the version it builds
#   mailpit.sh path      print the binary's path
#   mailpit.sh go        print the Go it builds with (fetching one if needed)
# Mailpit needs Go >= 1.26; deploy/local/gotools.sh finds (or fetches) one and builds it.
source "$(dirname "$0")/common.sh"

VERSION="v1.33.1"
BIN="$LOCAL/bin/mailpit"
GOTOOLS="$(dirname "$0")/gotools.sh"

case "${1:-}" in
  install)
    bash "$GOTOOLS" install mailpit github.com/axllent/mailpit "$VERSION"
    ;;
  installed)
    [ -x "$BIN" ] && [ "$(cat "$BIN.version" 2>/dev/null)" = "$VERSION" ]
    ;;
  version)
    echo "$VERSION"
    ;;
  path)
    echo "$BIN"
    ;;
  go)
    bash "$GOTOOLS" go
    ;;
  *)
    die "usage: mailpit.sh install|installed|version|path|go"
    ;;
esac
