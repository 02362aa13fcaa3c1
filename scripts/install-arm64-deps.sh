#!/usr/bin/env bash
# Installs what the arm64 cross build and its tests under qemu need on a Debian machine
# (scripts/build-arm64.sh, scripts/test-arm64.sh); safe to re-run: it installs only what is missing.
#   - the arm64 architecture beside the machine's own (dpkg --add-architecture arm64), for the
#     aarch64 Rust standard library;
#   - the packages of the `arm64-deps` step in scripts/arm64-toolchain.sh, which says what each is
#     for: rustc-web, cargo-web, libstd-rust-web-dev:arm64, gcc-aarch64-linux-gnu,
#     libc6-dev-arm64-cross, qemu-user: about 1.1 GB on disk, most of it Rust's standard library
#     and LLVM twice over (the arm64 standard library package depends on the arm64 LLVM too).
# No binfmt_misc handler is registered: the scripts call qemu-aarch64 themselves.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/debian-packages.sh
. scripts/debian-packages.sh
# shellcheck source=scripts/arm64-toolchain.sh
. scripts/arm64-toolchain.sh

DEBIAN_PACKAGES+=("${ARM64_DEBIAN_PACKAGES[@]}")

mapfile -t missing < <(debian_packages_missing arm64-deps)
[ ${#missing[@]} -gt 0 ] || exit 0

# apt-get can see libstd-rust-web-dev:arm64 only once dpkg knows the architecture; debian_install's
# apt-get update then fetches its package lists.
if ! dpkg --print-foreign-architectures | grep -Fx arm64 >/dev/null; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-arm64-deps: need root to add the arm64 architecture and install ${missing[*]}" >&2
    exit 1
  fi
  echo "install-arm64-deps: adding the arm64 architecture (dpkg --add-architecture arm64)" >&2
  dpkg --add-architecture arm64
fi

debian_install install-arm64-deps arm64-deps
