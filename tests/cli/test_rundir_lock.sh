#!/usr/bin/env bash
# One job per run directory (issue 18, defect 1): a second kiln train on a live --out exits 2 naming the
# holder's pid, and leaves the holder's config, metrics and checkpoints alone; a SIGKILLed holder's lock goes
# with it, so the next run takes the directory at once; under mpirun, rank 0 holds it for the group.
source "$(dirname "$0")/lib.sh" rundir_lock "$@"
args=(--layers=1 --heads=2 --dim=32 --seq=32 --batch=4 --eval-every=0 --threads=1 --quiet --ckpt-every=5)
"$KILN" train "${args[@]}" --max-steps=1000000 --seed=1 --out="$T/r" 2>"$T/a.err" &
holder=$!
for _ in $(seq 400); do [ -s "$T/r/metrics.jsonl" ] && break; sleep 0.02; done
[ -s "$T/r/metrics.jsonl" ] && ok || bad "the first run did not start"
"$KILN" train "${args[@]}" --max-steps=20 --seed=7 --out="$T/r" >/dev/null 2>"$T/err"
rc=$?
[ $rc -eq 2 ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -q "^error: .*in use by another kiln job (pid $holder host" "$T/err" && ok ||
  bad "a second run on a live --out: exit $rc, $(cat "$T/err")"
grep -q "^seed = 1$" "$T/r/config" && ok || bad "the second run rewrote the holder's config"
n1=$(wc -l <"$T/r/metrics.jsonl")
sleep 0.3
n2=$(wc -l <"$T/r/metrics.jsonl")
[ "$n2" -ge "$n1" ] && [ "$n1" -gt 0 ] && ok || bad "the holder's metrics.jsonl shrank ($n1 -> $n2 lines)"
kill -0 $holder 2>/dev/null && ok || bad "the holder died: $(cat "$T/a.err")"

# under mpirun the group's rank 0 meets the lock, and the whole job ends (no hang)
if command -v mpirun >/dev/null; then
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 60 mpirun --oversubscribe -np 2 "$KILN" train \
    "${args[@]}" --max-steps=20 --out="$T/r" >/dev/null 2>"$T/err"
  rc=$?
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "\[rank 0\] error: .*in use by another kiln job (pid $holder" "$T/err" && ok ||
    bad "2 ranks on a live --out: exit $rc, $(grep -v ORTE "$T/err" | head -3)"
fi

# the holder killed: its lock went with it, and the next run resumes at once
kill -9 $holder
wait $holder 2>/dev/null
t0=$(date +%s%N)
"$KILN" train "${args[@]}" --max-steps=1 --resume=auto --out="$T/r" >/dev/null 2>"$T/err"
rc=$?
t=$((($(date +%s%N) - t0) / 1000000))
[ $rc -eq 0 ] && grep -q "resuming from" "$T/err" && ok || bad "after the holder's SIGKILL: exit $rc, $(cat "$T/err")"
[ $t -lt 10000 ] && ok || bad "taking a dead holder's directory took $t ms"
finish
