#!/usr/bin/env bash
# Says, before a first `make demo` or `make test` on a machine, what it is about to install and
# build and roughly how long each part takes on two cores; says only that all is in place once
# it is (every part is cached: the Go builds outside the tree, the Rust builds in target/).
#
#   scripts/build-plan.sh demo|test
#
# The figures are cold builds on the 2-core development machine; each part prints its own
# progress and duration as it goes.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/debian-packages.sh
. scripts/debian-packages.sh

die() { echo "build-plan: error: $*" >&2; exit 1; }

[ $# -eq 1 ] || die "usage: $0 demo|test"
goal=$1
case $goal in
  demo) steps=(deps packaging-deps) ;;
  test) steps=(deps packaging-deps docker-deps) ;;
  *) die "no plan for make $goal" ;;
esac

triple=$(rustc -vV | sed -n 's/^host: //p')
target_dir=${CARGO_TARGET_DIR:-target}
release=$target_dir/$triple/release
daemon=$target_dir/$triple/daemon

parts=()
minutes=0
# part MINUTES WHAT: one line of the plan.
part() {
  minutes=$(( minutes + $1 ))
  if [ "$1" -eq 0 ]; then parts+=("$2: under a minute"); else parts+=("$2: about $1 min"); fi
}

mapfile -t missing < <(debian_packages_missing "${steps[@]}")
[ ${#missing[@]} -eq 0 ] || part 1 "Debian packages ${missing[*]}"
[ -x .venv/bin/kubernetes-validate ] || part 1 "kubernetes-validate into .venv (the chart tests)"
[ -d "$(e2e/cluster/build.sh --print-bin-dir)" ] \
  || part 9 "the control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, helm) from its Go modules, once per machine"
[ -d "$(e2e/cluster/build.sh --print-node-bin-dir)" ] \
  || part 2 "the node binaries (kubelet, kube-proxy, containerd, its runc shim, ctr, pause) from their Go modules, once per machine, and the node images"
[ -x "$release/ipkeep" ] || part 0 "ipkeep (the CNI plugin), a static release build"
[ -x "$daemon/ipkeep-operator" ] || part 3 "ipkeep-operator (controller, agent, install-cni), a static daemon-profile build"
part 0 "the image ipkeep:<version> (buildah) from those two"
# The parts every run has, cached or not: the plan says more only when something else is missing.
always=1
case $goal in
  demo)
    [ -x "$target_dir/debug/ipkeep-e2e" ] || part 3 "the demo program (ipkeep-e2e, a debug build)"
    ;;
  test)
    [ -d "$(e2e/cluster/build.sh --print-flannel-bin-dir)" ] \
      || part 2 "flanneld and flannel's CNI plugin from their Go modules, once per machine"
    [ -d "$(e2e/cluster/build.sh --print-crio-bin-dir)" ] \
      || part 3 "CRI-O and the upstream CNI plugins from their Go modules, once per machine"
    [ -d "$(e2e/cluster/build.sh --print-registry-bin-dir)" ] \
      || part 1 "the OCI registry (distribution) from its Go module, once per machine"
    [ -x "$daemon/ipkeep-docker" ] || part 2 "ipkeep-docker (the Docker IPAM driver), a static daemon-profile build"
    [ -f "$(scripts/build-previous-release.sh --print-dir)/ipkeep.oci.tar" ] \
      || part 8 "the previous release (the upgrade test's start: its image and chart) from its own commit, once per release"
    [ -x "$target_dir/debug/ipkeep-e2e" ] || part 8 "make lint (clippy) and the test binaries, debug builds"
    # The arm64 packages, the aarch64 cache and the SBOM tool: as the Makefile names them.
    dpkg-query -W -f='${Status}' libstd-rust-web-dev:arm64 2>/dev/null | grep -q 'install ok installed' \
      || part 3 "Debian's arm64 cross toolchain (rustc-web, libstd-rust-web-dev:arm64, gcc-aarch64-linux-gnu, qemu-user; about 1.1 GB)"
    compgen -G "$HOME/.cache/ipkeep/target-aarch64-*" >/dev/null \
      || part 10 "the arm64 build's dependencies (cached outside the work tree, keyed by Debian's rustc)"
    part 4 "ipkeep and ipkeep-operator for arm64, their image, and their tests under qemu-user"
    always=2
    compgen -G "${XDG_CACHE_HOME:-$HOME/.cache}/ipkeep/cargo-cyclonedx-*/bin/cargo-cyclonedx" >/dev/null \
      || part 2 "cargo-cyclonedx (the SBOM tool) from its crate, once per machine"
    ;;
esac

if [ ${#parts[@]} -eq "$always" ]; then
  echo "make $goal: everything it runs is built; checking it is up to date" >&2
  exit 0
fi
echo "make $goal: a first run on this machine installs and builds what it needs (cached afterwards), about $minutes min on two cores:" >&2
for p in "${parts[@]}"; do echo "  - $p" >&2; done
case $goal in
  demo) echo "  then the demo itself: about 2 min" >&2 ;;
  test) echo "  then every suite, the real control plane and real nodes included" >&2 ;;
esac
