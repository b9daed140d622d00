#!/usr/bin/env bash
# Builds Prometheus and promtool from its Go module (go.mod here) into a cache keyed by the pins; prints prometheus's
# path (promtool beside it: the same module's packages, so it costs a link more than the server's build).
# `make bench BENCH=autoscale` (the peer it compares against scrapes Triton's metrics with Prometheus) and
# e2e/test_monitoring.py (`promtool check rules` and `promtool test rules` on the chart's alerts; the server loads and
# evaluates them) need it; `make prebuild` builds it.
#
# Build tags: `remove_all_sd enable_kubernetes_sd` keep the discovery plugins to Kubernetes (and the always-built
# file and http ones), Prometheus's own switch for trimming its build (plugins.yml); the bench discovers pods with
# kubernetes_sd. `builtinassets` is left out: the web UI's assets are built with npm and are not in the module, so
# the UI's pages are absent; the HTTP API (what KEDA queries) is the same.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false
pins=$(cat "$here/build.sh" "$here/go.mod" "$here/go.sum" | sha256sum | cut -c1-16)
cache_root=${TRITON_OPERATOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/triton-operator}
out="$cache_root/bin/prometheus-$pins"
if [ ! -x "$out/prometheus" ] || [ ! -x "$out/promtool" ]; then
  mkdir -p "$out"
  start=$(date +%s)
  module=github.com/prometheus/prometheus
  version=$(cd "$here" && go list -m -f '{{.Version}}' "$module")
  dir=$(cd "$here" && go mod download -json "$module@$version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  release=$(cat "$dir/VERSION")  # the module's v0.316.0 is Prometheus 3.16.0
  printf '[prometheus] building %s (%s) into %s\n' "$release" "$version" "$out" >&2
  flags="-s -w -X github.com/prometheus/common/version.Version=$release -X github.com/prometheus/common/version.Revision=module-$version"
  flags+=" -X github.com/prometheus/common/version.Branch=module"
  for cmd in prometheus promtool; do
    (cd "$here" && go build -tags "netgo remove_all_sd enable_kubernetes_sd" -ldflags "$flags" \
      -o "$out/$cmd.tmp.$$" "$module/cmd/$cmd")
    mv "$out/$cmd.tmp.$$" "$out/$cmd"
  done
  printf '[prometheus] built in %ss\n' "$(( $(date +%s) - start ))" >&2
fi
echo "$out/prometheus"
