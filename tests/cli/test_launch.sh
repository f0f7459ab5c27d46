#!/usr/bin/env bash
# kiln launch: restarts kiln train after a crash (--inject-crash: abort() in a fresh run) from the newest
# checkpoint, logs the restart in RUN/restarts.jsonl, and ends with the uninterrupted run's weights; gives up
# after --max-restarts; does not retry usage errors; forwards SIGTERM (exit 75); checks its own flags.
source "$(dirname "$0")/lib.sh" launch "$@"

SEED=$((RANDOM * 32768 + RANDOM))
N=$((24 + RANDOM % 8))
CRASH=$((8 + RANDOM % (N - 9)))
args=(--layers=1 --heads=2 --dim=32 --seq=32 --batch=4 --max-steps=$N --eval-every=0 --threads=1 --quiet --seed=$SEED)
"$KILN" train "${args[@]}" --out="$T/a" || bad "straight run failed"

"$KILN" launch --max-restarts=2 --backoff=0.05 -- "${args[@]}" --out="$T/b" --ckpt-every=2 --inject-crash=$CRASH 2>"$T/err"
rc=$?
[ $rc -eq 0 ] && ok || bad "launch exited $rc: $(cat "$T/err")"
[ "$(wc -l <"$T/b/restarts.jsonl")" -eq 1 ] && ok || bad "restarts.jsonl: $(cat "$T/b/restarts.jsonl")"
grep -q '"restart":1,"signal":6,"signal_name":"SIGABRT","uptime_s":[0-9.]*,"resume_step":[0-9]*,"backoff_s":0.050}' \
  "$T/b/restarts.jsonl" && ok || bad "restart record: $(cat "$T/b/restarts.jsonl")"
rs=$(sed -n 's/.*"resume_step":\([0-9]*\).*/\1/p' "$T/b/restarts.jsonl")
[ "$rs" -eq $(((CRASH - 1) / 2 * 2)) ] && ok || bad "resume_step $rs (crash before $CRASH, a checkpoint every 2)"
grep -q '"time":"20[0-9-]*T[0-9:]*Z"' "$T/b/restarts.jsonl" && ok || bad "no time in the restart record"
cmp -s "$T/a/model.safetensors" "$T/b/model.safetensors" && ok || bad "weights after a restart differ from the straight run's"

# a crash before any checkpoint, every time: max-restarts restarts, then launch gives up with the child's status
"$KILN" launch --max-restarts=2 --backoff=0 -- "${args[@]}" --out="$T/c" --inject-crash=2 2>"$T/err"
rc=$?
[ $rc -eq 134 ] && ok || bad "giving up should exit 134 (SIGABRT), got $rc"
[ "$(wc -l <"$T/c/restarts.jsonl")" -eq 2 ] && ok || bad "2 restarts expected: $(cat "$T/c/restarts.jsonl")"
grep -q "^error: kiln train was killed by signal 6 (SIGABRT) (kiln launch): giving up after 2 restarts (--max-restarts=2); " "$T/err" && ok || bad "no give-up message: $(cat "$T/err")"

# usage errors: not retried
"$KILN" launch --max-restarts=5 --backoff=0 -- "${args[@]}" --out="$T/d" --layers=2 --dim=31 2>"$T/err"
[ $? -eq 2 ] && ok || bad "a usage error should exit 2"
[ ! -e "$T/d/restarts.jsonl" ] && ok || bad "a usage error was retried"
"$KILN" launch --max-restarts=x -- "${args[@]}" --out="$T/d" 2>"$T/err"
[ $? -eq 2 ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -q "^error: bad value 'x' for max-restarts (kiln launch --max-restarts): .*; see kiln launch --help$" "$T/err" && ok || bad "--max-restarts=x: $(cat "$T/err")"
"$KILN" launch -- "${args[@]}" 2>"$T/err"
[ $? -eq 2 ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -q "^error: no --out=RUN (kiln launch's train options): .*; add --out=RUN" "$T/err" && ok || bad "launch without --out: $(cat "$T/err")"
"$KILN" launch "${args[@]}" 2>"$T/err"
[ $? -eq 2 ] && grep -q "train options go after --" "$T/err" && ok || bad "launch without --: $(cat "$T/err")"

# SIGTERM to launch: forwarded; the child checkpoints and exits 75, launch too, without a restart
"$KILN" launch --backoff=0 -- "${args[@]}" --max-steps=100000 --out="$T/e" 2>"$T/err" &
pid=$!
for _ in $(seq 300); do [ -s "$T/e/metrics.jsonl" ] && break; sleep 0.01; done
kill -TERM $pid
wait $pid
rc=$?
[ $rc -eq 75 ] && ok || bad "SIGTERM to launch: exit $rc, expected 75: $(cat "$T/err")"
[ ! -e "$T/e/restarts.jsonl" ] && ok || bad "a forwarded SIGTERM caused a restart"
ls "$T/e/ckpt" | grep -q '^step_' && ok || bad "no checkpoint after SIGTERM"

# two SIGTERMs at once (as Slurm's, to launch and to its ranks, with launch's own copy): one request
"$KILN" launch --backoff=0 -- "${args[@]}" --max-steps=100000 --out="$T/d" 2>"$T/err" &
signal_twice $! "$T/d" TERM
rc=$twice_rc
[ $rc -eq 75 ] && ls "$T/d/ckpt" | grep -q '^step_' && ok || bad "two SIGTERMs at once to launch: exit $rc: $(cat "$T/err")"

# a stalled child (--inject-stall) never ends its step: the first SIGTERM is forwarded and waits, the second
# SIGKILLs the group, and launch returns at once
"$KILN" launch --max-restarts=0 -- "${args[@]}" --max-steps=100000 --inject-stall=0:3 --out="$T/s" 2>"$T/err" &
term_twice $! "$T/err" "launch with a stalled child"
pgrep -f -- "--out=$T/s" >/dev/null && bad "the stalled child outlived launch" || ok

finish
