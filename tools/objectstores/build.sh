#!/usr/bin/env bash
# Builds the object stores the fetch tests run against, each from its pinned Go module, into the cache
# tools/kstatus/build.sh uses, keyed by the hash of this file and the Go version: a second run is a no-op.
#
#   versitygw        github.com/versity/versitygw (Apache-2.0), a real S3 server over a POSIX directory
#   fake-gcs-server  github.com/fsouza/fake-gcs-server (BSD-2), Google Cloud Storage's JSON and XML APIs
#
#   tools/objectstores/build.sh versitygw|fake-gcs-server    print the path of that binary
set -euo pipefail

declare -A MODULES=(
  [versitygw]=github.com/versity/versitygw/cmd/versitygw@v1.8.0
  [fake-gcs-server]=github.com/fsouza/fake-gcs-server@v1.56.1
)
name=${1:?usage: build.sh versitygw|fake-gcs-server}
module=${MODULES[$name]:?unknown tool $name}
export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false

pins=$( (cat "$0"; go version; go env GOOS GOARCH) | sha256sum | cut -c1-16)
cache_root=${TRITON_OPERATOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/triton-operator}
out="$cache_root/bin/$name-$pins"

if [ ! -x "$out/$name" ]; then
  mkdir -p "$out"
  tmp=$(mktemp -d "$out/.build.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  start=$(date +%s)
  printf '[objectstores] building %s (module download and compile, about a minute on 2 cores)\n' "$module" >&2
  GOBIN="$tmp" go install -trimpath -ldflags "-s -w" "$module"
  mv "$tmp/$name" "$out/$name"
  printf '[objectstores] built %s in %ss\n' "$name" "$(( $(date +%s) - start ))" >&2
fi
echo "$out/$name"
