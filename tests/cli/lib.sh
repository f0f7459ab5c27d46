# Shared by the tests/cli/test_*.sh scripts (sourced, not a test itself):
#   source "$(dirname "$0")/lib.sh" NAME "$@"
# sets KILN (the binary: $1 or $KILN) and T (a fresh temporary directory, removed on exit), counts checks
# with ok/bad, and `finish` prints the "N passed, N failed" line and sets the exit status.
set -u
KILN=${2:-${KILN:?}}
T=$(mktemp -d "/tmp/kiln_${1}_XXXXXX")
trap 'rm -rf "$T"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }

# expect_error EXIT_CODE PATTERN -- ARGS...: kiln exits with EXIT_CODE and prints exactly one line on stderr,
# starting with "error: " and containing PATTERN.
expect_error() {
  local code=$1 pat=$2
  shift 3
  "$KILN" "$@" >"$T/out" 2>"$T/err"
  local rc=$?
  if [ "$rc" -ne "$code" ]; then bad "kiln $* exited $rc, expected $code ($(cat "$T/err"))"; return; fi
  if [ "$(wc -l <"$T/err")" -ne 1 ]; then bad "kiln $* printed $(wc -l <"$T/err") lines on stderr, expected 1"; return; fi
  if ! grep -q -- "$pat" "$T/err"; then bad "kiln $*: '$pat' not in: $(cat "$T/err")"; return; fi
  if ! grep -q '^error: ' "$T/err"; then bad "kiln $*: message does not start with 'error: '"; return; fi
  ok
}

finish() {
  echo "$pass passed, $fail failed"
  [ "$fail" -eq 0 ]
}
