#!/usr/bin/env bash
# Signals: SIGTERM and SIGUSR1 finish the step, save a checkpoint and exit 75; the same command resumes and
# ends with the uninterrupted run's weights. SIGINT does the same; a second SIGINT exits at once (130), and a
# second SIGTERM a second or more after the first (143); two SIGTERMs at once are one request.
source "$(dirname "$0")/lib.sh" signals "$@"

SEED=$((RANDOM * 32768 + RANDOM))
N=400
args=(--layers=1 --heads=2 --dim=32 --seq=32 --batch=4 --max-steps=$N --eval-every=0 --threads=1 --quiet --seed=$SEED)
"$KILN" train "${args[@]}" --out="$T/a" || bad "straight run failed"

# waits until RUN/metrics.jsonl has a line (training is under way), then sends the signal
signal_run() {
  local sig=$1 run=$2
  "$KILN" train "${args[@]}" --out="$run" 2>"$T/err" &
  local pid=$!
  for _ in $(seq 200); do [ -s "$run/metrics.jsonl" ] && break; sleep 0.01; done
  sleep 0.0$((RANDOM % 9))
  kill -"$sig" $pid
  wait $pid
  echo $?
}

for sig in TERM USR1 INT; do
  run="$T/$sig"
  rc=$(signal_run $sig "$run")
  if [ "$rc" = 0 ]; then echo "note: the SIG$sig run finished before the signal"; continue; fi
  [ "$rc" = 75 ] && ok || bad "SIG$sig: exit $rc, expected 75: $(cat "$T/err")"
  grep -q "stopped by SIG$sig after step [0-9]*; checkpoint saved" "$T/err" && ok || bad "SIG$sig message: $(cat "$T/err")"
  step=$(sed -n 's/.*after step \([0-9]*\).*/\1/p' "$T/err")
  [ -n "$step" ] && [ -f "$run/ckpt/$(printf 'step_%08d' "$step")/state.json" ] && ok ||
    bad "SIG$sig: no checkpoint for step $step: $(ls "$run/ckpt")"
  [ "$(tail -1 "$run/metrics.jsonl" | grep -o '"step":[0-9]*')" = "\"step\":$step" ] && ok || bad "SIG$sig: last metrics line"
  "$KILN" train "${args[@]}" --out="$run" 2>"$T/err" || bad "SIG$sig: resume failed: $(cat "$T/err")"
  grep -q "step_$(printf '%08d' "$step")" "$T/err" && ok || bad "SIG$sig: did not resume from step $step: $(cat "$T/err")"
  cmp -s "$T/a/model.safetensors" "$run/model.safetensors" && ok || bad "SIG$sig: final weights differ from the straight run's"
done

# two SIGINTs: out at once, with status 130
"$KILN" train "${args[@]}" --max-steps=100000 --out="$T/int2" 2>"$T/err" &
signal_twice $! "$T/int2" INT
rc=$twice_rc
[ $rc -eq 130 ] || [ $rc -eq 75 ] && ok || bad "two SIGINTs: exit $rc"
[ $rc -eq 130 ] && { grep -q "second SIGINT" "$T/err" && ok || bad "no second-SIGINT message: $(cat "$T/err")"; }

# two SIGTERMs at once (Slurm signals every process of a step, and kiln launch forwards its own): one
# request, so the run checkpoints and exits 75
"$KILN" train "${args[@]}" --max-steps=100000 --out="$T/dup" 2>"$T/err" &
signal_twice $! "$T/dup" TERM
rc=$twice_rc
[ $rc -eq 75 ] && ok || bad "two SIGTERMs at once: exit $rc, expected 75: $(cat "$T/err")"
ls "$T/dup/ckpt" | grep -q '^step_' && ok || bad "two SIGTERMs at once: no checkpoint"

# a rank stuck where no step ends (--inject-stall): the first SIGTERM asks for a stop that never comes, the
# second exits at once, with status 143 (128 + SIGTERM) and a line saying so
"$KILN" train "${args[@]}" --inject-stall=0:3 --out="$T/term2" 2>"$T/err" &
term_twice $! "$T/err" "a stalled run"
rc=$term_rc
[ $rc -eq 143 ] && ok || bad "two SIGTERMs to a stalled run: exit $rc, expected 143: $(cat "$T/err")"
grep -q "second SIGTERM: exiting now" "$T/err" && ok || bad "no second-SIGTERM message: $(cat "$T/err")"

# a run still starting, blocked opening its data (a FIFO with no writer, as a hung network mount would block):
# the first SIGTERM ends it at once, exit 75 (nothing was trained since the newest checkpoint)
mkfifo "$T/hung.bin"
"$KILN" train --tokenizer=gpt2 --data="$T/hung.bin" "${args[@]}" --out="$T/hung" 2>"$T/err" &
pid=$!
sleep 1
kill -TERM $pid
for _ in $(seq 300); do kill -0 $pid 2>/dev/null || break; sleep 0.01; done
if kill -0 $pid 2>/dev/null; then
  bad "a run blocked opening its data outlived its first SIGTERM by 3 s"
  kill -KILL $pid
fi
wait $pid
rc=$?
[ $rc -eq 75 ] && ok || bad "SIGTERM to a starting run: exit $rc, expected 75: $(cat "$T/err")"
grep -q "SIGTERM before the first step: exiting now" "$T/err" && ok || bad "no message for a starting run: $(cat "$T/err")"

finish
