#!/usr/bin/env bash
# Builds ipkeep's runtime image with buildah, offline and without a container engine: FROM scratch,
# the two static binaries the workspace built, non-root. The Dockerfile's runtime stage says the same.
#
#   scripts/build-image.sh PLUGIN_BIN OPERATOR_BIN OUT_ARCHIVE [TAG]
#
# PLUGIN_BIN is `ipkeep` (the release profile), OPERATOR_BIN `ipkeep-operator` (the daemon
# profile), both statically linked: a FROM scratch image has no C library (make image builds them).
# The image is for their architecture, amd64 or arm64 (make image-arm64 passes the aarch64 ones).
# OUT_ARCHIVE is written as an OCI archive (`oci-archive:` for buildah, skopeo, podman) with the
# reference name TAG (default ipkeep:<workspace version>).
# buildah keeps its storage under $IPKEEP_BUILDAH_ROOT (default target/buildah) with the vfs driver,
# which works as root without overlay support; nothing is left in the machine's own image store.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "build-image: error: $*" >&2; exit 1; }

[ $# -ge 3 ] && [ $# -le 4 ] || die "usage: $0 PLUGIN_BIN OPERATOR_BIN OUT_ARCHIVE [TAG]"
plugin_bin=$1
operator_bin=$2
out=$3
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
tag=${4:-ipkeep:$version}

command -v buildah >/dev/null 2>&1 \
  || die "buildah is not installed: run scripts/install-packaging-deps.sh (Debian package buildah)"
for b in "$plugin_bin" "$operator_bin"; do
  [ -x "$b" ] || die "$b is missing: run 'make image' (it builds the static binaries first)"
  # A FROM scratch image has no dynamic loader: refuse a binary that asks for one.
  if LC_ALL=C readelf -lW "$b" | grep 'Requesting program interpreter' >/dev/null; then
    die "$b is dynamically linked; build it with RUSTFLAGS='-C target-feature=+crt-static' (make image does)"
  fi
done

# The image's architecture is its binaries' (make image-arm64 builds the arm64 image on this x86_64
# machine): both must be of one, and one the index knows.
# elf_arch BINARY: the OCI architecture of an ELF file, from its header's machine field.
elf_arch() {
  case "$(LC_ALL=C od -An -tu2 -j18 -N2 "$1" | tr -d ' ')" in
    62) echo amd64 ;;
    183) echo arm64 ;;
    *) die "$1 is for no architecture the image is built for (amd64, arm64)" ;;
  esac
}
arch=$(elf_arch "$plugin_bin")
[ "$(elf_arch "$operator_bin")" = "$arch" ] \
  || die "$plugin_bin is $arch but $operator_bin is $(elf_arch "$operator_bin"): one image holds one architecture"

root=${IPKEEP_BUILDAH_ROOT:-$PWD/target/buildah}
mkdir -p "$root" "$(dirname "$out")"
bh() { buildah --root "$root/storage" --runroot "$root/run" --storage-driver vfs "$@"; }

ctr=$(bh from --name "ipkeep-image-$$" scratch)
trap 'bh rm "$ctr" >/dev/null 2>&1 || true' EXIT
bh copy --quiet --chmod 0555 "$ctr" "$plugin_bin" /ipkeep
bh copy --quiet --chmod 0555 "$ctr" "$operator_bin" /ipkeep-operator
# 65532: the conventional "nonroot" uid/gid of distroless images; the chart's controller runs as it.
bh config --os linux --arch "$arch" --user 65532:65532 \
  --entrypoint '["/ipkeep-operator"]' --cmd '' --workingdir / \
  --label org.opencontainers.image.title=ipkeep \
  --label org.opencontainers.image.version="$version" \
  --label org.opencontainers.image.licenses=Apache-2.0 \
  "$ctr"
rm -f "$out"
bh commit --quiet --rm --format oci "$ctr" "oci-archive:$out:$tag" >/dev/null
trap - EXIT
echo "build-image: $tag written to $out ($(du -h "$out" | cut -f1))" >&2
