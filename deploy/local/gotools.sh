#!/usr/bin/env bash
# Go programs the tests and the demo run, built from their Go modules (through the Go module
# proxy) into .local/bin, and the one place that finds a Go to build them with.
#   gotools.sh install NAME PACKAGE VERSION   build PACKAGE@VERSION as .local/bin/NAME once
#                                             (idempotent: a NAME.version stamp records it)
#   gotools.sh deploy                         kustomize and kubeconform (the manifest tests)
#   gotools.sh installed                      succeed when both are built at their versions
#   gotools.sh go                             print the Go it builds with (fetching one if needed)
# A Go that can switch toolchains (>= 1.21) is used as it is; without one, the toolchain
# $GO_TOOLCHAIN is fetched from the Go module proxy into .local/go-toolchain, the same archive
# `GOTOOLCHAIN` would download.
source "$(dirname "$0")/common.sh"

# The oldest Go every program below builds with (mailpit and kustomize v5.8.2 say `go 1.26`).
GO_TOOLCHAIN="go1.26.0"
# kustomize v5.8.3 asks for Go 1.27 (its kustomize/api v0.21.3); v5.8.2 is the newest on 1.26.
KUSTOMIZE_VERSION="v5.8.2"
KUBECONFORM_VERSION="v0.8.0"

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

built() {  # NAME VERSION
  [ -x "$LOCAL/bin/$1" ] && [ "$(cat "$LOCAL/bin/$1.version" 2>/dev/null)" = "$2" ]
}

install_tool() {  # NAME PACKAGE VERSION
  local name="$1" package="$2" version="$3"
  local bin="$LOCAL/bin/$name"
  if built "$name" "$version"; then return 0; fi
  local go build
  go="$(find_go)"
  log "building $name $version into $LOCAL/bin ($("$go" env GOVERSION))"
  # `go install` names the binary after the package's last element; build in a scratch GOBIN
  # and move it, so NAME may differ from that element.
  build="$(mktemp -d)"
  GOBIN="$build" GOFLAGS=-mod=mod "$go" install "$package@$version" >&2
  mkdir -p "$LOCAL/bin"
  local built="${package##*/}"
  case "$built" in v[0-9]*) built="$(basename "$(dirname "$package")")" ;; esac  # .../v5
  mv "$build/$built" "$bin"
  rm -rf "$build"
  echo "$version" > "$bin.version"
}

case "${1:-}" in
  install)
    [ $# -eq 4 ] || die "usage: gotools.sh install NAME PACKAGE VERSION"
    install_tool "$2" "$3" "$4"
    ;;
  deploy)
    install_tool kustomize sigs.k8s.io/kustomize/kustomize/v5 "$KUSTOMIZE_VERSION"
    install_tool kubeconform github.com/yannh/kubeconform/cmd/kubeconform "$KUBECONFORM_VERSION"
    ;;
  installed)
    built kustomize "$KUSTOMIZE_VERSION" && built kubeconform "$KUBECONFORM_VERSION"
    ;;
  go)
    find_go
    ;;
  *)
    die "usage: gotools.sh install NAME PACKAGE VERSION | deploy | installed | go"
    ;;
esac
