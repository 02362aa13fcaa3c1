#!/usr/bin/env bash
# Builds the two images every real test node has without a registry, with buildah, offline:
#   localhost/ipkeep-e2e/pause:1     the pod sandbox: the static `pause` program `build.sh --node` built
#   localhost/ipkeep-e2e/workload:1  Debian's busybox-static (sh, ip, httpd, wget, nc, sleep, ...)
#
#   scripts/build-node-images.sh NODE_BIN_DIR   build unless cached; print the image dir last
#
# The OCI archives go to $IPKEEP_CACHE_DIR (default ~/.cache/ipkeep)/node-images-<key>/, keyed by the
# pause binary, the busybox binary and this script, outside the work tree. A finished build is
# renamed into place whole, so an interrupted build never looks complete.
set -euo pipefail

say() { echo "node-images: $*" >&2; }
die() { echo "node-images: error: $*" >&2; exit 1; }

[ $# -eq 1 ] || die "usage: $0 NODE_BIN_DIR (e2e/cluster/build.sh --node prints it)"
pause_bin=$1/pause
busybox=/bin/busybox
[ -x "$pause_bin" ] || die "$pause_bin is missing: run e2e/cluster/build.sh --node"
[ -x "$busybox" ] && "$busybox" --list 2>/dev/null | grep -x httpd >/dev/null \
  || die "$busybox (a static busybox with httpd) is missing: apt-get install busybox-static (scripts/install-deps.sh does)"
command -v buildah >/dev/null 2>&1 || die "buildah is not installed: run scripts/install-packaging-deps.sh (Debian package buildah)"

cache_root=${IPKEEP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ipkeep}
key=$(cat "$pause_bin" "$busybox" "$0" | sha256sum | cut -c1-16)
out=$cache_root/node-images-$key
if [ -s "$out/pause.oci.tar" ] && [ -s "$out/workload.oci.tar" ]; then
  say "up to date: $out"
  echo "$out"
  exit 0
fi

case "$(uname -m)" in
  x86_64) arch=amd64 ;;
  aarch64) arch=arm64 ;;
  *) die "no image architecture known for $(uname -m)" ;;
esac

mkdir -p "$cache_root"
stage=$(mktemp -d "$cache_root/.build-node-images-$key.XXXXXX")
trap 'rm -rf "$stage"' EXIT
# buildah's own storage lives in the stage (vfs: no overlay needed) and goes with it.
bh() { buildah --root "$stage/storage" --runroot "$stage/run" --storage-driver vfs "$@"; }

# The sandbox: the pause program alone, as the upstream image (uid 65535, read-only rootfs is fine).
ctr=$(bh from --name "ipkeep-e2e-pause-$$" scratch)
bh copy --quiet --chmod 0555 "$ctr" "$pause_bin" /pause
bh config --os linux --arch "$arch" --user 65535:65535 --entrypoint '["/pause"]' --cmd '' --workingdir / "$ctr"
bh commit --quiet --rm --format oci "$ctr" "oci-archive:$stage/pause.oci.tar:localhost/ipkeep-e2e/pause:1" >/dev/null

# The workload: busybox and a link per applet, so `ip`, `httpd`, `wget`, `nc` are commands.
root=$stage/workload-root
mkdir -p "$root/bin" "$root/tmp" "$root/www"
cp "$busybox" "$root/bin/busybox"
for applet in $("$busybox" --list); do
  [ "$applet" = busybox ] || ln -s busybox "$root/bin/$applet"
done
echo "ipkeep-e2e workload" > "$root/www/index.html"
ctr=$(bh from --name "ipkeep-e2e-workload-$$" scratch)
bh copy --quiet "$ctr" "$root/." /
bh config --os linux --arch "$arch" --env PATH=/bin --cmd '["sh"]' --workingdir / "$ctr"
bh commit --quiet --rm --format oci "$ctr" "oci-archive:$stage/workload.oci.tar:localhost/ipkeep-e2e/workload:1" >/dev/null

rm -rf "$stage/storage" "$stage/run" "$root"
rm -rf "$out"
mv "$stage" "$out"
trap - EXIT
say "built $out: pause $(du -h "$out/pause.oci.tar" | cut -f1), workload $(du -h "$out/workload.oci.tar" | cut -f1)"
echo "$out"
