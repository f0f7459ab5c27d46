#!/usr/bin/env bash
# `make test-fast` is the short loop: it runs ctest without the tests labelled slow, and that label is on some
# tests (those of KILN_SLOW_TESTS in CMakeLists.txt), so the loop really leaves them out, and no other
# test of the suite; `make test` runs them all.
source "$(dirname "$0")/lib.sh" ctest_labels "$@"
SRC=${KILN_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
B=$(cd "$(dirname "$KILN")" && pwd)
if [ ! -f "$B/CTestTestfile.cmake" ] || ! command -v ctest >/dev/null; then
  echo "SKIP: $B is not a build directory with ctest's files"
  exit 77
fi
names() { (cd "$B" && ctest -N "$@") | sed -n 's/^ *Test *#[0-9]*: \([A-Za-z0-9_]*\).*/\1/p' | sort; }
all=$(names)
slow=$(names -L slow)
fast=$(names -LE slow)
[ "$(echo "$all" | grep -c .)" -ge 20 ] && ok || bad "ctest -N lists only: $all"
[ "$(echo "$slow" | grep -c .)" -ge 3 ] && ok || bad "fewer than 3 tests are labelled slow: '$slow'"
# the fast loop and the slow tests split the suite: nothing in both, nothing in neither
[ -z "$(comm -12 <(echo "$fast") <(echo "$slow"))" ] && ok || bad "in both: $(comm -12 <(echo "$fast") <(echo "$slow"))"
[ "$(sort <(echo "$fast") <(echo "$slow") | grep .)" = "$(echo "$all" | grep .)" ] && ok ||
  bad "the fast and slow tests are not the whole suite"
# what CMakeLists.txt names slow is what ctest selects as slow
listed=$(sed -n '/^set(KILN_SLOW_TESTS/,/)/p' "$SRC/CMakeLists.txt" | grep -o 'test_[A-Za-z0-9_]*' | sort)
for t in $listed; do
  echo "$slow" | grep -qx "$t" && ok || bad "$t is in KILN_SLOW_TESTS but not labelled slow"
done
# and make test-fast leaves out that label, where make test runs everything
fastcmd=$(make -s -n -C "$SRC" test-fast 2>/dev/null | grep 'ctest')
testcmd=$(make -s -n -C "$SRC" test 2>/dev/null | grep 'ctest')
[[ $fastcmd == *"-LE slow"* ]] && ok || bad "make test-fast does not leave out the slow label: '$fastcmd'"
[ -n "$testcmd" ] && [[ $testcmd != *"-L"* ]] && ok || bad "make test does not run every test: '$testcmd'"
finish
