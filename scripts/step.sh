#!/usr/bin/env bash
# Runs one step of a make target and says on stderr when it starts and how long it took, so that a
# long first build (a cold static release build takes minutes on two cores) shows where it is:
#
#   scripts/step.sh TARGET WHAT COMMAND [ARG...]
#
# prints "TARGET: WHAT ...", runs COMMAND, then "TARGET: done in Ns" (or "failed after Ns") and
# exits with COMMAND's status.
set -euo pipefail

[ $# -ge 3 ] || { echo "step: usage: $0 TARGET WHAT COMMAND [ARG...]" >&2; exit 2; }
target=$1
what=$2
shift 2
start=$(date +%s)
echo "$target: $what ..." >&2
status=0
"$@" || status=$?
secs=$(( $(date +%s) - start ))
if [ "$status" -eq 0 ]; then
  echo "$target: done in ${secs}s" >&2
else
  echo "$target: failed after ${secs}s (exit $status)" >&2
fi
exit "$status"
