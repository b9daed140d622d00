#!/usr/bin/env bash
# What `make demo`, `make test` and `.ci/run` need from the machine, checked before anything is built.
#
#   tools/prereqs.sh demo|test|lint       check; as root, install the missing Debian packages first
#   tools/prereqs.sh --check demo|test    check only: never install, exit 1 naming what is missing
#
# Every command is looked up on PATH as given (root's PATH has /usr/sbin, where iptables and conntrack live).
# As root, the missing Debian packages are installed with apt-get, as a new user's first `make demo` needs.
# Otherwise one line names them and the command that installs them, and nothing else runs. Go and Python are
# not Debian packages here (bookworm's are too old): a missing or old one is named, with the version needed.
set -uo pipefail

check_only=0
if [ "${1:-}" = "--check" ]; then check_only=1; shift; fi
target=${1:-}
case "$target" in
  demo|test|lint) ;;
  *) echo "usage: tools/prereqs.sh [--check] demo|test|lint" >&2; exit 2 ;;
esac

# Bash builtins only, up to the install: the check must run on a machine that lacks much.
here=${BASH_SOURCE[0]%/*}; [ "$here" = "${BASH_SOURCE[0]}" ] && here=.
say() { printf 'prerequisites: %s\n' "$*" >&2; }

# command (or file) -> Debian package, for each target. `lint` needs only the Python tools of the venv and helm,
# which the chart lint builds from its Go module.
base=(
  "ip:iproute2" "make:make" "gcc:gcc" "/usr/include/stdio.h:libc6-dev" "unshare:util-linux"
  "containerd:containerd" "runc:runc" "/usr/lib/cni/bridge:containernetworking-plugins"
  "iptables:iptables" "conntrack:conntrack" "buildah:buildah" "mmdebstrap:mmdebstrap"
)
case "$target" in
  demo) wanted=("${base[@]}") ;;
  test) wanted=("${base[@]}" "lua5.4:lua5.4") ;;  # the Argo CD health check's tests run its Lua
  lint) wanted=() ;;
esac

missing=()
for pair in "${wanted[@]}"; do
  what=${pair%%:*} pkg=${pair#*:}
  if [[ $what == /* ]]; then [ -e "$what" ] && continue; else command -v "$what" >/dev/null 2>&1 && continue; fi
  [[ " ${missing[*]} " == *" $pkg "* ]] || missing+=("$pkg")
done

# Go: the pinned modules need the version the toolchain's go.mod names (GOTOOLCHAIN=local: none is downloaded).
problems=()
# version_at_least HAVE NEED: dotted numeric versions, compared field by field.
version_at_least() {
  local -a have need; IFS=. read -ra have <<< "$1"; IFS=. read -ra need <<< "$2"
  local i
  for i in 0 1 2; do
    local h=${have[i]:-0} n=${need[i]:-0}; h=${h%%[!0-9]*}; n=${n%%[!0-9]*}
    (( ${h:-0} > ${n:-0} )) && return 0
    (( ${h:-0} < ${n:-0} )) && return 1
  done
  return 0
}
go_needed=0
for mod in "$here"/../e2e/toolchain/*/go.mod "$here"/*/go.mod; do
  while read -r word version _; do
    if [ "$word" = go ]; then version_at_least "$go_needed" "$version" || go_needed=$version; break; fi
  done < "$mod"
done

if ! command -v go >/dev/null 2>&1; then
  problems+=("Go $go_needed or later is not on PATH (Debian's golang is older; install it from go.dev's release)")
else
  go_have=$(go env GOVERSION 2>/dev/null); go_have=${go_have#go}
  if ! version_at_least "$go_have" "$go_needed"; then
    problems+=("Go $go_needed or later is needed, PATH has go $go_have")
  fi
fi
py=${PYTHON:-python3}
if ! "$py" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' >/dev/null 2>&1; then
  problems+=("Python 3.11 is needed as $py (the images' wheels are built by it for Debian bookworm's 3.11)")
elif ! "$py" -c 'import ensurepip, venv' >/dev/null 2>&1; then
  missing+=("python3-venv")
fi
if [ "$target" != lint ] && [ "$EUID" -ne 0 ]; then
  problems+=("make $target runs a local cluster (network namespaces, cgroups, containerd) and needs root")
fi

if [ ${#missing[@]} -gt 0 ]; then
  if [ "$check_only" -eq 0 ] && [ "$EUID" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing the missing Debian packages: ${missing[*]}"
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
           "${missing[@]}"; } >&2; then
      say "apt-get could not install ${missing[*]}"
      exit 1
    fi
    missing=()
  else
    problems=("missing Debian packages: ${missing[*]}; install them with: sudo apt-get install -y ${missing[*]}"
              "${problems[@]}")
  fi
fi

if [ ${#problems[@]} -gt 0 ]; then
  for p in "${problems[@]}"; do say "$p"; done
  exit 1
fi
exit 0
