#!/usr/bin/env bash
# Installs what the Docker driver's tests need on a Debian machine; safe to re-run.
#   - docker.io: a real dockerd (and containerd, runc) that the tests start by hand with their own
#     data root, exec root and socket; the package's own service is never used.
#   - docker-compose: Compose v1 (`docker-compose up / down`) against that dockerd.
#   - busybox-static: the one static binary the tests' image is made of (`docker import`, no registry).
set -euo pipefail

need_pkgs=()
[ -x /usr/sbin/dockerd ] && [ -x /usr/bin/docker ] || need_pkgs+=(docker.io)
command -v docker-compose >/dev/null 2>&1 || need_pkgs+=(docker-compose)
[ -x /bin/busybox ] && file -L /bin/busybox 2>/dev/null | grep 'statically linked' >/dev/null || need_pkgs+=(busybox-static)
command -v file >/dev/null 2>&1 || need_pkgs+=(file)
if [ ${#need_pkgs[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-docker-deps: need root to install ${need_pkgs[*]}; run as root or install them yourself" >&2
  exit 1
fi
echo "install-docker-deps: installing ${need_pkgs[*]}" >&2
apt-get update -qq
# The package's service must not start on this machine: the tests run their own dockerd.
policy=/usr/sbin/policy-rc.d
created_policy=
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && created_policy=1
fi
trap '[ -z "$created_policy" ] || rm -f "$policy"' EXIT
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
