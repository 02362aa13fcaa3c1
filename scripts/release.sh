#!/usr/bin/env bash
# One version names a release: the workspace's (Cargo.toml, [workspace.package] version). This
# checks that everything else that says it agrees, and writes a release's artifacts.
#
#   scripts/release.sh --check   (make release-check, part of make lint) Chart.yaml's version and
#                                appVersion are the workspace version, and the workspace version is
#                                CHANGELOG.md's newest release or, while an "## [Unreleased]"
#                                section heads CHANGELOG.md, a version above it (the next release,
#                                being made: main's image must never carry a released version's
#                                tag); the tag v<version>, where it exists, is the commit
#                                CHANGELOG.md lists for that release, and no unreleased version is
#                                tagged. Builds nothing.
#   scripts/release.sh           (make release, which builds helm and the image first) the check,
#                                then, for a released version only, writes to
#                                target/release-artifacts/: ipkeep-<version>.tgz (helm package of
#                                charts/ipkeep), ipkeep-<version>.oci.tar (make image's archive,
#                                checked to be named ipkeep:<version>), SHA256SUMS.
#   scripts/release.sh --previous  prints "<version> <commit>" of the release an upgrade starts
#                                from: CHANGELOG.md's newest release other than the workspace
#                                version, at the commit its section lists
#                                (scripts/build-previous-release.sh builds it).
#
# The image tag needs no check of its own: scripts/build-image.sh reads it from Cargo.toml.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "release: $*" >&2; }
die() { echo "release: error: $*" >&2; exit 1; }

check_only=
previous_only=
case ${1:-} in
  --check) check_only=1 ;;
  --previous) previous_only=1 ;;
  "") ;;
  *) die "usage: $0 [--check|--previous]" ;;
esac
[ $# -le 1 ] || die "usage: $0 [--check|--previous]"

chart=charts/ipkeep/Chart.yaml
version=$(sed -n '/^\[workspace\.package\]/,/^\[/ s/^version = "\(.*\)"$/\1/p' Cargo.toml)
[ -n "$version" ] || die "Cargo.toml has no [workspace.package] version"
chart_version=$(sed -n -E 's/^version: *"?([^" ]*)"? *$/\1/p' "$chart")
app_version=$(sed -n -E 's/^appVersion: *"?([^" ]*)"? *$/\1/p' "$chart")
# Every "## [x.y.z]" heading, newest first; "## [Unreleased]" does not start with a digit.
releases=$(sed -n -E 's/^## \[([0-9][^]]*)\].*/\1/p' CHANGELOG.md)
changelog_version=$(head -n 1 <<<"$releases")
# release_commit VERSION: the commit VERSION's section lists ("Commit: `<40 hex>`"), once known.
release_commit() {
  sed -n -E "/^## \[${1//./\\.}\]/,/^## \[/ s/^Commit: \`([0-9a-f]{40})\`.*/\1/p" CHANGELOG.md
}

if [ -n "$previous_only" ]; then
  previous=$(grep -vxF "$version" <<<"$releases" | head -n 1 || true)
  [ -n "$previous" ] || die "CHANGELOG.md lists no release other than $version: there is nothing to upgrade from"
  previous_commit=$(release_commit "$previous")
  [ -n "$previous_commit" ] || die "CHANGELOG.md's section of $previous lists no 'Commit: \`<hash>\`'"
  echo "$previous $previous_commit"
  exit 0
fi
# Whether "## [Unreleased]" comes before every release's heading.
unreleased_on_top=
[ "$(sed -n -E '/^## \[/{p;q}' CHANGELOG.md)" = "## [Unreleased]" ] && unreleased_on_top=1
# The one rule: the version is the newest release, or the next one while [Unreleased] says what
# it will hold. "Above" is version order (sort -V: 0.10.0 is above 0.9.0).
above_newest() {
  [ "$1" != "$2" ] && [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | tail -n 1)" = "$1" ]
}
released=
[ "$changelog_version" = "$version" ] && released=1

problems=()
[ "$chart_version" = "$version" ] \
  || problems+=("$chart's version is '${chart_version}', the workspace version (Cargo.toml) is $version")
[ "$app_version" = "$version" ] \
  || problems+=("$chart's appVersion is '${app_version}', the workspace version (Cargo.toml) is $version")
if [ -z "$released" ]; then
  if [ -z "$changelog_version" ]; then
    problems+=("CHANGELOG.md lists no release; the workspace version (Cargo.toml) is $version: add its '## [$version] — <date>' section")
  elif ! above_newest "$version" "$changelog_version"; then
    problems+=("the workspace version (Cargo.toml) $version is neither CHANGELOG.md's newest release, $changelog_version, nor above it")
  elif [ -z "$unreleased_on_top" ]; then
    problems+=("the workspace version (Cargo.toml) $version is above CHANGELOG.md's newest release, $changelog_version, but no '## [Unreleased]' section heads CHANGELOG.md: add it (what $version will change), or add the '## [$version] — <date>' section when releasing it")
  fi
fi

commit=$(release_commit "$version")
tag=v$version
tag_commit=
note=
if git rev-parse --git-dir >/dev/null 2>&1; then
  tag_commit=$(git rev-parse -q --verify "refs/tags/$tag^{commit}" || true)
  # A copy with its history cut or rewritten lacks the commit: that is no disagreement.
  if [ -n "$commit" ] && ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
    note=" (not in this copy's history)"
  fi
  if [ -n "$tag_commit" ] && [ -n "$commit" ] && [ "$tag_commit" != "$commit" ]; then
    problems+=("tag $tag is commit $tag_commit, but CHANGELOG.md lists $commit for $version")
  fi
  if [ -n "$tag_commit" ] && [ -z "$released" ]; then
    problems+=("tag $tag exists, but CHANGELOG.md has no '## [$version]' section: $version is released only by its section")
  fi
fi

if [ ${#problems[@]} -gt 0 ]; then
  for p in "${problems[@]}"; do echo "release: error: $p" >&2; done
  die "${#problems[@]} disagreement(s) about release $version (docs/testing.md#releases-make-release)"
fi
if [ -n "$check_only" ]; then
  if [ -n "$released" ]; then
    say "version $version in Cargo.toml, $chart and CHANGELOG.md${commit:+; released as commit ${commit:0:12}$note}${tag_commit:+ (tag $tag)}"
  else
    say "version $version in Cargo.toml and $chart: unreleased ([Unreleased] in CHANGELOG.md), above the newest release $changelog_version"
  fi
  exit 0
fi
[ -n "$released" ] \
  || die "$version is not released: CHANGELOG.md has no '## [$version]' section; move what [Unreleased] lists there first (docs/testing.md#releases-make-release)"

# ----- the artifacts -----

helm=$(e2e/cluster/build.sh --print-bin-dir)/helm
[ -x "$helm" ] || die "$helm is not built: run make cluster-bins (make release does)"
image=target/image/ipkeep.oci.tar
[ -s "$image" ] || die "$image is missing: run make image (make release does)"
index=$(tar -xOf "$image" index.json) || die "$image is not an OCI archive (no index.json)"
grep -E "\"org\\.opencontainers\\.image\\.ref\\.name\": *\"ipkeep:${version//./\\.}\"" <<<"$index" >/dev/null \
  || die "$image is not named ipkeep:$version: run make image again"

out=target/release-artifacts
rm -rf "$out"
mkdir -p "$out"
helm_home=$(mktemp -d)
trap 'rm -rf "$helm_home"' EXIT
# helm's own configuration and caches stay out of the user's home.
HELM_CONFIG_HOME=$helm_home/config HELM_CACHE_HOME=$helm_home/cache HELM_DATA_HOME=$helm_home/data \
  "$helm" package charts/ipkeep --destination "$out" >/dev/null
[ -s "$out/ipkeep-$version.tgz" ] || die "helm package wrote no $out/ipkeep-$version.tgz"
cp "$image" "$out/ipkeep-$version.oci.tar"
(cd "$out" && sha256sum "ipkeep-$version.tgz" "ipkeep-$version.oci.tar" >SHA256SUMS)

head=$(git rev-parse HEAD 2>/dev/null || echo unknown)
dirty=
[ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] || dirty=", with uncommitted changes"
say "ipkeep $version from commit $head$dirty:"
for f in "ipkeep-$version.tgz" "ipkeep-$version.oci.tar" SHA256SUMS; do
  say "  $out/$f ($(du -h "$out/$f" | cut -f1))"
done
if [ -z "$tag_commit" ]; then
  say "not tagged yet: once this commit is the release, git tag -a $tag $head -m 'ipkeep $version', and list the commit in CHANGELOG.md"
fi
