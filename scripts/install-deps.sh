#!/usr/bin/env bash
# Installs what ipkeep's tests need on a Debian machine; safe to re-run.
#   - Debian packages: containernetworking-plugins (the reference host-local and bridge plugins),
#     iproute2 (`ip netns`), time (GNU time, for the benchmark's peak memory), prometheus
#     (`promtool check metrics` on the controller's /metrics), runc, iptables and busybox-static
#     (the real test nodes).
# kubectl is not installed here: `make cluster-bins` builds it with the control plane, at the
# API server's version.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: need root to install $*; run as root or install it yourself" >&2
    exit 1
  fi
}

apt_updated=
apt_install() {
  as_root "$@"
  if [ -z "$apt_updated" ]; then apt-get update -qq; apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

need_pkgs=()
{ [ -x /usr/lib/cni/host-local ] && [ -x /usr/lib/cni/bridge ]; } || need_pkgs+=(containernetworking-plugins)
command -v ip >/dev/null 2>&1 || need_pkgs+=(iproute2)
[ -x /usr/bin/time ] || need_pkgs+=(time)   # GNU time: peak RSS in `make bench`
command -v setpriv >/dev/null 2>&1 || need_pkgs+=(util-linux)   # setpriv: control plane processes die with their owner
command -v promtool >/dev/null 2>&1 || need_pkgs+=(prometheus)   # promtool checks the controller's /metrics
# The real test nodes (docs/real-nodes.md): runc under our containerd 2 (never Debian's containerd,
# whose 1.6 is below what Kubernetes 1.34 supports), kube-proxy's iptables, the busybox of the
# workload image (static, with httpd/wget/nc), nsenter/unshare.
[ -x /usr/sbin/runc ] || need_pkgs+=(runc)
[ -x /usr/sbin/iptables ] || need_pkgs+=(iptables)
dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep 'ok installed' >/dev/null || need_pkgs+=(busybox-static)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "install-deps: installing ${need_pkgs[*]}" >&2
  apt_install "${need_pkgs[@]}"
fi
