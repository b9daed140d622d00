#!/usr/bin/env bash
# Builds KEDA's operator and its metrics adapter (the external metrics API server) from KEDA's Go module (go.mod
# here) into a cache keyed by the pins, with KEDA's CRDs from the same module version beside them; prints the
# directory (keda-operator, keda-adapter, crds/). Only `make bench BENCH=autoscale` needs it: KEDA's Prometheus
# scaler is one of the peers it compares against. The admission webhooks are not built (the bench does not use them).
#
# go.mod copies the one `replace` of KEDA's own go.mod (a module's replaces do not apply to its dependants), and
# resolves to the same versions as KEDA's go.mod.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false
pins=$(cat "$here/build.sh" "$here/go.mod" "$here/go.sum" | sha256sum | cut -c1-16)
cache_root=${TRITON_OPERATOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/triton-operator}
out="$cache_root/bin/keda-$pins"
if [ ! -x "$out/keda-operator" ] || [ ! -x "$out/keda-adapter" ] || [ ! -d "$out/crds" ]; then
  mkdir -p "$out"
  start=$(date +%s)
  module=github.com/kedacore/keda/v2
  version=$(cd "$here" && go list -m -f '{{.Version}}' "$module")
  printf '[keda] building %s into %s\n' "$version" "$out" >&2
  flags="-s -w -X $module/version.Version=${version#v} -X $module/version.GitCommit=module-$version"
  for cmd in operator adapter; do
    (cd "$here" && go build -ldflags "$flags" -o "$out/keda-$cmd.tmp.$$" "$module/cmd/$cmd")
    mv "$out/keda-$cmd.tmp.$$" "$out/keda-$cmd"
  done
  dir=$(cd "$here" && go list -m -f '{{.Dir}}' "$module")
  rm -rf "$out/crds.tmp.$$" && mkdir "$out/crds.tmp.$$"
  cp "$dir"/config/crd/bases/*.yaml "$out/crds.tmp.$$/" && chmod u+w "$out/crds.tmp.$$"/*.yaml
  rm -rf "$out/crds" && mv "$out/crds.tmp.$$" "$out/crds"
  printf '[keda] built in %ss\n' "$(( $(date +%s) - start ))" >&2
fi
echo "$out"
