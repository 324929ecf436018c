#!/usr/bin/env bash
# Keycloak: the real OAuth 2.1 authorization server the MCP server's resource-server side is
# tested against (docs/mcp.md). The Quarkus distribution from Maven Central, unpacked into
# .local/keycloak; the demo and tests start their own instance on free ports, bound to 127.0.0.1, with an
# in-memory database, and seed it through its admin API (tests/keycloak.py).
#   keycloak.sh install     fetch and unpack it once (idempotent)
#   keycloak.sh installed   succeed when this version is unpacked
#   keycloak.sh version     print the version it installs
#   keycloak.sh path        print its home (bin/kc.sh inside)
# Keycloak 26 runs on Java 17 (bootstrap installs it for Kafka already).
source "$(dirname "$0")/common.sh"

VERSION="26.5.6"
URL="https://repo1.maven.org/maven2/org/keycloak/keycloak-quarkus-dist/$VERSION/keycloak-quarkus-dist-$VERSION.zip"
# Pinned: the archive is checked before anything of it is unpacked (Maven Central's .sha1).
SHA1="756c15bb71be020dd4a43a6fdb3c1340cb84d4b5"
KC_ROOT="$LOCAL/keycloak"
HOME_DIR="$KC_ROOT/keycloak-$VERSION"

install() {
  [ -f "$HOME_DIR/.complete" ] && return 0
  command -v curl >/dev/null || die "curl is missing (run: bash deploy/local/bootstrap.sh test)"
  command -v unzip >/dev/null || command -v "$PYTHON" >/dev/null || die "no unzip"
  mkdir -p "$KC_ROOT"
  local zip="$KC_ROOT/keycloak-$VERSION.zip"
  if [ ! -f "$zip" ] || [ "$(sha1sum "$zip" | cut -d' ' -f1)" != "$SHA1" ]; then
    log "fetching Keycloak $VERSION from Maven Central (165 MB, first run only)"
    # --retry: a dropped connection on a long download is retried a bounded number of times.
    curl -fsSL --retry 3 -o "$zip.part" "$URL"
    [ "$(sha1sum "$zip.part" | cut -d' ' -f1)" = "$SHA1" ] \
      || { rm -f "$zip.part"; die "Keycloak archive checksum mismatch"; }
    mv "$zip.part" "$zip"
  fi
  rm -rf "$HOME_DIR"
  "$PYTHON" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
    "$zip" "$KC_ROOT"
  chmod +x "$HOME_DIR"/bin/*.sh
  rm -f "$zip"
  touch "$HOME_DIR/.complete"
}

case "${1:-}" in
  install) install ;;
  installed) [ -f "$HOME_DIR/.complete" ] ;;
  version) echo "$VERSION" ;;
  path) echo "$HOME_DIR" ;;
  *) die "usage: keycloak.sh install|installed|version|path" ;;
esac
