#!/usr/bin/env bash
# Installs what the chart and image tests need on a Debian machine; safe to re-run.
#   - buildah (Debian package): builds the FROM scratch image offline, without a container engine;
#   - binutils (readelf): checks the image's binaries are static;
#   - kubernetes-validate (PyPI) in the project's virtualenv .venv: validates every rendered
#     manifest against the Kubernetes API schemas.
# helm itself comes from e2e/cluster/build.sh (make cluster-bins), built from its Go module.
set -euo pipefail
cd "$(dirname "$0")/.."

need_pkgs=()
command -v buildah >/dev/null 2>&1 || need_pkgs+=(buildah)
command -v readelf >/dev/null 2>&1 || need_pkgs+=(binutils)
command -v setpriv >/dev/null 2>&1 || need_pkgs+=(util-linux)
python3 -c 'import ensurepip' >/dev/null 2>&1 || need_pkgs+=(python3-venv)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-packaging-deps: need root to install ${need_pkgs[*]}; run as root or install them yourself" >&2
    exit 1
  fi
  echo "install-packaging-deps: installing ${need_pkgs[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

# Pinned: the schemas it ships come with its version.
kv_version=1.37.0
if [ "$(.venv/bin/kubernetes-validate --version 2>/dev/null || true)" != "$kv_version" ]; then
  echo "install-packaging-deps: installing kubernetes-validate into .venv" >&2
  [ -x .venv/bin/pip ] || python3 -m venv .venv
  .venv/bin/pip install -q "kubernetes-validate==$kv_version" >&2
fi
