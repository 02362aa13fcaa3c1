#!/usr/bin/env bash
# Builds ipkeep's runtime image with buildah, offline and without a container engine: FROM scratch,
# the two static binaries the workspace built, non-root. The Dockerfile's runtime stage says the same.
#
#   scripts/build-image.sh BIN_DIR OUT_ARCHIVE [TAG]
#
# BIN_DIR holds `ipkeep` and `ipkeep-operator` (statically linked: a FROM scratch image has no C
# library); OUT_ARCHIVE is written as an OCI archive (`oci-archive:` for buildah, skopeo, podman)
# with the reference name TAG (default ipkeep:<workspace version>).
# buildah keeps its storage under $IPKEEP_BUILDAH_ROOT (default target/buildah) with the vfs driver,
# which works as root without overlay support; nothing is left in the machine's own image store.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "build-image: error: $*" >&2; exit 1; }

[ $# -ge 2 ] && [ $# -le 3 ] || die "usage: $0 BIN_DIR OUT_ARCHIVE [TAG]"
bin_dir=$1
out=$2
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
tag=${3:-ipkeep:$version}

command -v buildah >/dev/null 2>&1 \
  || die "buildah is not installed: run scripts/install-packaging-deps.sh (Debian package buildah)"
for b in ipkeep ipkeep-operator; do
  [ -x "$bin_dir/$b" ] || die "$bin_dir/$b is missing: run 'make image' (it builds the static binaries first)"
  # A FROM scratch image has no dynamic loader: refuse a binary that asks for one.
  if LC_ALL=C readelf -lW "$bin_dir/$b" | grep 'Requesting program interpreter' >/dev/null; then
    die "$bin_dir/$b is dynamically linked; build it with RUSTFLAGS='-C target-feature=+crt-static' (make image does)"
  fi
done

case "$(uname -m)" in
  x86_64) arch=amd64 ;;
  aarch64) arch=arm64 ;;
  *) die "no image architecture known for $(uname -m)" ;;
esac

root=${IPKEEP_BUILDAH_ROOT:-$PWD/target/buildah}
mkdir -p "$root" "$(dirname "$out")"
bh() { buildah --root "$root/storage" --runroot "$root/run" --storage-driver vfs "$@"; }

ctr=$(bh from --name "ipkeep-image-$$" scratch)
trap 'bh rm "$ctr" >/dev/null 2>&1 || true' EXIT
bh copy --quiet --chmod 0555 "$ctr" "$bin_dir/ipkeep" /ipkeep
bh copy --quiet --chmod 0555 "$ctr" "$bin_dir/ipkeep-operator" /ipkeep-operator
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
