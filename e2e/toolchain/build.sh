#!/usr/bin/env bash
# Builds the local cluster's binaries (control plane, kubelet, kube-proxy, helm) from Go modules into a cache that is
# keyed by the pins, so a second run is a no-op and a pin change rebuilds.
#
#   e2e/toolchain/build.sh            print the directory holding the binaries
#   e2e/toolchain/build.sh helm       the same, building helm alone (what `make lint` needs: no Kubernetes binary)
#
# The Kubernetes binaries (and the fake-GPU plugin, against that release's device-plugin API) come from the module in
# kube/ (the release every test runs), or, with TROP_KUBE_MINOR=X.Y, from kube-X.Y/ (another release the project
# claims, e.g. 1.30, the oldest: `make test-k8s-oldest`). Each module's binaries have a cache directory of their own.
#
# Honours KUBEBUILDER_ASSETS: when it names a directory with envtest's layout
# (etcd, kube-apiserver), nothing is built and that directory is used for them.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false

# The module is listed inside a `require ( ... )` block (or on a one-line require).
modver() { awk -v m="$2" '($1=="require" && $2==m) {print $3; exit} ($1==m && $2 ~ /^v/) {print $2; exit}' "$1"; }
# The module directory: kube/, or kube-X.Y/ for TROP_KUBE_MINOR=X.Y (kube/ itself when it pins that minor).
kube_dir=$here/kube
minor_of() { local v; v=$(modver "$1/go.mod" k8s.io/kubernetes); v=${v#v}; echo "${v%.*}"; }
if [ -n "${TROP_KUBE_MINOR:-}" ] && [ "$(minor_of "$kube_dir")" != "$TROP_KUBE_MINOR" ]; then
  kube_dir=$here/kube-$TROP_KUBE_MINOR
  [ -f "$kube_dir/go.mod" ] || { echo "[cluster-bin] TROP_KUBE_MINOR=$TROP_KUBE_MINOR: no module $kube_dir/go.mod" \
    "(have: kube/ = $(minor_of "$here/kube")$(cd "$here" && for d in kube-*/; do printf ', %s' "${d%/}"; done))" >&2; exit 1; }
fi
KUBE_VERSION=$(modver "$kube_dir/go.mod" k8s.io/kubernetes)
HELM_VERSION=v3.21.4
ETCD_VERSION=$(modver "$here/etcd/go.mod" go.etcd.io/etcd/server/v3)
# An empty version would be stamped into the binaries (component-base parses it at start-up).
[[ $KUBE_VERSION =~ ^v[0-9]+\.[0-9]+\.[0-9]+ ]] || { echo "[cluster-bin] cannot read k8s.io/kubernetes version from $kube_dir/go.mod" >&2; exit 1; }
[[ $ETCD_VERSION =~ ^v[0-9]+\. ]] || { echo "[cluster-bin] cannot read etcd version from etcd/go.mod" >&2; exit 1; }

pins=$(cat "$here/build.sh" "$kube_dir/go.mod" "$kube_dir/go.sum" "$kube_dir"/cmd/fake-gpu-plugin/*.go \
  "$here/etcd/go.mod" "$here/etcd/go.sum" | sha256sum | cut -c1-16)
cache_root=${TRITON_OPERATOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/triton-operator}
out="$cache_root/bin/$pins"
mkdir -p "$out"

log() { printf '[cluster-bin] %s\n' "$*" >&2; }

have() { [ -x "$out/$1" ]; }

build_kube() {
  local name=$1 major minor
  major=${KUBE_VERSION#v}; major=${major%%.*}
  minor=${KUBE_VERSION#v*.}; minor=${minor%%.*}
  local date; date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  local flags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    flags+=" -X $pkg.gitCommit=0000000000000000000000000000000000000000 -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date"
  done
  log "building $name $KUBE_VERSION"
  (cd "$kube_dir" && go build -ldflags "$flags" -o "$out/$name.tmp.$$" "k8s.io/kubernetes/cmd/$name")
  mv "$out/$name.tmp.$$" "$out/$name"
}

# Our device plugin: advertises fake nvidia.com/gpu devices through the kubelet's device-plugin API.
build_plugin() {
  log "building fake-gpu-plugin"
  (cd "$kube_dir" && go build -ldflags "-s -w" -o "$out/fake-gpu-plugin.tmp.$$" ./cmd/fake-gpu-plugin)
  mv "$out/fake-gpu-plugin.tmp.$$" "$out/fake-gpu-plugin"
}

build_etcd() {
  log "building etcd $ETCD_VERSION"
  (cd "$here/etcd" && go build -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=module" -o "$out/etcd.tmp.$$" .)
  mv "$out/etcd.tmp.$$" "$out/etcd"
}

build_helm() {
  local major minor
  major=${KUBE_VERSION#v}; major=${major%%.*}
  minor=${KUBE_VERSION#v*.}; minor=${minor%%.*}
  log "building helm $HELM_VERSION"
  local flags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  flags+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=$major -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$minor"
  flags+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=$major -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$minor"
  local gobin; gobin=$(mktemp -d)
  GOBIN=$gobin go install -ldflags "$flags" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  mv "$gobin/helm" "$out/helm"; rmdir "$gobin"
}

assets=${KUBEBUILDER_ASSETS:-}
if [ -n "$assets" ] && [ -x "$assets/kube-apiserver" ] && [ -x "$assets/etcd" ]; then
  log "using KUBEBUILDER_ASSETS=$assets for etcd and kube-apiserver"
  for b in etcd kube-apiserver kube-controller-manager kube-scheduler; do
    [ -x "$assets/$b" ] && ln -sf "$assets/$b" "$out/$b"
  done
fi

start=$(date +%s)
if [ "${1:-}" = helm ]; then
  have helm || build_helm
  log "helm ready in $out ($(( $(date +%s) - start ))s)"
  echo "$out"
  exit 0
fi
have etcd || build_etcd
for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy; do have "$b" || build_kube "$b"; done
have helm || build_helm
have fake-gpu-plugin || build_plugin
log "binaries ready in $out ($(( $(date +%s) - start ))s)"
echo "$out"
