#!/usr/bin/env bash
# Mailpit: the real SMTP server (with an HTTP search API) the e-mail connector is tested
# against (libs/agentledger-email). Built from its Go module; tests start their own instance
# on free ports (tests/mailpit.py), the demo its own.
#   mailpit.sh install   build it into .local/bin once (idempotent)
#   mailpit.sh path      print the binary's path
#   mailpit.sh go        print the Go it builds with (fetching one if needed)
# Mailpit needs Go >= 1.26. A Go that can switch toolchains (>= 1.21) fetches that one itself;
# without such a Go, the toolchain is fetched from the Go module proxy (proxy.golang.org)
# into .local/go-toolchain — the same archive `GOTOOLCHAIN` would download.
source "$(dirname "$0")/common.sh"

VERSION="v1.33.1"
GO_TOOLCHAIN="go1.26.0"
BIN="$LOCAL/bin/mailpit"

go_can_switch() {  # a Go that fetches the toolchain a module asks for (1.21+)
  local v
  v="$("$1" env GOVERSION 2>/dev/null)" || return 1
  v="${v#go}"
  local major="${v%%.*}" rest="${v#*.}"
  local minor="${rest%%.*}"
  [ "$major" -gt 1 ] || [ "${minor%%[!0-9]*}" -ge 21 ]
}

find_go() {
  if command -v go >/dev/null && go_can_switch "$(command -v go)"; then
    command -v go; return
  fi
  local root="$LOCAL/go-toolchain/$GO_TOOLCHAIN"
  if [ ! -x "$root/bin/go" ]; then
    local arch
    case "$(uname -m)" in
      x86_64) arch=amd64 ;; aarch64|arm64) arch=arm64 ;; *) die "no Go toolchain for $(uname -m)" ;;
    esac
    log "fetching the Go toolchain $GO_TOOLCHAIN from proxy.golang.org (no usable Go here)"
    "$PYTHON" - "$GO_TOOLCHAIN" "$arch" "$root" <<'PY'
import io, os, sys, urllib.request, zipfile
version, arch, root = sys.argv[1:]
url = f"https://proxy.golang.org/golang.org/toolchain/@v/v0.0.1-{version}.linux-{arch}.zip"
data = urllib.request.urlopen(url, timeout=300).read()
prefix = f"golang.org/toolchain@v0.0.1-{version}.linux-{arch}/"
with zipfile.ZipFile(io.BytesIO(data)) as z:
    for info in z.infolist():
        if not info.filename.startswith(prefix) or info.is_dir():
            continue
        target = os.path.join(root, info.filename[len(prefix):])
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with z.open(info) as src, open(target, "wb") as dst:
            dst.write(src.read())
        mode = (info.external_attr >> 16) & 0o777
        os.chmod(target, mode or 0o644)
PY
  fi
  echo "$root/bin/go"
}

case "${1:-}" in
  install)
    if [ -x "$BIN" ] && [ "$(cat "$BIN.version" 2>/dev/null)" = "$VERSION" ]; then exit 0; fi
    GO="$(find_go)"
    log "building Mailpit $VERSION into $LOCAL/bin ($("$GO" env GOVERSION))"
    mkdir -p "$LOCAL/bin"
    GOBIN="$LOCAL/bin" GOFLAGS=-mod=mod "$GO" install "github.com/axllent/mailpit@$VERSION" >&2
    echo "$VERSION" > "$BIN.version"
    ;;
  path)
    echo "$BIN"
    ;;
  go)
    find_go
    ;;
  *)
    die "usage: mailpit.sh install|path|go"
    ;;
esac
