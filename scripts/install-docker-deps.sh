#!/usr/bin/env bash
# Installs what the Docker driver's tests and bench need on a Debian machine (make docker-deps):
# the packages of the `docker-deps` step in scripts/debian-packages.sh (docker.io, whose service is
# never started: the tests run their own dockerd; docker-compose; busybox-static; file).
# Safe to re-run: it installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/debian-packages.sh
. scripts/debian-packages.sh

debian_install install-docker-deps docker-deps
