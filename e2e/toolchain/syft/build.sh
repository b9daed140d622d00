#!/usr/bin/env bash
# Builds syft (Anchore's SBOM generator) from its Go module (go.mod here) into a cache keyed by the pins; prints the
# directory holding `syft`. `make release` runs it on the operator image's OCI archive to write the image's SBOM
# (tools/release.py): a well-kept tool reads the image's packages, dpkg's and Python's alike, rather than a list of ours.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false
pins=$(cat "$here/build.sh" "$here/go.mod" "$here/go.sum" | sha256sum | cut -c1-16)
cache_root=${TRITON_OPERATOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/triton-operator}
out="$cache_root/bin/syft-$pins"
if [ ! -x "$out/syft" ]; then
  mkdir -p "$out"
  start=$(date +%s)
  module=github.com/anchore/syft
  version=$(cd "$here" && go list -m -f '{{.Version}}' "$module")
  printf '[syft] building %s into %s\n' "$version" "$out" >&2
  (cd "$here" && go build -ldflags "-s -w -X main.version=${version#v} -X main.gitCommit=module-$version" \
    -o "$out/syft.tmp.$$" "$module/cmd/syft")
  mv "$out/syft.tmp.$$" "$out/syft"
  printf '[syft] built in %ss\n' "$(( $(date +%s) - start ))" >&2
fi
echo "$out"
