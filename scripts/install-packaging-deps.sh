#!/usr/bin/env bash
# Installs what the image, the node images and the chart tests need on a Debian machine
# (make packaging-deps); safe to re-run: it installs only what is missing.
#   - the packages of the `packaging-deps` step in scripts/debian-packages.sh: buildah (the
#     FROM scratch images, offline, without a container engine, and the release's image index),
#     binutils (readelf), skopeo and jq (make publish), python3-venv;
#   - kubernetes-validate (PyPI) in the project's virtualenv .venv: validates every rendered
#     manifest against the Kubernetes API schemas.
# helm itself comes from e2e/cluster/build.sh (make cluster-bins), built from its Go module.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/debian-packages.sh
. scripts/debian-packages.sh

debian_install install-packaging-deps packaging-deps

# Pinned: the schemas it ships come with its version.
kv_version=1.37.0
if [ "$(.venv/bin/kubernetes-validate --version 2>/dev/null || true)" != "$kv_version" ]; then
  echo "install-packaging-deps: installing kubernetes-validate $kv_version into .venv" >&2
  [ -x .venv/bin/pip ] || python3 -m venv .venv
  .venv/bin/pip install -q "kubernetes-validate==$kv_version" >&2
fi
