# shellcheck shell=bash
# The arm64 cross toolchain, named once: the Debian packages it is made of (for
# scripts/install-arm64-deps.sh) and the environment that points cargo at it (for
# scripts/build-arm64.sh and scripts/test-arm64.sh). Sourced, never run.
#
# rustup cannot add a target here (it downloads), so the whole toolchain is Debian's: rustc-web and
# cargo-web (a Rust recent enough for the workspace; Debian's plain rustc is 1.63) with the aarch64
# standard library from the arm64 architecture's libstd-rust-web-dev, the aarch64 gcc as linker and
# C compiler (ring has C and assembly), the aarch64 libc.a the static link needs, and qemu-user to
# run the results on this x86_64 machine.

# The target every arm64 build and test is for.
ARM64_TRIPLE=aarch64-unknown-linux-gnu
# Debian's rustc-web puts its compiler at /usr/bin, not under rustup's ~/.cargo/bin that comes first
# on PATH: the scripts name it by path, and tell cargo which rustc to run.
ARM64_RUSTC=/usr/bin/rustc
ARM64_RUSTDOC=/usr/bin/rustdoc
ARM64_CARGO=/usr/bin/cargo
# qemu-user's dynamically linked emulator: what it runs is static (the shipped binaries and the test
# binaries alike), so it needs no aarch64 sysroot (-L).
ARM64_QEMU=/usr/bin/qemu-aarch64

# STEPS|PACKAGE|TEST, as scripts/debian-packages.sh's table (the install step is `arm64-deps`).
# The packages' own rows use their status rather than a path: Debian's plain `rustc` and `cargo`
# (1.63, too old) install the same /usr/bin/rustc and /usr/bin/cargo.
ARM64_DEBIAN_PACKAGES=(
  # The compiler and cargo, at the same version as the aarch64 standard library below.
  'arm64-deps|rustc-web|dpkg-query -W -f="\${Status}" rustc-web 2>/dev/null | grep "install ok installed"'
  'arm64-deps|cargo-web|dpkg-query -W -f="\${Status}" cargo-web 2>/dev/null | grep "install ok installed"'
  # The aarch64 standard library (core, std, test): the arm64 architecture's package, installed
  # beside the amd64 one rustc-web brings (Multi-Arch: same holds both at one version).
  'arm64-deps|libstd-rust-web-dev:arm64|ls /usr/lib/rustlib/aarch64-unknown-linux-gnu/lib/libstd-*.rlib'
  # The linker, the C compiler and ar for ring's C and assembly (and aarch64-linux-gnu-readelf).
  'arm64-deps|gcc-aarch64-linux-gnu|command -v aarch64-linux-gnu-gcc && command -v aarch64-linux-gnu-readelf'
  # The aarch64 libc.a and crt files the static link needs (gcc-aarch64-linux-gnu only recommends it).
  'arm64-deps|libc6-dev-arm64-cross|[ -f /usr/aarch64-linux-gnu/lib/libc.a ]'
  # Runs the aarch64 binaries on x86_64, the emulator alone: its binfmt_misc registration
  # (qemu-user-binfmt, only recommended) is not wanted, the scripts call qemu-aarch64 themselves.
  'arm64-deps|qemu-user|[ -x /usr/bin/qemu-aarch64 ]'
)

# arm64_cargo_env: exports what makes $ARM64_CARGO build for $ARM64_TRIPLE with Debian's toolchain,
# statically linked as the amd64 binaries are (the Makefile's RUSTFLAGS: with --target they apply
# to the aarch64 code only, never to build scripts and proc macros, which run here), and run what it
# builds (cargo test) under qemu.
arm64_cargo_env() {
  export RUSTC=$ARM64_RUSTC RUSTDOC=$ARM64_RUSTDOC CARGO=$ARM64_CARGO
  # A rustup toolchain chosen by the caller must not reach the build; nor flags set for another one.
  unset RUSTUP_TOOLCHAIN RUSTC_WRAPPER CARGO_ENCODED_RUSTFLAGS CARGO_BUILD_TARGET
  export RUSTFLAGS="-C target-feature=+crt-static"
  export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
  export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER=$ARM64_QEMU
  export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
  export AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar
}

# arm64_require WHO: fails saying what to run when the toolchain is not all there.
arm64_require() {
  local who=$1 row pkg test missing=()
  for row in "${ARM64_DEBIAN_PACKAGES[@]}"; do
    row=${row#*|}
    pkg=${row%%|*}
    test=${row#*|}
    (eval "$test") >/dev/null 2>&1 || missing+=("$pkg")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "$who: error: the arm64 toolchain lacks ${missing[*]}: run scripts/install-arm64-deps.sh (as root)" >&2
    return 1
  fi
}

# arm64_check_static WHO BINARY: fails unless BINARY is an aarch64 ELF executable with no program
# interpreter and no shared library it needs: it must run on any arm64 node, FROM scratch.
arm64_check_static() {
  local who=$1 bin=$2 header
  header=$(LC_ALL=C aarch64-linux-gnu-readelf -hldW "$bin") || {
    echo "$who: error: $bin is not an ELF file" >&2
    return 1
  }
  if ! grep -E '^ +Machine: +AArch64$' <<<"$header" >/dev/null; then
    echo "$who: error: $bin is not an aarch64 binary: $(grep -E '^ +Machine:' <<<"$header")" >&2
    return 1
  fi
  if grep -E 'Requesting program interpreter|\(NEEDED\)' <<<"$header" >/dev/null; then
    echo "$who: error: $bin is dynamically linked: $(grep -E 'program interpreter|\(NEEDED\)' <<<"$header" | tr -s ' ')" >&2
    return 1
  fi
}
