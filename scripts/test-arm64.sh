#!/usr/bin/env bash
# Tests the arm64 build on this x86_64 machine under qemu-user:
#
#   scripts/test-arm64.sh OUT_DIR
#
# builds the shipped arm64 binaries into OUT_DIR (scripts/build-arm64.sh), then runs, each test
# binary cross-compiled for aarch64 and run under qemu-aarch64 (cargo's runner):
#   - the plugin's black-box suites (blackbox, blackbox_private_state, blackbox_reservation)
#     against OUT_DIR/ipkeep, the static release binary that ships, as make test runs them against
#     the amd64 one (IPKEEP_TEST_BIN);
#   - the operator's unit tests (ipkeep-operator --lib).
#
# The suites exec the plugin, and the kernel cannot exec an aarch64 file without a binfmt_misc
# handler, which this container has none of (binfmt_misc is not even mounted) and should not
# register (the table is the host kernel's). So IPKEEP_TEST_BIN is OUT_DIR/ipkeep-under-qemu, a
# one-command script that execs
# qemu-aarch64 on OUT_DIR/ipkeep with the same arguments and environment, in the same process. The
# other programs the suites exec (mkfifo, touch, ...) are the machine's own and run natively: a
# process under qemu-user that calls execve gets the kernel's execve.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/arm64-toolchain.sh
. scripts/arm64-toolchain.sh

[ $# -eq 1 ] || { echo "test-arm64: usage: $0 OUT_DIR" >&2; exit 2; }
out=$1

scripts/build-arm64.sh "$out"
out=$(cd "$out" && pwd)
arm64_cargo_env

plugin_under_qemu=$out/ipkeep-under-qemu
printf '#!/bin/sh\n# %s\nexec %s %s "$@"\n' \
  "The arm64 plugin under qemu-user, for its tests on an x86_64 machine (scripts/test-arm64.sh)." \
  "$ARM64_QEMU" "$out/ipkeep" >"$plugin_under_qemu"
chmod 755 "$plugin_under_qemu"
# The wrapper must really run the arm64 binary: a CNI VERSION call answers from it.
version_reply=$(env -i CNI_COMMAND=VERSION "$plugin_under_qemu" <<<'{"cniVersion":"1.0.0"}') || {
  echo "test-arm64: error: $plugin_under_qemu does not answer CNI VERSION" >&2
  exit 1
}
echo "test-arm64: the arm64 plugin under qemu answers VERSION: $version_reply" >&2

# The tests qemu-user cannot run, by suite. In each the plugin hands out an address and clears the
# host's neighbour entries for it over NETLINK_ROUTE, and qemu-user translates only the LINK, ADDR
# and ROUTE netlink messages (linux-user/fd-trans.c, target_to_host_data_route; so in Debian's
# qemu 7.2): RTM_GETNEIGH fails with EOPNOTSUPP, the plugin warns on stderr as it must, and the
# test, which wants stderr empty, fails. They are not run here and are never counted as passed (the
# summary names them); on an arm64 kernel they run as on amd64.
declare -A not_under_qemu=(
  [blackbox]=""
  [blackbox_private_state]="a_killed_writers_temporaries_are_removed_once_a_few_seconds_old"
  [blackbox_reservation]="an_expired_reservation_holds_nothing another_pod_never_gets_a_reserved_address
    reservations_of_others_leave_stderr_empty reservations_of_unusable_addresses_name_the_reason
    returning_pod_gets_its_dual_stack_addresses_back"
)
plugin_suites=(blackbox blackbox_private_state blackbox_reservation)
test_args=()
for suite in "${plugin_suites[@]}"; do test_args+=(--test "$suite"); done

scripts/step.sh test-arm64 "the plugin's black-box suites and the operator's unit tests for $ARM64_TRIPLE (build)" \
  bash -c '"$0" test -q --locked --no-run --target "$1" -p ipkeep-plugin "${@:2}" \
    && "$0" test -q --locked --no-run --target "$1" -p ipkeep-operator --lib' \
  "$ARM64_CARGO" "$ARM64_TRIPLE" "${test_args[@]}"

# Every suite runs, whatever the one before did; the summary adds up their `test result:` lines.
logs=$out/test-logs
rm -rf "$logs"
mkdir -p "$logs"
failed_suites=()
skipped=()
for suite in "${plugin_suites[@]}"; do
  skip_args=()
  for name in ${not_under_qemu[$suite]}; do
    skip_args+=(--skip "$name")
    skipped+=("$suite::$name")
  done
  IPKEEP_TEST_BIN=$plugin_under_qemu scripts/step.sh test-arm64 "$suite against $out/ipkeep, under qemu" \
    "$ARM64_CARGO" test -q --locked --target "$ARM64_TRIPLE" -p ipkeep-plugin --test "$suite" \
    -- --exact "${skip_args[@]}" 2>&1 | tee "$logs/$suite.log" || failed_suites+=("$suite")
done
scripts/step.sh test-arm64 "ipkeep-operator --lib, under qemu" \
  "$ARM64_CARGO" test -q --locked --target "$ARM64_TRIPLE" -p ipkeep-operator --lib 2>&1 \
  | tee "$logs/operator-lib.log" || failed_suites+=(operator-lib)

read -r passed failed < <(cat "$logs"/*.log \
  | sed -n 's/^test result: .* \([0-9]*\) passed; \([0-9]*\) failed;.*/\1 \2/p' \
  | awk '{ p += $1; f += $2 } END { print p + 0, f + 0 }')
echo "test-arm64: ${passed} passed, ${failed} failed, ${#skipped[@]} skipped"
echo "test-arm64: not run under qemu-user (its netlink has no RTM_GETNEIGH): ${skipped[*]}" >&2
if [ ${#failed_suites[@]} -gt 0 ]; then
  echo "test-arm64: error: failed: ${failed_suites[*]} (logs in $logs)" >&2
  exit 1
fi
