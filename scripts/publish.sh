#!/usr/bin/env bash
# Publishes a release to an OCI registry as users take it: the image (make release's index for
# linux/amd64 and linux/arm64, every manifest in it) as <REGISTRY>/ipkeep:<version>, and the chart
# as the OCI artifact oci://<REGISTRY>/charts/ipkeep:<version> (helm push), so that
#   helm install ipkeep oci://<REGISTRY>/charts/ipkeep --version <version> \
#     --set image.repository=<REGISTRY>/ipkeep
# installs it. It says the index digest and each platform's manifest digest and image size, as
# the registry serves them.
#
#   scripts/publish.sh REGISTRY [--image ARCHIVE] [--chart TGZ|DIR] [--ca-file FILE]
#
#   REGISTRY         host[:port] of the registry (no scheme: HTTPS only)
#   --image ARCHIVE  an OCI archive named ipkeep:<version> (default: make release's
#                    target/release-artifacts/ipkeep-<workspace version>.oci.tar); an image index
#                    is pushed with all its manifests, a single image as it is (a release before
#                    0.2.0: scripts/build-previous-release.sh --print-dir holds its ipkeep.oci.tar)
#   --chart TGZ|DIR  the chart: a package, or a chart directory packaged first (default:
#                    target/release-artifacts/ipkeep-<workspace version>.tgz); its version must
#                    be the image's
#   --ca-file FILE   the CA (PEM) the registry's certificate chains to, when the system does not
#                    trust it (a private CA)
#
# The logins are the user's own, made once beforehand:
#   buildah login REGISTRY          (the containers auth file skopeo reads: $REGISTRY_AUTH_FILE,
#                                    else ${XDG_RUNTIME_DIR}/containers/auth.json)
#   helm registry login REGISTRY    (Helm's registry configuration: $HELM_REGISTRY_CONFIG, else
#                                    ~/.config/helm/registry/config.json)
# (each takes --cert-dir DIR / --ca-file FILE for a private CA). The image is copied by skopeo
# (copy --all --preserve-digests: the digests make release printed are the registry's), helm is
# $HELM, else the one make cluster-bins builds.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "publish: $*" >&2; }
die() { echo "publish: error: $*" >&2; exit 1; }
usage="usage: $0 REGISTRY [--image ARCHIVE] [--chart TGZ|DIR] [--ca-file FILE]"

[ $# -ge 1 ] || die "$usage"
registry=$1
shift
case $registry in
  ""|*/*|-*) die "REGISTRY is host[:port], without a scheme or a path (got '$registry'); $usage" ;;
esac
version=$(sed -n '/^\[workspace\.package\]/,/^\[/ s/^version = "\(.*\)"$/\1/p' Cargo.toml)
image=target/release-artifacts/ipkeep-$version.oci.tar
chart=target/release-artifacts/ipkeep-$version.tgz
ca_file=
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || die "$1 needs a value; $usage"
  case $1 in
    --image) image=$2 ;;
    --chart) chart=$2 ;;
    --ca-file) ca_file=$2 ;;
    *) die "unknown option $1; $usage" ;;
  esac
  shift 2
done

for tool in skopeo jq; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool is not installed: run make packaging-deps"
done
helm=${HELM:-$(e2e/cluster/build.sh --print-bin-dir)/helm}
[ -x "$helm" ] || die "$helm is not built: run make cluster-bins (or set HELM to your helm)"
[ -s "$image" ] || die "$image is missing: run make release (or name an archive with --image)"
[ -e "$chart" ] || die "$chart is missing: run make release (or name a chart with --chart)"
if [ -n "$ca_file" ]; then
  [ -s "$ca_file" ] || die "the CA file $ca_file is missing or empty"
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# skopeo trusts the CA certificates (*.crt) of a directory; helm takes the file.
copy_tls=()
tls=()
helm_tls=()
if [ -n "$ca_file" ]; then
  mkdir "$work/certs"
  cp "$ca_file" "$work/certs/ca.crt"
  copy_tls=(--dest-cert-dir "$work/certs")
  tls=(--cert-dir "$work/certs")
  helm_tls=(--ca-file "$ca_file")
fi

# The image's tag is the version it is named with.
ref=$(tar -xOf "$image" index.json | jq -r '[.manifests[].annotations["org.opencontainers.image.ref.name"]] | if length == 1 then .[0] else "" end') \
  || die "$image is not an OCI archive (no index.json)"
tag=${ref#ipkeep:}
if [ "$ref" != "ipkeep:$tag" ] || [ -z "$tag" ]; then
  die "$image is named '$ref', not ipkeep:<version> (one image or index, as make release and make image write it)"
fi

if [ -d "$chart" ]; then
  mkdir "$work/chart"
  HELM_CONFIG_HOME=$work/helm/config HELM_CACHE_HOME=$work/helm/cache HELM_DATA_HOME=$work/helm/data \
    "$helm" package "$chart" --destination "$work/chart" >/dev/null
  chart=$(echo "$work"/chart/*.tgz)
fi
chart_version=$(tar -xzOf "$chart" ipkeep/Chart.yaml | sed -n -E 's/^version: *"?([^" ]*)"? *$/\1/p') \
  || die "$chart is not a package of the ipkeep chart (no ipkeep/Chart.yaml)"
[ "$chart_version" = "$tag" ] || die "the chart $chart is version $chart_version, the image $image is $tag"

target=$registry/ipkeep:$tag
t0=$(date +%s)
say "pushing $image to $target"
skopeo copy --quiet --all --preserve-digests "${copy_tls[@]}" \
  "oci-archive:$image" "docker://$target" >&2 \
  || die "skopeo could not push to $registry (logged in? buildah login $registry)"
# What the registry now serves under the tag.
served() { skopeo inspect --raw "${tls[@]}" "docker://$1"; }
top=$(served "$target") || die "the registry does not serve $target after the push"
say "image $target $(printf '%s' "$top" | sha256sum | sed 's/^/sha256:/; s/ .*//')"
# size MANIFEST: its configuration and layers, in bytes.
size() { jq '.config.size + ([.layers[].size] | add)' <<<"$1"; }
case $(jq -r '.mediaType' <<<"$top") in
  application/vnd.oci.image.index.v1+json|application/vnd.docker.distribution.manifest.list.v2+json)
    while read -r platform digest; do
      say "  $platform $digest $(size "$(served "$registry/ipkeep@$digest")") bytes"
    done < <(jq -r '.manifests[] | "\(.platform.os)/\(.platform.architecture) \(.digest)"' <<<"$top")
    ;;
  *)
    config=$(skopeo inspect --config --raw "${tls[@]}" "docker://$target")
    say "  $(jq -r '"\(.os)/\(.architecture)"' <<<"$config") (a single image, no index) $(size "$top") bytes"
    ;;
esac

say "pushing the chart $chart to oci://$registry/charts"
"$helm" push "$chart" "oci://$registry/charts" "${helm_tls[@]}" 2>&1 | sed 's/^/publish:   /' >&2 \
  || die "helm could not push to $registry (logged in? helm registry login $registry)"
say "published ipkeep $tag to $registry in $(( $(date +%s) - t0 ))s: helm install ipkeep oci://$registry/charts/ipkeep --version $tag --set image.repository=$registry/ipkeep"
