#!/usr/bin/env bash
# Lays out ipkeep-docker's managed plugin bundle, the directory `docker plugin create NAME DIR`
# takes: DIR/config.json (packaging/docker/config.json) and DIR/rootfs/ holding the static binary
# and the directories its mounts and socket need — nothing else.
#
#   scripts/build-docker-plugin.sh BINARY OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "build-docker-plugin: error: $*" >&2; exit 1; }

[ $# -eq 2 ] || die "usage: $0 BINARY OUT_DIR"
bin=$1
out=$2
[ -x "$bin" ] || die "$bin is missing: run 'make docker-plugin' (it builds the static binary first)"
# The rootfs has no dynamic loader: refuse a binary that asks for one.
if LC_ALL=C readelf -lW "$bin" | grep 'Requesting program interpreter' >/dev/null; then
  die "$bin is dynamically linked; build it with RUSTFLAGS='-C target-feature=+crt-static' (make docker-plugin does)"
fi
rm -rf "$out"
mkdir -p "$out/rootfs/run/docker/plugins" "$out/rootfs/var/lib/ipkeep-docker" \
  "$out/rootfs/proc" "$out/rootfs/sys" "$out/rootfs/dev" "$out/rootfs/tmp" "$out/rootfs/etc"
install -m 0755 "$bin" "$out/rootfs/ipkeep-docker"
install -m 0644 packaging/docker/config.json "$out/config.json"
echo "build-docker-plugin: $out (docker plugin create ipkeep $out)"
