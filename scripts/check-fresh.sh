#!/usr/bin/env bash
# Proves the README's first commands on this machine as if it were fresh: removes what the install
# steps install, then runs `make demo` and `make test` in a clean clone of HEAD (CI=true), and says
# how long each took and what each install step installed. Run it (as root, on Debian) before
# resolving any change to an install step or a dependency (docs/testing.md).
#
#   scripts/check-fresh.sh [--cold-go] [--dry-run]     (make check-fresh ARGS="...")
#
#   1. Purges the Debian packages of scripts/debian-packages.sh and of the arm64 cross toolchain
#      (scripts/arm64-toolchain.sh; then the arm64 architecture too) that are installed, and the
#      packages installed only for them, but never one the system needs: it keeps every package
#      that is Essential or of priority required, important or standard (every standard Debian
#      installation has them), and every package another installed package depends on. It refuses
#      to go on when apt would take anything else with them.
#   2. Removes the project's .venv. Keeps the cache of the Go-built binaries (~/.cache/ipkeep,
#      $IPKEEP_CACHE_DIR) and Go's own caches, unless --cold-go: then they go too, and the first
#      build is the full cold one (its figures: docs/testing.md).
#   3. Clones HEAD into a temporary directory (uncommitted changes are not part of the check) and
#      runs `make demo`, then `make test` there, each logged to a file it names. Every Rust build
#      there is cold (the clone's own target/; CARGO_TARGET_DIR is unset).
#
# --dry-run says what it would remove and keep, and changes nothing.
# Exits non-zero when either make fails; the clone is kept then, and removed after a success.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/debian-packages.sh
. scripts/debian-packages.sh
# shellcheck source=scripts/arm64-toolchain.sh
. scripts/arm64-toolchain.sh
# make test installs the arm64 cross toolchain too (make arm64-deps): its packages are removed alike.
DEBIAN_PACKAGES+=("${ARM64_DEBIAN_PACKAGES[@]}")
STEPS=(deps packaging-deps docker-deps arm64-deps)

say() { echo "check-fresh: $*" >&2; }
die() { echo "check-fresh: error: $*" >&2; exit 1; }

cold_go=
dry_run=
for arg in "$@"; do
  case $arg in
    --cold-go) cold_go=1 ;;
    --dry-run) dry_run=1 ;;
    *) die "unknown argument $arg (usage: $0 [--cold-go] [--dry-run])" ;;
  esac
done
[ "$(id -u)" -eq 0 ] || die "run it as root: it removes Debian packages, and make demo and make test need root"
if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg-query >/dev/null 2>&1; then
  die "apt-get and dpkg-query are missing: the install steps are for Debian"
fi
command -v git >/dev/null 2>&1 || die "git is missing"
repo=$PWD
commit=$(git rev-parse HEAD)

# ----- 1. the packages -----

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -x 'install ok installed' >/dev/null; }
# removed_by APT-GET-ARGS...: the packages `apt-get -s ARGS` would remove, one a line, a foreign
# architecture's with its qualifier (libffi8:arm64 is not the machine's libffi8).
removed_by() {
  LC_ALL=C apt-get -s "$@" 2>/dev/null | sed -n -E 's/^(Purg|Remv) ([^ ]+).*/\2/p' | sort -u
}
in_list() { local x=$1; shift; local y; for y in "$@"; do [ "$x" = "$y" ] && return 0; done; return 1; }

mapfile -t listed < <(debian_packages "${STEPS[@]}")
remove=()
kept=()
for pkg in "${listed[@]}"; do
  installed "$pkg" || continue
  fields=$(dpkg-query -W -f='${Essential} ${Priority}' "$pkg")
  case " $fields " in
    *" yes "*) kept+=("$pkg (Essential)"); continue ;;
    *" required "* | *" important "* | *" standard "*)
      kept+=("$pkg (priority ${fields#* }: part of every standard Debian installation)"); continue ;;
  esac
  remove+=("$pkg")
done
# Keep what another installed package needs. apt removes with a package whatever depends on it and
# (--autoremove) what was installed automatically only for it; a package installed by hand among
# those means that some package of the set is needed: keep that one, and look again.
mapfile -t orphans_before < <(removed_by autoremove)
mapfile -t auto < <(apt-mark showauto)
purge=()
while [ ${#remove[@]} -gt 0 ]; do
  purge=()
  needed=()
  while read -r p; do
    [ -n "$p" ] || continue
    if in_list "$p" "${remove[@]}"; then purge+=("$p"); continue; fi
    in_list "$p" "${orphans_before[@]}" && continue
    if in_list "$p" "${auto[@]}"; then purge+=("$p"); else needed+=("$p"); fi
  done < <(removed_by purge --autoremove "${remove[@]}")
  [ ${#needed[@]} -gt 0 ] || break
  next=()
  for pkg in "${remove[@]}"; do
    hits=()
    while read -r p; do
      [ -n "$p" ] && in_list "$p" "${needed[@]}" && hits+=("$p")
    done < <(removed_by purge "$pkg")
    if [ ${#hits[@]} -gt 0 ]; then
      kept+=("$pkg (needed by ${hits[*]:0:4}$([ ${#hits[@]} -le 4 ] || echo ' ...'))")
    else
      next+=("$pkg")
    fi
  done
  [ ${#next[@]} -lt ${#remove[@]} ] \
    || die "apt would also remove ${needed[*]}, installed by hand, and no one package of the set explains it; nothing removed"
  remove=("${next[@]}")
done
[ ${#remove[@]} -gt 0 ] || purge=()

for k in "${kept[@]}"; do say "keeps $k"; done
if [ ${#remove[@]} -gt 0 ]; then
  say "removes ${remove[*]}"
  extra=()
  for p in "${purge[@]}"; do in_list "$p" "${remove[@]}" || extra+=("$p"); done
  [ ${#extra[@]} -eq 0 ] || say "  and what was installed only for them: ${extra[*]}"
else
  say "removes no package: none of scripts/debian-packages.sh's is installed but the ones it keeps"
fi

cache_dir=${IPKEEP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ipkeep}
go_caches=()
if [ -n "$cold_go" ] && command -v go >/dev/null 2>&1; then
  go_caches=("$(go env GOCACHE)" "$(go env GOMODCACHE)")
fi
if [ -n "$cold_go" ]; then
  say "removes the Go-built binaries' cache $cache_dir"
  [ ${#go_caches[@]} -eq 0 ] || say "removes Go's caches ${go_caches[*]}"
else
  say "keeps the Go-built binaries' cache $cache_dir (--cold-go removes it)"
fi
[ ! -e "$repo/.venv" ] || say "removes $repo/.venv"
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
  say "checks commit $commit; the work tree's uncommitted changes are not part of the check"
else
  say "checks commit $commit"
fi
if [ -n "$dry_run" ]; then
  say "dry run: nothing changed"
  exit 0
fi

if [ ${#purge[@]} -gt 0 ]; then
  DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq "${purge[@]}" >/dev/null
  mapfile -t now_missing < <(debian_packages_missing "${STEPS[@]}")
  say "removed; missing now: ${now_missing[*]:-nothing}"
fi
# The arm64 architecture goes with its last package (make arm64-deps adds it again).
if dpkg --print-foreign-architectures | grep -Fx arm64 >/dev/null \
  && [ -z "$(dpkg-query -W -f='${Architecture}\n' 2>/dev/null | grep -x arm64)" ]; then
  dpkg --remove-architecture arm64
  say "removed the arm64 architecture from dpkg"
fi
rm -rf "$repo/.venv"
if [ -n "$cold_go" ]; then
  rm -rf "$cache_dir"
  if [ ${#go_caches[@]} -gt 0 ]; then go clean -cache -modcache; fi
fi

# ----- 2. make demo, make test in a clean clone -----

work=$(mktemp -d "${TMPDIR:-/tmp}/ipkeep-check-fresh.XXXXXX")
clone=$work/ipkeep
git clone --quiet "$repo" "$clone"
git -C "$clone" checkout --quiet --detach "$commit"
say "clone: $clone; logs: $work/demo.log, $work/test.log"

# run_make GOAL: runs make GOAL in the clone, logged; sets status_GOAL and secs_GOAL.
run_make() {
  local goal=$1 log=$work/$1.log start status=0
  say "make $goal ... (follow it: tail -f $log)"
  start=$(date +%s)
  (cd "$clone" && env -u CARGO_TARGET_DIR CI=true make "$goal") >"$log" 2>&1 || status=$?
  printf -v "status_$goal" '%s' "$status"
  printf -v "secs_$goal" '%s' "$(( $(date +%s) - start ))"
}

# report GOAL: its result, what its install steps installed and how long its builds took.
report() {
  local goal=$1 log=$work/$1.log status secs
  local installs='^install-[a-z0-9-]+: installing '
  local builds='^[a-z0-9-]+: (done in [0-9]+s|  [a-z-]+ built in [0-9]+s|built .* in [0-9]+s)'
  status=status_$goal
  secs=secs_$goal
  if [ "${!status}" -eq 0 ]; then
    say "make $goal: passed in ${!secs}s"
  else
    say "make $goal: FAILED (exit ${!status}) after ${!secs}s; the end of $log:"
    tail -n 15 "$log" | indent
  fi
  if grep -E "$installs" "$log" >/dev/null; then
    say "  installed:"
    grep -E "$installs" "$log" | indent
  else
    say "  installed: nothing"
  fi
  if grep -E "$builds" "$log" >/dev/null; then
    say "  build steps:"
    grep -E "$builds" "$log" | indent
  fi
}
indent() { sed 's/^/    /' >&2; }

run_make demo
run_make test
report demo
report test
# shellcheck disable=SC2154 # status_demo and status_test are set by run_make
if [ "$status_demo" -eq 0 ] && [ "$status_test" -eq 0 ]; then
  rm -rf "$clone"
  say "passed; logs kept in $work"
  exit 0
fi
say "failed; the clone is kept in $clone, the logs in $work"
exit 1
