#!/usr/bin/env bash
# Cross-builds the two binaries ipkeep ships for arm64 nodes, with the recipes of the amd64 ones
# (make plugin, make operator-static), and copies them to OUT_DIR:
#
#   scripts/build-arm64.sh OUT_DIR
#
#   OUT_DIR/ipkeep            the CNI plugin, the workspace's release profile
#   OUT_DIR/ipkeep-operator   the operator, the daemon profile
#
# both aarch64-unknown-linux-gnu, statically linked, checked to be aarch64 ELF files with no program
# interpreter. The toolchain is Debian's (scripts/arm64-toolchain.sh; scripts/install-arm64-deps.sh
# installs it). Cargo's target directory is $CARGO_TARGET_DIR as for any build (default target/):
# Debian's rustc gives every artifact a hash of its own, beside rustup's.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/arm64-toolchain.sh
. scripts/arm64-toolchain.sh

[ $# -eq 1 ] || { echo "build-arm64: usage: $0 OUT_DIR" >&2; exit 2; }
out=$1

arm64_require build-arm64
arm64_cargo_env
target_dir=${CARGO_TARGET_DIR:-$PWD/target}

scripts/step.sh build-arm64 "ipkeep for $ARM64_TRIPLE, a static release build" \
  "$ARM64_CARGO" build -q --locked --release -p ipkeep-plugin --target "$ARM64_TRIPLE"
scripts/step.sh build-arm64 "ipkeep-operator for $ARM64_TRIPLE, a static daemon-profile build" \
  "$ARM64_CARGO" build -q --locked --profile daemon -p ipkeep-operator --target "$ARM64_TRIPLE"

mkdir -p "$out"
for built in "release/ipkeep" "daemon/ipkeep-operator"; do
  bin=$target_dir/$ARM64_TRIPLE/$built
  arm64_check_static build-arm64 "$bin"
  cp "$bin" "$out/"
  echo "build-arm64: $out/${built#*/} ($(stat -c %s "$bin") bytes, aarch64, static)" >&2
done
