#!/usr/bin/env bash
# Installs what ipkeep's tests need on a Debian machine; safe to re-run.
set -euo pipefail

need_pkgs=()
[ -x /usr/lib/cni/host-local ] && [ -x /usr/lib/cni/bridge ] || need_pkgs+=(containernetworking-plugins)
command -v ip >/dev/null 2>&1 || need_pkgs+=(iproute2)

if [ ${#need_pkgs[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: missing Debian packages: ${need_pkgs[*]}; run as root or: sudo apt-get install ${need_pkgs[*]}" >&2
    exit 1
  fi
  echo "install-deps: installing ${need_pkgs[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi
