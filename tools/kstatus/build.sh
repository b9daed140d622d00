#!/usr/bin/env bash
# Builds tools/kstatus (kstatus, pinned by go.mod and go.sum) into the cache e2e/toolchain/build.sh uses, keyed
# by the hash of this directory's inputs: a second run is a no-op, a change to any of them rebuilds.
#
#   tools/kstatus/build.sh            print the path of the kstatus binary
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false

pins=$(cat "$here/build.sh" "$here/go.mod" "$here/go.sum" "$here/main.go" | sha256sum | cut -c1-16)
cache_root=${TRITON_OPERATOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/triton-operator}
out="$cache_root/bin/kstatus-$pins"

if [ ! -x "$out/kstatus" ]; then
  mkdir -p "$out"
  start=$(date +%s)
  printf '[kstatus] building %s\n' "$(awk '$1=="sigs.k8s.io/cli-utils" {print $1 "@" $2}' "$here/go.mod")" >&2
  (cd "$here" && go build -mod=readonly -trimpath -ldflags "-s -w" -o "$out/kstatus.tmp.$$" .)
  mv "$out/kstatus.tmp.$$" "$out/kstatus"
  printf '[kstatus] built in %ss\n' "$(( $(date +%s) - start ))" >&2
fi
echo "$out/kstatus"
