# shellcheck shell=bash
# The Debian packages ipkeep's make targets install, each named once: the install steps that need
# it, the package, and a shell test that holds when what the project uses of it is already there.
# Sourced by the three install scripts (each installs the missing packages of its step) and by
# scripts/check-fresh.sh (which removes them again, to prove the steps on a machine without them).
#
#   deps            scripts/install-deps.sh            the tests, the benches, the real nodes, the demo
#   packaging-deps  scripts/install-packaging-deps.sh  the image, the node images, the chart tests
#   docker-deps     scripts/install-docker-deps.sh     the Docker driver's tests and bench
#
# Not here, because Debian 12 has no package at a version that works or because nothing builds
# without them: Rust 1.89 or later with its C toolchain (gcc and libc6-dev: the static builds
# link libc.a), Go 1.26 or later (e2e/cluster/build.sh says so when it is missing), make and git.
# Nor what every Debian system has (Essential or priority required): coreutils, tar, mount,
# e2fsprogs (chattr), dash, grep, sed, mawk.

# STEPS|PACKAGE|TEST
DEBIAN_PACKAGES=(
  # The reference host-local (differential suite, make bench) and bridge (chain suites, real nodes).
  'deps|containernetworking-plugins|[ -x /usr/lib/cni/host-local ] && [ -x /usr/lib/cni/bridge ]'
  # ip netns, and the real nodes' links and routes.
  'deps|iproute2|command -v ip'
  # GNU time: the peak memory figures of make bench.
  'deps|time|[ -x /usr/bin/time ]'
  # The controller bench's plot (scripts/plot_controller.py, run with the system's python3, not
  # the .venv) and the test that draws docs/controller-bench.csv with it.
  'deps|python3-matplotlib|/usr/bin/python3 -c "import matplotlib"'
  # setpriv (every control plane process dies with its owner), nsenter and unshare (real nodes).
  'deps|util-linux|command -v setpriv && command -v nsenter && command -v unshare'
  # kill(1): the tests signal the processes they start (they exec it: bash's builtin is no help).
  'deps|procps|[ -x /bin/kill ] || [ -x /usr/bin/kill ]'
  # modprobe overlay, when the real nodes' overlay filesystem is a module not loaded yet.
  'deps|kmod|[ -x /sbin/modprobe ] || [ -x /usr/sbin/modprobe ]'
  # promtool checks the controller's /metrics.
  'deps|prometheus|command -v promtool'
  # Under our containerd 2 on the real nodes (never Debian's containerd: 1.6 is too old for the
  # kubelet); kube-proxy's iptables.
  'deps|runc|[ -x /usr/sbin/runc ]'
  'deps|iptables|[ -x /usr/sbin/iptables ] && [ -x /usr/sbin/iptables-restore ]'
  # CRI-O's container monitor on the CRI-O nodes (cluster up --runtime cri-o; CRI-O itself is
  # built from its Go module by make crio-bins).
  'deps|conmon|[ -x /usr/bin/conmon ]'
  # The one static binary the real nodes' workload image (make node-bins) and the Docker tests'
  # image are made of: sh, ip, httpd, wget, nc.
  'deps,docker-deps|busybox-static|dpkg -s busybox-static 2>/dev/null | grep "^Status: install ok installed" >/dev/null'
  # Builds the FROM scratch images offline, without a container engine (make image, make node-bins).
  'packaging-deps|buildah|command -v buildah'
  # readelf: the images' and the Docker plugin's binaries must be static.
  'packaging-deps|binutils|command -v readelf'
  # make publish copies the image index, every manifest in it, to a registry (skopeo copy --all),
  # and says what the registry serves; make release and make publish read the OCI JSON with jq.
  'packaging-deps|skopeo|command -v skopeo'
  'packaging-deps|jq|command -v jq'
  # The project's .venv for kubernetes-validate (the chart tests).
  'packaging-deps|python3-venv|python3 -c "import ensurepip"'
  # A real dockerd (and its containerd, runc) the tests start by hand with their own data root,
  # exec root and socket; the package's own service is never used.
  'docker-deps|docker.io|[ -x /usr/sbin/dockerd ] && [ -x /usr/bin/docker ]'
  # Compose v1 against that dockerd.
  'docker-deps|docker-compose|command -v docker-compose'
  # The Docker tests check that /bin/busybox is static with file(1).
  'docker-deps|file|command -v file'
)

# debian_packages STEP...: the packages any of the STEPs needs, in the table's order, each once.
debian_packages() {
  local row steps want
  for row in "${DEBIAN_PACKAGES[@]}"; do
    steps=${row%%|*}
    for want in "$@"; do
      case ",$steps," in *",$want,"*) row=${row#*|}; echo "${row%%|*}"; break ;; esac
    done
  done
}

# debian_packages_missing STEP...: those of them whose test fails on this machine.
debian_packages_missing() {
  local row steps want pkg test
  for row in "${DEBIAN_PACKAGES[@]}"; do
    steps=${row%%|*}
    row=${row#*|}
    pkg=${row%%|*}
    test=${row#*|}
    for want in "$@"; do
      case ",$steps," in
        *",$want,"*)
          (eval "$test") >/dev/null 2>&1 || echo "$pkg"
          break
          ;;
      esac
    done
  done
}

# debian_install WHO STEP: installs the missing packages of STEP, as root, saying
# "WHO: installing PACKAGE..." on stderr (scripts/check-fresh.sh reports these lines).
# Recommended packages are left out and no package's service is started: the tests use the
# packages' programs and start every daemon they need themselves.
debian_install() {
  local who=$1 step=$2 missing
  mapfile -t missing < <(debian_packages_missing "$step")
  [ ${#missing[@]} -gt 0 ] || return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "$who: need root to install ${missing[*]}; run as root or install them yourself" >&2
    return 1
  fi
  # make -j runs the install steps side by side: one at a time, each re-checking after the wait.
  local lock
  exec {lock}<"${BASH_SOURCE[0]}"
  flock "$lock"
  mapfile -t missing < <(debian_packages_missing "$step")
  if [ ${#missing[@]} -eq 0 ]; then
    exec {lock}<&-
    return 0
  fi
  echo "$who: installing ${missing[*]}" >&2
  local policy=/usr/sbin/policy-rc.d created_policy=
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && created_policy=1
  fi
  local status=0
  {
    apt-get -o DPkg::Lock::Timeout=600 update -qq \
      && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
        --no-install-recommends "${missing[@]}" >/dev/null
  } || status=$?
  [ -z "$created_policy" ] || rm -f "$policy"
  exec {lock}<&-
  if [ "$status" -ne 0 ]; then
    echo "$who: error: apt-get could not install ${missing[*]} (output above)" >&2
    return "$status"
  fi
  mapfile -t missing < <(debian_packages_missing "$step")
  if [ ${#missing[@]} -gt 0 ]; then
    echo "$who: error: installed, but the check of ${missing[*]} still fails (scripts/debian-packages.sh)" >&2
    return 1
  fi
}
