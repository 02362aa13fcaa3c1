#!/usr/bin/env bash
# Usage: scripts/torture-mutant.sh MUTANT [SEED] [DURATION]
#   (IPKEEP_MUTANT_TORTURE_ARGS: more arguments for the run, e.g. "--without WipeNetworkDir")
#
# Shows the torture run's oracle catching a deliberately broken build (docs/testing.md, "The
# torture run"): applies e2e/torture-mutants/MUTANT.patch to a scratch copy of this tree, builds
# that copy's image, runs `ipkeep-e2e torture` (this tree's, with the mutant's image installed)
# and passes only when the run reports a violation of the promise the patch's `# breaks: N` line
# names. An oracle that passes a broken build is the defect this looks for.
#
# Run by `make torture-mutants` (which exports what the real nodes need); needs root. The
# mutants' builds share one cargo cache outside the work tree, so each after the first is
# incremental. The scratch copy is removed when the script ends, also on failure.
set -euo pipefail

mutant=${1:?usage: scripts/torture-mutant.sh MUTANT [SEED] [DURATION]}
duration=${3:-4m}
root=$(git rev-parse --show-toplevel)
patch=$root/e2e/torture-mutants/$mutant.patch
[ -f "$patch" ] || { echo "torture-mutant: no $patch" >&2; exit 2; }
promise=$(sed -n 's/^# breaks: \([1-5]\)$/\1/p' "$patch")
[ -n "$promise" ] || { echo "torture-mutant: $patch has no '# breaks: N' line" >&2; exit 2; }
# The seed given (empty: none), else the patch's own `# seed: N` (a schedule that reaches what it
# breaks), else 1, the seed of make test's run.
own_seed=$(sed -n 's/^# seed: \([0-9][0-9]*\)$/\1/p' "$patch")
seed=${2:-${own_seed:-1}}

scratch=$(mktemp -d /tmp/ipkeep-mutant-XXXXXX)
trap 'git -C "$root" worktree remove --force "$scratch/tree" >/dev/null 2>&1 || true; rm -rf "$scratch"' EXIT
git -C "$root" worktree add --detach "$scratch/tree" HEAD >/dev/null
git -C "$scratch/tree" apply "$patch"
echo "torture-mutant: $mutant applied; it breaks promise $promise; seed $seed, $duration" >&2

key=$(rustc -V | sha256sum | cut -c1-12)
export CARGO_TARGET_DIR=${IPKEEP_MUTANT_CACHE:-$HOME/.cache/ipkeep/target-mutants-$key}
make -C "$scratch/tree" -s image IMAGE_ARCHIVE="$scratch/mutant.oci.tar" >&2
unset CARGO_TARGET_DIR

report=$scratch/report.txt
# Split on spaces on purpose: a list of arguments.
read -r -a extra <<< "${IPKEEP_MUTANT_TORTURE_ARGS:-}"
status=0
IPKEEP_IMAGE_ARCHIVE=$scratch/mutant.oci.tar \
  "${IPKEEP_E2E_BIN:?the torture binary (make torture-mutants sets it)}" torture \
  --seed "$seed" --duration "$duration" --report "$report" "${extra[@]}" \
  >/dev/null || status=$?
cat "$report" >&2 || true
if [ "$status" -eq 1 ] && grep -q "^  \[$promise\] " "$report"; then
  echo "torture-mutant: $mutant caught: promise $promise broken, as the patch says" >&2
  exit 0
fi
echo "torture-mutant: $mutant NOT caught (exit $status, no violation of promise $promise)" >&2
exit 1
