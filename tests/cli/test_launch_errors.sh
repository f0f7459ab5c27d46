#!/usr/bin/env bash
# kiln launch's errors read as kiln train's: one line, exit 2, `error: <what> (<where>): <why>; <hint>`, the
# same words for the same mistakes (a bad value, an unknown option, an option without its value, a stray
# argument), naming launch as the place; and when launch gives up on a crashing run, its last line is such an
# error too.
source "$(dirname "$0")/lib.sh" launch_errors "$@"
targs=(--layers=1 --heads=2 --dim=32 --seq=32 --batch=4 --max-steps=4 --eval-every=0 --threads=1 --quiet --out="$T/run")
# styled: error: WHAT (WHERE): WHY; HINT
style='^error: [^:]+ \([^)]+\): [^;]+; .+$'

# the same mistake in train and in launch starts with the same words; launch's line is in the style and
# names launch as the place
same() {
  local words=$1 tflag=$2 lflag=$3
  expect_error 2 "^error: $words" -- train "$tflag"
  expect_error 2 "^error: $words" -- launch "$lflag" -- "${targs[@]}"
  grep -Eq "$style" "$T/err" && ok || bad "launch $lflag: not styled: $(cat "$T/err")"
  grep -q "(kiln launch --" "$T/err" && ok || bad "launch $lflag: launch not named: $(cat "$T/err")"
}
same "bad value 'x' for max-" --max-steps=x --max-restarts=x
same "unknown option 'bogus' (" --bogus=1 --bogus=1
same "unknown option 'bogus' (" --bogus --bogus
expect_error 2 "^error: bad value 'x' for max-restarts (kiln launch --max-restarts): expected a whole number" -- launch --max-restarts=x -- "${targs[@]}"
expect_error 2 "^error: unknown option 'bogus' (kiln launch --bogus): train options go after --" -- launch --bogus -- "${targs[@]}"

# every other way to get a launch option wrong: one line in the style
for a in --nproc-per-node=0 --nproc-per-node=1.5 --master-port=70000 --mode=foo --grace=-1 --master-addr= \
  --backoff=x --backoff-max=-1 --nnodes=0 --node-rank=-1 --rdzv-timeout=0 --node-rank=1 --max-restarts; do
  expect_error 2 "(kiln launch" -- launch "$a" -- "${targs[@]}"
  grep -Eq "$style" "$T/err" && ok || bad "launch $a: not styled: $(cat "$T/err")"
done
expect_error 2 "^error: option --max-restarts needs a value (kiln launch --max-restarts): write --max-restarts=VALUE" -- launch --max-restarts -- "${targs[@]}"
expect_error 2 "^error: unexpected argument 'layers' (kiln launch): train options go after --" -- launch layers -- "${targs[@]}"
grep -Eq "$style" "$T/err" && ok || bad "launch layers: not styled: $(cat "$T/err")"
KILN_LAUNCH_EXE=$T/missing expect_error 2 "^error: cannot run KILN_LAUNCH_EXE=$T/missing (kiln launch): " -- launch -- "${targs[@]}"
grep -Eq "$style" "$T/err" && ok || bad "KILN_LAUNCH_EXE: not styled: $(cat "$T/err")"

# giving up: the last line is an error in the style, naming what failed and how
"$KILN" launch --max-restarts=0 --backoff=0 -- "${targs[@]}" --inject-crash=2 >/dev/null 2>"$T/err"
rc=$?
last=$(tail -n 1 "$T/err")
[ $rc -eq 134 ] && ok || bad "giving up: exit $rc, expected the child's 134"
echo "$last" | grep -Eq "$style" && echo "$last" |
  grep -q "^error: kiln train was killed by signal 6 (SIGABRT) (kiln launch): giving up after 0 restarts (--max-restarts=0); " &&
  ok || bad "giving up: $last"
finish
