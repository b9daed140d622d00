#!/usr/bin/env bash
# Builds a local OCI registry and crane from go-containerregistry's Go module (go.mod here) into a cache keyed by the
# pins; prints the directory holding `local-registry` (cmd/local-registry: the module's registry, loopback only) and
# `crane` (pushes an OCI image layout by digest). `make release-push` and e2e/test_release.py use them.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false
pins=$(cat "$here/build.sh" "$here/go.mod" "$here/go.sum" "$here/cmd/local-registry/main.go" | sha256sum | cut -c1-16)
cache_root=${TRITON_OPERATOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/triton-operator}
out="$cache_root/bin/registry-$pins"
if [ ! -x "$out/local-registry" ] || [ ! -x "$out/crane" ]; then
  mkdir -p "$out"
  start=$(date +%s)
  module=github.com/google/go-containerregistry
  version=$(cd "$here" && go list -m -f '{{.Version}}' "$module")
  printf '[registry] building go-containerregistry %s into %s\n' "$version" "$out" >&2
  (cd "$here" && go build -ldflags "-s -w" -o "$out/local-registry.tmp.$$" ./cmd/local-registry)
  mv "$out/local-registry.tmp.$$" "$out/local-registry"
  (cd "$here" && go build -ldflags "-s -w -X $module/cmd/crane/cmd.Version=$version" -o "$out/crane.tmp.$$" \
    "$module/cmd/crane")
  mv "$out/crane.tmp.$$" "$out/crane"
  printf '[registry] built in %ss\n' "$(( $(date +%s) - start ))" >&2
fi
echo "$out"
