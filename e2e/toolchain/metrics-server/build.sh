#!/usr/bin/env bash
# Builds metrics-server from its Go module (go.mod here) into a cache keyed by the pins; prints the binary's path.
# Only `make bench BENCH=autoscale` needs it (the CPU-utilisation HPA it compares against reads metrics.k8s.io).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false
pins=$(cat "$here/build.sh" "$here/go.mod" "$here/go.sum" | sha256sum | cut -c1-16)
cache_root=${TRITON_OPERATOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/triton-operator}
out="$cache_root/bin/metrics-server-$pins"
if [ ! -x "$out/metrics-server" ]; then
  mkdir -p "$out"
  printf '[metrics-server] building into %s\n' "$out" >&2
  (cd "$here" && go build -ldflags "-s -w" -o "$out/metrics-server.tmp.$$" sigs.k8s.io/metrics-server/cmd/metrics-server)
  mv "$out/metrics-server.tmp.$$" "$out/metrics-server"
fi
echo "$out/metrics-server"
