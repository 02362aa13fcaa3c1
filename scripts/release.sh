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
#   scripts/release.sh           (make release, which builds helm, both images and the SBOM first)
#                                the check, then writes the artifacts of the workspace version to
#                                $IPKEEP_RELEASE_DIR (default target/release-artifacts/):
#                                  ipkeep-<version>.oci.tar  an OCI image index for linux/amd64 and
#                                      linux/arm64 (buildah manifest create/add from make image's
#                                      and make image-arm64's archives, each checked to be named
#                                      ipkeep:<version>), named ipkeep:<version>, every manifest in it
#                                  ipkeep-<version>.tgz      helm package of charts/ipkeep
#                                  ipkeep-<version>.cdx.json make sbom's CycloneDX SBOM of the
#                                      image's binaries
#                                  RELEASE                   what they are: the version, released
#                                      (its commit and tag) or unreleased (main between releases:
#                                      the artifacts of the next version, never a release), the
#                                      commit built, the index digest, each platform's manifest
#                                      digest and image size
#                                  SHA256SUMS                of all the above
#                                buildah's storage is $IPKEEP_BUILDAH_ROOT (default target/buildah),
#                                as for scripts/build-image.sh. scripts/publish.sh pushes them.
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

# ----- the artifacts -----

helm=$(e2e/cluster/build.sh --print-bin-dir)/helm
[ -x "$helm" ] || die "$helm is not built: run make cluster-bins (make release does)"
for tool in buildah jq; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool is not installed: run make packaging-deps (make release does)"
done
amd64_image=target/image/ipkeep.oci.tar
arm64_image=target/image/ipkeep-arm64.oci.tar
sbom=target/sbom/ipkeep.cdx.json
for f in "$amd64_image:make image" "$arm64_image:make image-arm64" "$sbom:make sbom"; do
  [ -s "${f%%:*}" ] || die "${f%%:*} is missing: run ${f#*:} (make release does)"
done
for image in "$amd64_image" "$arm64_image"; do
  index=$(tar -xOf "$image" index.json) || die "$image is not an OCI archive (no index.json)"
  jq -e --arg ref "ipkeep:$version" '[.manifests[].annotations["org.opencontainers.image.ref.name"]] == [$ref]' \
    <<<"$index" >/dev/null || die "$image is not named ipkeep:$version: build it again (make image, make image-arm64)"
done

out=${IPKEEP_RELEASE_DIR:-target/release-artifacts}
rm -rf "$out"
mkdir -p "$out"
root=${IPKEEP_BUILDAH_ROOT:-$PWD/target/buildah}
mkdir -p "$root"
bh() { buildah --root "$root/storage" --runroot "$root/run" --storage-driver vfs "$@"; }
list=ipkeep-release-$$
helm_home=$(mktemp -d)
trap 'rm -rf "$helm_home"; bh manifest rm "$list" >/dev/null 2>&1 || true' EXIT

# The index: one manifest list in buildah's private storage holding both archives' images (their
# platform read from each image's configuration), written with every manifest and blob it names.
bh manifest create "$list" >/dev/null
for image in "$amd64_image" "$arm64_image"; do
  bh manifest add "$list" "oci-archive:$image" >/dev/null
done
index_archive=$out/ipkeep-$version.oci.tar
bh manifest push --quiet --all --format oci "$list" "oci-archive:$index_archive:ipkeep:$version" >/dev/null

# blob ARCHIVE DIGEST: the blob's content.
blob() { tar -xOf "$1" "blobs/sha256/${2#sha256:}"; }
top=$(tar -xOf "$index_archive" index.json | jq -r '.manifests[0].digest')
index_json=$(blob "$index_archive" "$top")
[ "$(jq -r '.mediaType' <<<"$index_json")" = application/vnd.oci.image.index.v1+json ] \
  || die "buildah wrote no OCI image index into $index_archive"
platforms=$(jq -r '[.manifests[].platform | "\(.os)/\(.architecture)"] | sort | join(" ")' <<<"$index_json")
[ "$platforms" = "linux/amd64 linux/arm64" ] \
  || die "the index in $index_archive holds $platforms, not linux/amd64 linux/arm64: check both images' architecture"

HELM_CONFIG_HOME=$helm_home/config HELM_CACHE_HOME=$helm_home/cache HELM_DATA_HOME=$helm_home/data \
  "$helm" package charts/ipkeep --destination "$out" >/dev/null
[ -s "$out/ipkeep-$version.tgz" ] || die "helm package wrote no $out/ipkeep-$version.tgz"
cp "$sbom" "$out/ipkeep-$version.cdx.json"

head=$(git rev-parse HEAD 2>/dev/null || echo unknown)
dirty=
[ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] || dirty=", with uncommitted changes"
{
  if [ -n "$released" ]; then
    echo "ipkeep $version, released${commit:+ as commit $commit}${tag_commit:+ (tag $tag)}"
  else
    echo "ipkeep $version, UNRELEASED: the next version, built between releases (CHANGELOG.md's [Unreleased]); not a release"
  fi
  echo "built from commit $head$dirty"
  echo "image index ipkeep:$version $top"
  while read -r platform digest; do
    size=$(blob "$index_archive" "$digest" | jq '.config.size + ([.layers[].size] | add)')
    echo "  $platform $digest $size bytes"
  done < <(jq -r '.manifests[] | "\(.platform.os)/\(.platform.architecture) \(.digest)"' <<<"$index_json")
} >"$out/RELEASE"
artifacts=("ipkeep-$version.oci.tar" "ipkeep-$version.tgz" "ipkeep-$version.cdx.json" RELEASE)
(cd "$out" && sha256sum "${artifacts[@]}" >SHA256SUMS)

while IFS= read -r line; do say "$line"; done <"$out/RELEASE"
for f in "${artifacts[@]}" SHA256SUMS; do
  say "  $out/$f ($(du -h "$out/$f" | cut -f1))"
done
if [ -n "$released" ] && [ -z "$tag_commit" ]; then
  say "not tagged yet: once this commit is the release, git tag -a $tag $head -m 'ipkeep $version', and list the commit in CHANGELOG.md"
fi
