#!/usr/bin/env bash
# Builds the previous release, the one an upgrade starts from, from its own source: its image
# archive and its chart, into a cache outside the work tree keyed by its version and commit (like
# the Go builds, e2e/cluster/build.sh), so that only the first run pays for it.
#
#   scripts/build-previous-release.sh              build it unless cached; print its directory last
#   scripts/build-previous-release.sh --print-dir  print that directory, build nothing
#
# The previous release is CHANGELOG.md's newest release other than the workspace version (while
# main is ahead of the newest release, that release; on a release's own commit, the one before),
# at the commit its section lists (`Commit: <hash>`), which `make release-check` holds equal to
# its tag; scripts/release.sh --previous is the one place that reads it. The directory,
# $IPKEEP_CACHE_DIR (default ~/.cache/ipkeep)/release-<version>-<commit>/, holds:
#   ipkeep.oci.tar   the release's image (its own scripts/build-image.sh: ipkeep:<version>)
#   chart/           the release's charts/ipkeep, as helm installs it from a directory
# The source is the commit's `git archive` in a scratch directory under the cache (no worktree
# left registered in this repository), built with its own Cargo.lock (--locked) and removed with
# its target directory afterwards; a finished build is renamed into place whole, so an interrupted
# one never looks complete. Both binaries are built as `make operator-static` builds the operator
# (thin LTO): the plugin's fat LTO would double the cold build for the same behaviour.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "previous-release: $*" >&2; }
die() { echo "previous-release: error: $*" >&2; exit 1; }

print_only=
case ${1:-} in
  --print-dir) print_only=1 ;;
  "") ;;
  *) die "usage: $0 [--print-dir]" ;;
esac

# The one rule of which release that is, and its commit: scripts/release.sh --previous.
read -r version commit < <(scripts/release.sh --previous) || exit 1
cache_root=${IPKEEP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ipkeep}
out="$cache_root/release-$version-${commit:0:12}"
if [ -n "$print_only" ]; then
  echo "$out"
  exit 0
fi
if [ -s "$out/ipkeep.oci.tar" ] && [ -f "$out/chart/Chart.yaml" ]; then
  say "ipkeep $version (commit ${commit:0:12}) is built: $out"
  echo "$out"
  exit 0
fi

git cat-file -e "$commit^{commit}" 2>/dev/null \
  || die "commit $commit (release $version) is not in this repository's history: fetch it (git fetch --tags)"
command -v buildah >/dev/null 2>&1 \
  || die "buildah is not installed: run scripts/install-packaging-deps.sh (Debian package buildah)"
host=$(rustc -vV | sed -n 's/^host: //p')
[ -n "$host" ] || die "rustc reports no host triple"

mkdir -p "$cache_root"
staging=$(mktemp -d "$cache_root/.release-$version.XXXXXX")
# buildah's vfs storage holds files of other owners: removed as root like the rest.
trap 'rm -rf "$staging"' EXIT
src=$staging/src
mkdir -p "$src"
git archive "$commit" | tar -x -C "$src"

start=$(date +%s)
say "building ipkeep $version from commit ${commit:0:12} (a cold static release build: minutes) ..."
(
  cd "$src"
  RUSTFLAGS="-C target-feature=+crt-static" CARGO_TARGET_DIR="$staging/target" CARGO_INCREMENTAL=0 \
    cargo build -q --locked --release -p ipkeep-plugin -p ipkeep-operator --target "$host" \
    --config 'profile.release.lto="thin"' --config 'profile.release.codegen-units=16'
  # The release's own image script: it names the image ipkeep:<its version>.
  IPKEEP_BUILDAH_ROOT="$staging/buildah" \
    scripts/build-image.sh "$staging/target/$host/release" "$staging/ipkeep.oci.tar"
)
cp -r "$src/charts/ipkeep" "$staging/chart"
grep -E "^version: *\"?${version//./\\.}\"? *$" "$staging/chart/Chart.yaml" >/dev/null \
  || die "the chart of commit ${commit:0:12} is not version $version"

result=$staging/result
mkdir "$result"
mv "$staging/ipkeep.oci.tar" "$staging/chart" "$result/"
rm -rf "$out"
mv "$result" "$out"
say "ipkeep $version built in $(( $(date +%s) - start ))s: $out"
echo "$out"
