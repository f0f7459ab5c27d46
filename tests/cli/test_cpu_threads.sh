#!/usr/bin/env bash
# kiln's OpenMP threads spin briefly (1,000 polls) between parallel regions and then sleep, unless the user
# chose otherwise: threads that spin long take the cores other programs need, and a CPU run beside two busy
# processes ran 3-10x slower (docs/cpu_threads.md). libgomp reads its settings as it is loaded, so kiln sets
# GOMP_SPINCOUNT and starts itself again; libgomp's own report (OMP_DISPLAY_ENV=verbose, printed as it is loaded) shows the
# spin count the program runs with, in its last block.
source "$(dirname "$0")/lib.sh" cpu_threads "$@"

clean() { env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT OMP_DISPLAY_ENV=verbose "$@"; }
spin() { grep -o "GOMP_SPINCOUNT = '[0-9]*'" "$1" | tail -1 | grep -o '[0-9]*'; }

clean "$KILN" --version >"$T/out" 2>"$T/err" || bad "kiln --version: exit $?: $(cat "$T/err")"
if ! grep -q "GOMP_SPINCOUNT" "$T/err"; then
  echo "SKIP: the OpenMP runtime is not libgomp (no GOMP_SPINCOUNT in its OMP_DISPLAY_ENV report)"
  exit 77
fi
[ "$(spin "$T/err")" = 1000 ] && ok || bad "threads spin by default: GOMP_SPINCOUNT '$(spin "$T/err")', expected 1000"
[ "$(grep -c '^kiln ' "$T/out")" -eq 1 ] && ok || bad "kiln --version printed: $(cat "$T/out")"

# the arguments reach the restarted program: a short run trains, with the short spin
clean "$KILN" train --out="$T/run" --max-steps=2 --quiet >"$T/out" 2>"$T/err" && ok ||
  bad "kiln train: exit $?: $(tail -3 "$T/err")"
[ "$(spin "$T/err")" = 1000 ] && ok || bad "kiln train's threads spin: GOMP_SPINCOUNT '$(spin "$T/err")', expected 1000"
[ -s "$T/run/metrics.jsonl" ] && ok || bad "the restarted kiln train wrote no metrics"

# the user's own choice is kept, and then kiln does not restart (libgomp reports once)
clean OMP_WAIT_POLICY=active "$KILN" --version >/dev/null 2>"$T/err" || bad "OMP_WAIT_POLICY=active: exit $?"
[ "$(spin "$T/err")" != 1000 ] && ok || bad "OMP_WAIT_POLICY=active was overridden"
clean OMP_WAIT_POLICY=passive "$KILN" --version >/dev/null 2>"$T/err" || bad "OMP_WAIT_POLICY=passive: exit $?"
[ "$(spin "$T/err")" = 0 ] && ok || bad "OMP_WAIT_POLICY=passive became GOMP_SPINCOUNT '$(spin "$T/err")'"
[ "$(grep -c 'OPENMP DISPLAY ENVIRONMENT BEGIN' "$T/err")" -eq 1 ] && ok || bad "kiln restarted with OMP_WAIT_POLICY set"
clean GOMP_SPINCOUNT=1234 "$KILN" --version >/dev/null 2>"$T/err" || bad "GOMP_SPINCOUNT=1234: exit $?"
[ "$(spin "$T/err")" = 1234 ] && ok || bad "GOMP_SPINCOUNT=1234 became '$(spin "$T/err")'"
finish
