#!/usr/bin/env bash
# Builds the real Kubernetes control plane used by ipkeep's tests and demo from their Go modules:
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and helm; and, with --node,
# what a real node runs: kubelet, kube-proxy, containerd, containerd-shim-runc-v2, ctr and the
# sandbox's pause program (runc and the CNI plugins come from Debian).
#
#   e2e/cluster/build.sh                        build into the cache unless already there; print its bin dir last
#   e2e/cluster/build.sh --print-bin-dir        print the bin dir the current versions build into, build nothing
#   e2e/cluster/build.sh --node                 the node binaries, the same way; print their bin dir last
#   e2e/cluster/build.sh --print-node-bin-dir   print the node bin dir, build nothing
#   e2e/cluster/build.sh --flannel              flanneld and flannel's CNI plugin (cluster up --cni flannel)
#   e2e/cluster/build.sh --print-flannel-bin-dir  print their bin dir, build nothing
#   e2e/cluster/build.sh --crio                 CRI-O, its pinns, the upstream CNI plugins and cnitool (cluster up --runtime cri-o)
#   e2e/cluster/build.sh --print-crio-bin-dir   print their bin dir, build nothing
#   e2e/cluster/build.sh --registry             the OCI registry (distribution's) and registry-htpasswd (its logins)
#   e2e/cluster/build.sh --print-registry-bin-dir  print their bin dir, build nothing
#   e2e/cluster/build.sh --etcd-tools           etcdctl and etcdutl (snapshot save and restore, as an operator backs etcd up)
#   e2e/cluster/build.sh --print-etcd-tools-bin-dir  print their bin dir, build nothing
#   e2e/cluster/build.sh --update-modules       rewrite the wrapper go.mod/go.sum files to versions.env
#
# The binaries go to $IPKEEP_CACHE_DIR (default ~/.cache/ipkeep)/k8s-<k8s>-etcd-<etcd>-helm-<helm>/bin
# (the node's to node-k8s-<k8s>-containerd-<containerd>/bin, flannel's to
# flannel-<flannel>-cni-<plugin>/bin, CRI-O's to crio-<crio>-plugins-<plugins>/bin, the
# registry's to registry-<distribution>/bin, etcdctl's and etcdutl's to etcd-tools-<etcd>/bin), outside the work tree, keyed by the
# versions in versions.env: a second run costs a second. A finished build is renamed into place
# whole, so an interrupted build never looks complete.
set -euo pipefail
# A pipe into `grep -q` fails at random under pipefail: grep exits at the first match and the
# writer dies of SIGPIPE (a cold build lost 43 minutes to "kubectl does not report v1.34.4").
# Every pipe here ends in `grep ... >/dev/null`, which reads its input to the end.
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"

cache_root=${IPKEEP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ipkeep}
key="k8s-${KUBERNETES_VERSION}-etcd-${ETCD_VERSION}-helm-${HELM_VERSION}"
out="$cache_root/$key"
bins=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl helm)
node_key="node-k8s-${KUBERNETES_VERSION}-containerd-${CONTAINERD_VERSION}"
node_out="$cache_root/$node_key"
node_bins=(kubelet kube-proxy containerd containerd-shim-runc-v2 ctr pause)
flannel_key="flannel-${FLANNEL_VERSION}-cni-${FLANNEL_CNI_VERSION}"
flannel_out="$cache_root/$flannel_key"
flannel_bins=(flanneld flannel)
crio_key="crio-${CRIO_VERSION}-plugins-${CNI_PLUGINS_VERSION}"
crio_out="$cache_root/$crio_key"
crio_bins=(crio pinns bridge host-local portmap loopback cnitool)
registry_key="registry-${REGISTRY_VERSION}"
registry_out="$cache_root/$registry_key"
registry_bins=(registry registry-htpasswd)
# Apart from the plane's etcd so that adding them did not change the plane's cache key (every
# machine would have rebuilt the whole control plane for two tools).
etcd_tools_key="etcd-tools-${ETCD_VERSION}"
etcd_tools_out="$cache_root/$etcd_tools_key"
etcd_tools_bins=(etcdctl etcdutl)

say() { echo "cluster-bins: $*" >&2; }
die() { echo "cluster-bins: error: $*" >&2; exit 1; }

# complete DIR BIN...: every binary is there.
complete() {
  local dir=$1 b; shift
  for b in "$@"; do [ -x "$dir/bin/$b" ] || return 1; done
}

staging_version() { echo "v0.${KUBERNETES_VERSION#v1.}"; }

# Every go.mod must name exactly the versions of versions.env, so that one file decides.
check_modules() {
  local sv; sv=$(staging_version)
  grep -Eq "^\s*(require )?k8s\.io/kubernetes $KUBERNETES_VERSION\b" "$here/k8s/go.mod" \
    || die "e2e/cluster/k8s/go.mod does not require k8s.io/kubernetes $KUBERNETES_VERSION (versions.env); run e2e/cluster/build.sh --update-modules"
  if grep -E '^\s+k8s\.io/[a-z-]+ => k8s\.io/[a-z-]+ v' "$here/k8s/go.mod" | grep -v " $sv\$" >/dev/null; then
    die "e2e/cluster/k8s/go.mod pins a staging module at a version other than $sv; run e2e/cluster/build.sh --update-modules"
  fi
  grep -Eq "^\s*go\.etcd\.io/etcd/server/v3 $ETCD_VERSION\b" "$here/etcd/go.mod" \
    || die "e2e/cluster/etcd/go.mod does not require go.etcd.io/etcd/server/v3 $ETCD_VERSION (versions.env); run e2e/cluster/build.sh --update-modules"
  local tool
  for tool in etcdctl etcdutl; do
    grep -Eq "^\s*go\.etcd\.io/etcd/$tool/v3 $ETCD_VERSION\b" "$here/etcd-tools/go.mod" \
      || die "e2e/cluster/etcd-tools/go.mod does not require go.etcd.io/etcd/$tool/v3 $ETCD_VERSION (versions.env); run e2e/cluster/build.sh --update-modules"
  done
  grep -Eq "^\s*helm\.sh/helm/v3 $HELM_VERSION\b" "$here/helm/go.mod" \
    || die "e2e/cluster/helm/go.mod does not require helm.sh/helm/v3 $HELM_VERSION (versions.env); run e2e/cluster/build.sh --update-modules"
  grep -Eq "^\s*github\.com/containerd/containerd/v2 $CONTAINERD_VERSION\b" "$here/containerd/go.mod" \
    || die "e2e/cluster/containerd/go.mod does not require github.com/containerd/containerd/v2 $CONTAINERD_VERSION (versions.env); run e2e/cluster/build.sh --update-modules"
  grep -Eq "^\s*github\.com/flannel-io/flannel $FLANNEL_VERSION\b" "$here/flannel/go.mod" \
    || die "e2e/cluster/flannel/go.mod does not require github.com/flannel-io/flannel $FLANNEL_VERSION (versions.env); run e2e/cluster/build.sh --update-modules"
  grep -Eq "^\s*github\.com/containernetworking/plugins $FLANNEL_CNI_VERSION\b" "$here/flannel-cni/go.mod" \
    || die "e2e/cluster/flannel-cni/go.mod does not require github.com/containernetworking/plugins $FLANNEL_CNI_VERSION (versions.env); run e2e/cluster/build.sh --update-modules"
  grep -Eq "^\s*github\.com/containernetworking/plugins $CNI_PLUGINS_VERSION\b" "$here/cni-plugins/go.mod" \
    || die "e2e/cluster/cni-plugins/go.mod does not require github.com/containernetworking/plugins $CNI_PLUGINS_VERSION (versions.env); run e2e/cluster/build.sh --update-modules"
  grep -Eq "^\s*github\.com/distribution/distribution/v3 $REGISTRY_VERSION\b" "$here/registry/go.mod" \
    || die "e2e/cluster/registry/go.mod does not require github.com/distribution/distribution/v3 $REGISTRY_VERSION (versions.env); run e2e/cluster/build.sh --update-modules"
}

need_go() {
  command -v go >/dev/null 2>&1 || die "the Go toolchain is not installed (need Go >= 1.26): install it (Debian: apt-get install golang-go, or the machine's Go) and re-run"
  local v; v=$(go env GOVERSION)
  case "$v" in go1.2[6-9]*|go1.[3-9][0-9]*) ;; *) die "Go $v is too old: Kubernetes 1.34 and etcd 3.6 here need Go >= 1.26";; esac
}

update_modules() {
  local sv; sv=$(staging_version)
  (cd "$here/k8s" && sed -i -E "s#^(\s*(require )?k8s\.io/kubernetes) v[^ ]*#\1 $KUBERNETES_VERSION#; s#^(\s+k8s\.io/[a-z-]+ => k8s\.io/[a-z-]+) v.*#\1 $sv#" go.mod \
    && go get -tool "k8s.io/kubernetes/cmd/kube-apiserver@$KUBERNETES_VERSION" && go mod tidy)
  (cd "$here/etcd" && go get -tool "go.etcd.io/etcd/server/v3@$ETCD_VERSION" && go mod tidy)
  (cd "$here/etcd-tools" && go get -tool "go.etcd.io/etcd/etcdctl/v3@$ETCD_VERSION" \
    "go.etcd.io/etcd/etcdutl/v3@$ETCD_VERSION" && go mod tidy)
  (cd "$here/helm" && go get -tool "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" && go mod tidy)
  (cd "$here/containerd" && go get -tool "github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION" \
    "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" \
    "github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD_VERSION" && go mod tidy)
  (cd "$here/flannel" && go get -tool "github.com/flannel-io/flannel@$FLANNEL_VERSION" && go mod tidy)
  (cd "$here/flannel-cni" && go get -tool "github.com/containernetworking/plugins/plugins/meta/flannel@$FLANNEL_CNI_VERSION" \
    && go get github.com/containernetworking/cni@v1.1.2 && go mod tidy -e)
  (cd "$here/cni-plugins" && go get -tool \
    "github.com/containernetworking/plugins/plugins/main/bridge@$CNI_PLUGINS_VERSION" \
    "github.com/containernetworking/plugins/plugins/ipam/host-local@$CNI_PLUGINS_VERSION" \
    "github.com/containernetworking/plugins/plugins/meta/portmap@$CNI_PLUGINS_VERSION" \
    "github.com/containernetworking/plugins/plugins/main/loopback@$CNI_PLUGINS_VERSION" \
    github.com/containernetworking/cni/cnitool && go mod tidy)
  (cd "$here/registry" && go get -tool "github.com/distribution/distribution/v3/cmd/registry@$REGISTRY_VERSION" \
    && go mod tidy)
}

# -trimpath and -buildvcs=false: the binaries depend on the sources and versions only, not on the
# checkout path or the commit of this repository the wrapper modules sit in.
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=readonly -trimpath -buildvcs=false"

mode=plane
case "${1:-}" in
  --print-bin-dir) echo "$out/bin"; exit 0 ;;
  --print-node-bin-dir) echo "$node_out/bin"; exit 0 ;;
  --print-flannel-bin-dir) echo "$flannel_out/bin"; exit 0 ;;
  --print-crio-bin-dir) echo "$crio_out/bin"; exit 0 ;;
  --print-registry-bin-dir) echo "$registry_out/bin"; exit 0 ;;
  --print-etcd-tools-bin-dir) echo "$etcd_tools_out/bin"; exit 0 ;;
  --update-modules) need_go; update_modules; check_modules; say "go.mod files follow versions.env"; exit 0 ;;
  --node) mode=node; key=$node_key; out=$node_out; bins=("${node_bins[@]}") ;;
  --flannel) mode=flannel; key=$flannel_key; out=$flannel_out; bins=("${flannel_bins[@]}") ;;
  --crio) mode=crio; key=$crio_key; out=$crio_out; bins=("${crio_bins[@]}") ;;
  --registry) mode=registry; key=$registry_key; out=$registry_out; bins=("${registry_bins[@]}") ;;
  --etcd-tools) mode=etcd-tools; key=$etcd_tools_key; out=$etcd_tools_out; bins=("${etcd_tools_bins[@]}") ;;
  "") ;;
  *) die "unknown argument $1 (see the header of $0)" ;;
esac

check_modules
if complete "$out" "${bins[@]}"; then
  say "up to date: $out/bin ($key)"
  echo "$out/bin"
  exit 0
fi
need_go

mkdir -p "$cache_root"
stage=$(mktemp -d "$cache_root/.build-$key.XXXXXX")
trap 'rm -rf "$stage"' EXIT
start=$(date +%s)
say "building $key into $out/bin (a fresh machine pays this once; later runs reuse it)"

# Version stamps, as Kubernetes' hack/lib/version.sh and Helm's Makefile set them: without them
# the binaries report v0.0.0 and Helm's kubeVersion checks see Kubernetes 1.20.
minor=${KUBERNETES_VERSION#v1.}; minor=${minor%%.*}
build_date=$(cd "$here/k8s" && go list -m -f '{{.Time}}' k8s.io/kubernetes | sed -E 's/ \+0000 UTC$//; s/ /T/; s/$/Z/')
kver=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kver+=" -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  kver+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$build_date"
done
hver="-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
  hver+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$minor"
done

step() {
  local name=$1; shift
  local t0; t0=$(date +%s)
  say "  go build $name ..."
  "$@" || die "go build of $name failed (output above); the Go module proxy must be reachable: try 'cd e2e/cluster/<module> && go mod download'"
  say "  $name built in $(( $(date +%s) - t0 ))s"
}

finish() {
  rm -rf "$out"
  mv "$stage" "$out"
  trap - EXIT
  local secs=$(( $(date +%s) - start ))
  say "built $key in ${secs}s: $(du -sh "$out/bin" | cut -f1) of binaries; Go caches now $(du -sh "$(go env GOMODCACHE)" 2>/dev/null | cut -f1) modules, $(du -sh "$(go env GOCACHE)" 2>/dev/null | cut -f1) build cache"
  echo "$out/bin"
}

if [ "$mode" = node ]; then
  (cd "$here/k8s" && for c in kubelet kube-proxy; do
    step "$c" go build -ldflags "-s -w $kver" -o "$stage/bin/$c" "k8s.io/kubernetes/cmd/$c"
  done)
  # containerd's Makefile stamps the version package the same way; the tags leave out the
  # snapshotters that need cgo or kernel pieces we do not use (the shim, as upstream, without grpc).
  cver="-X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION"
  ctags="no_btrfs no_devmapper no_zfs urfave_cli_no_docs"
  (cd "$here/containerd" && for c in containerd ctr; do
    step "$c" go build -tags "$ctags" -ldflags "-s -w $cver" -o "$stage/bin/$c" "github.com/containerd/containerd/v2/cmd/$c"
  done && step containerd-shim-runc-v2 go build -tags "$ctags no_grpc" -ldflags "-s -w $cver" \
    -o "$stage/bin/containerd-shim-runc-v2" github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2)
  (cd "$here/pause" && step pause go build -ldflags "-s -w" -o "$stage/bin/pause" .)
  "$stage/bin/kubelet" --version 2>/dev/null | grep "$KUBERNETES_VERSION" >/dev/null \
    || die "the built kubelet does not report $KUBERNETES_VERSION: the version stamps did not take"
  "$stage/bin/containerd" --version 2>/dev/null | grep "$CONTAINERD_VERSION" >/dev/null \
    || die "the built containerd does not report $CONTAINERD_VERSION: the version stamps did not take"
  finish
  exit 0
fi

if [ "$mode" = flannel ]; then
  # flannel's Makefile builds flanneld with cgo on amd64 (its UDP backend is C) and stamps the
  # version; the plugin is pure Go. Both run on this machine, so cgo's libc is the one they find.
  (cd "$here/flannel" && CGO_ENABLED=1 step flanneld go build \
    -ldflags "-s -w -X github.com/flannel-io/flannel/pkg/version.Version=$FLANNEL_VERSION" \
    -o "$stage/bin/flanneld" github.com/flannel-io/flannel)
  (cd "$here/flannel-cni" && step flannel go build -ldflags "-s -w" -o "$stage/bin/flannel" \
    github.com/containernetworking/plugins/plugins/meta/flannel)
  "$stage/bin/flanneld" --version 2>&1 | grep "$FLANNEL_VERSION" >/dev/null \
    || die "the built flanneld does not report $FLANNEL_VERSION: the version stamp did not take"
  finish
  exit 0
fi

if [ "$mode" = crio ]; then
  # CRI-O is built in its own module's directory, with its own go.sum: as a dependency of a
  # wrapper module its go.sum would have to come from the checksum database, which does not know
  # the pseudo-versions it pins (github.com/containerd/nri). The tags leave out what needs cgo
  # libraries (gpgme: openpgp in Go instead; ostree, btrfs, devicemapper) and seccomp (no
  # libseccomp without cgo: CRI-O then runs every container unconfined, and says so at start).
  crio_dir=$(go mod download -json "github.com/cri-o/cri-o@$CRIO_VERSION" | sed -n -E 's/^\s*"Dir": "(.*)",?$/\1/p')
  [ -d "$crio_dir" ] || die "could not download github.com/cri-o/cri-o@$CRIO_VERSION from the Go module proxy"
  crio_tags="containers_image_openpgp containers_image_ostree_stub exclude_graphdriver_btrfs exclude_graphdriver_devicemapper"
  (cd "$crio_dir" && step crio go build -tags "$crio_tags" -ldflags "-s -w" -o "$stage/bin/crio" ./cmd/crio)
  # pinns (C, in the same module; CRI-O pins the pods' namespaces with it), as its Makefile
  # builds it: static, so it needs glibc's libc.a (libc6-dev), which the static Rust builds need too.
  t0=$(date +%s)
  command -v gcc >/dev/null 2>&1 || die "gcc is missing (pinns is C): install gcc and libc6-dev"
  gcc -std=c99 -Os -Wall -Werror -Wextra -static -o "$stage/bin/pinns" \
    "$crio_dir/pinns/src/pinns.c" "$crio_dir/pinns/src/sysctl.c" || die "gcc could not build pinns (need gcc and libc6-dev)"
  say "  pinns built in $(( $(date +%s) - t0 ))s"
  # The upstream CNI plugins CRI-O's nodes run: Debian's (1.1.1) refuse cniVersion 1.1.0, the
  # first version libcni sends GC to, and CRI-O drops a conflist a plugin refuses.
  (cd "$here/cni-plugins" && for p in main/bridge ipam/host-local meta/portmap main/loopback; do
    step "${p#*/}" go build -ldflags "-s -w" -o "$stage/bin/${p#*/}" "github.com/containernetworking/plugins/plugins/$p"
  done
  # libcni's own command-line front end: an ADD through libcni (its result cached under
  # /var/lib/cni/results, as a runtime's is) for a sandbox no runtime knows: a leak.
  step cnitool go build -ldflags "-s -w" -o "$stage/bin/cnitool" github.com/containernetworking/cni/cnitool)
  "$stage/bin/crio" --version 2>/dev/null | grep -x "crio version ${CRIO_VERSION#v}" >/dev/null \
    || die "the built crio does not report ${CRIO_VERSION#v}"
  finish
  exit 0
fi

if [ "$mode" = registry ]; then
  # The registry's Makefile stamps its version package the same way.
  dpkg=github.com/distribution/distribution/v3
  (cd "$here/registry" && step registry go build \
    -ldflags "-s -w -X $dpkg/version.version=$REGISTRY_VERSION -X $dpkg/version.mainpkg=$dpkg" \
    -o "$stage/bin/registry" "$dpkg/cmd/registry" \
    && step registry-htpasswd go build -ldflags "-s -w" -o "$stage/bin/registry-htpasswd" ./htpasswd)
  "$stage/bin/registry" --version 2>/dev/null | grep " $REGISTRY_VERSION\$" >/dev/null \
    || die "the built registry does not report $REGISTRY_VERSION: the version stamp did not take"
  finish
  exit 0
fi

if [ "$mode" = etcd-tools ]; then
  # Stamped as the plane's etcd is; both report the etcd version they restore and save with.
  (cd "$here/etcd-tools" && for t in etcdctl etcdutl; do
    step "$t" go build -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=$ETCD_VERSION" \
      -o "$stage/bin/$t" "go.etcd.io/etcd/$t/v3"
  done)
  "$stage/bin/etcdutl" version 2>/dev/null | grep "${ETCD_VERSION#v}" >/dev/null \
    || die "the built etcdutl does not report ${ETCD_VERSION#v}"
  finish
  exit 0
fi

(cd "$here/etcd" && step etcd go build -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=$ETCD_VERSION" \
  -o "$stage/bin/etcd" go.etcd.io/etcd/server/v3)
(cd "$here/k8s" && for c in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
  step "$c" go build -ldflags "-s -w $kver" -o "$stage/bin/$c" "k8s.io/kubernetes/cmd/$c"
done)
(cd "$here/helm" && step helm go build -ldflags "-s -w $hver" -o "$stage/bin/helm" helm.sh/helm/v3/cmd/helm)

"$stage/bin/kubectl" version --client 2>/dev/null | grep "$KUBERNETES_VERSION" >/dev/null \
  || die "the built kubectl does not report $KUBERNETES_VERSION: the version stamps did not take"
finish
