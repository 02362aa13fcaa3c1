#!/usr/bin/env bash
# The image's SBOM: one CycloneDX document (JSON) per binary the image holds, ipkeep (the CNI
# plugin) and ipkeep-operator, per architecture the release's image index holds, each listing the
# Rust packages cargo resolves into that binary for that target (Cargo.lock, the build's features):
#
#   scripts/sbom.sh OUT_DIR
#
# writes OUT_DIR/<binary>.<arch>.cdx.json for amd64 and arm64. The tool is cargo-cyclonedx, the
# CycloneDX project's cargo plugin, built from its crate at CYCLONEDX_VERSION into a cache outside
# the work tree keyed by that version (~/.cache/ipkeep/cargo-cyclonedx-<version>), once. It reads
# `cargo metadata` and compiles nothing of ours, so it needs no arm64 toolchain.
set -euo pipefail
cd "$(dirname "$0")/.."

CYCLONEDX_VERSION=0.5.9
# binary|package directory, and arch|target triple: what the image ships, for whom.
BINARIES=("ipkeep|plugin" "ipkeep-operator|operator")
ARCHES=("amd64|x86_64-unknown-linux-gnu" "arm64|aarch64-unknown-linux-gnu")

die() { echo "sbom: error: $*" >&2; exit 1; }
[ $# -eq 1 ] || die "usage: $0 OUT_DIR"
out=$1

tool_root=${XDG_CACHE_HOME:-$HOME/.cache}/ipkeep/cargo-cyclonedx-$CYCLONEDX_VERSION
tool=$tool_root/bin/cargo-cyclonedx
if [ ! -x "$tool" ]; then
  # Into a temporary root first: an interrupted install never looks like a finished one.
  rm -rf "$tool_root.partial"
  scripts/step.sh sbom "cargo-cyclonedx $CYCLONEDX_VERSION from its crate (once)" \
    cargo install --quiet --locked --version "$CYCLONEDX_VERSION" --root "$tool_root.partial" cargo-cyclonedx
  mv "$tool_root.partial" "$tool_root"
fi

# cargo-cyclonedx describes every binary of the workspace, each document beside its package's
# Cargo.toml, named after the binary and the target: the image's two are moved out, the others
# removed at once, and the trap removes any left if something stops half-way. Build scripts' own
# dependencies are not in a binary and are left out (proc macros stay, as cargo tree lists them);
# the timestamp is the commit's (SOURCE_DATE_EPOCH), so one commit gives the same documents but
# their serial number.

# package_name DIR: the [package] name of DIR/Cargo.toml.
package_name() { sed -n 's/^name = "\(.*\)"$/\1/p' "$1/Cargo.toml" | head -n 1; }
strays() { find . -path ./target -prune -o -name "*_bin_$1.cdx.json" -print; }
trap 'for row in "${ARCHES[@]}"; do strays "${row#*|}" | xargs -r rm -f; done' EXIT
SOURCE_DATE_EPOCH=$(git log -1 --format=%ct)
export SOURCE_DATE_EPOCH
mkdir -p "$out"
for arch_row in "${ARCHES[@]}"; do
  arch=${arch_row%%|*}
  triple=${arch_row#*|}
  "$tool" cyclonedx --quiet --format json --spec-version 1.5 --describe binaries --no-build-deps \
    --target "$triple" --target-in-filename
  for binary_row in "${BINARIES[@]}"; do
    binary=${binary_row%%|*}
    package=${binary_row#*|}
    beside="$package/${binary}_bin_${triple}.cdx.json"
    [ -f "$beside" ] || die "cargo-cyclonedx wrote no $beside"
    # cargo-cyclonedx resolves the whole workspace at once (cargo metadata), so a feature another
    # member turns on (e2e's, the tests') adds packages no shipped binary holds. Kept: what cargo
    # resolves for building this package alone for this target, as make plugin / operator-static
    # do (normal dependencies; proc macros among them, which run at build time only).
    name=$(package_name "$package")
    cargo tree --quiet --locked -p "$name" --target "$triple" -e normal \
      --prefix none --format '{p}' >"$out/.resolved"
    python3 - "$beside" "$out/.resolved" "$out/$binary.$arch.cdx.json" "$name" <<'PY'
import json, sys
bom_path, resolved_path, out_path, package = sys.argv[1:]
bom = json.load(open(bom_path))
root = bom["metadata"]["component"]
# cargo tree's lines: "name vVERSION", then " (where)" for a path package or "(*)" for a repeat;
# the first is the binary's own package, which is the BOM's root, not a component.
resolved = {tuple(line.split()[:2]) for line in open(resolved_path) if line.strip()}
resolved.discard((package, "v" + root["version"]))
kept = [c for c in bom["components"] if (c["name"], "v" + c["version"]) in resolved]
missing = resolved - {(c["name"], "v" + c["version"]) for c in kept}
if missing:
    sys.exit(f"sbom: error: {bom_path} lacks what cargo resolves into it: {sorted(missing)}")
refs = {c["bom-ref"] for c in kept} | {bom["metadata"]["component"]["bom-ref"]}
dropped = [c for c in bom["components"] if c not in kept]
bom["components"] = kept
bom["dependencies"] = [
    {"ref": d["ref"], "dependsOn": [r for r in d.get("dependsOn", []) if r in refs]}
    for d in bom.get("dependencies", []) if d["ref"] in refs
]
json.dump(bom, open(out_path, "w"), indent=2)
print(f"sbom: {out_path} ({len(kept)} packages; {len(dropped)} of other workspace members' features left out)",
      file=sys.stderr)
PY
    rm -f "$beside" "$out/.resolved"
  done
  strays "$triple" | xargs -r rm -f
done
