#!/usr/bin/env bash
# Installs what ipkeep's tests, benches, real nodes and demo need on a Debian machine (make deps):
# the packages of the `deps` step in scripts/debian-packages.sh, which says what each is for.
# Safe to re-run: it installs only what is missing.
# kubectl is not installed here: `make cluster-bins` builds it with the control plane, at the
# API server's version.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/debian-packages.sh
. scripts/debian-packages.sh

debian_install install-deps deps
