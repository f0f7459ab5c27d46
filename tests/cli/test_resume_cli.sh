#!/usr/bin/env bash
# Resume from the command line: a crashed run (--inject-crash: abort() mid-run) resumed with the same command
# ends with the uninterrupted run's weights and losses, bit for bit; a different model is refused with exit 2
# and one line naming the difference; safe changes are logged; --resume=never refuses a run with checkpoints.
source "$(dirname "$0")/lib.sh" resume "$@"
losses() { grep -o '"step":[0-9]*,"loss":[^,]*' "$1/metrics.jsonl"; }

SEED=$((RANDOM * 32768 + RANDOM))
N=$((20 + RANDOM % 10))
CRASH=$((5 + RANDOM % (N - 6)))
args=(--layers=1 --heads=2 --dim=32 --seq=32 --batch=4 --max-steps=$N --warmup=3 --eval-every=5 --eval-steps=2
  --threads=1 --quiet --seed=$SEED)
echo "seed $SEED, $N steps, crash before step $CRASH"

"$KILN" train "${args[@]}" --out="$T/a" || bad "straight run failed"
"$KILN" train "${args[@]}" --out="$T/b" --ckpt-every=3 --inject-crash=$CRASH 2>"$T/err"
rc=$?
[ $rc -eq 134 ] && ok || bad "--inject-crash should abort (134), got $rc: $(cat "$T/err")"
[ ! -e "$T/b/model.safetensors" ] && ok || bad "a crashed run wrote a final model"
"$KILN" train "${args[@]}" --out="$T/b" --ckpt-every=3 --inject-crash=$CRASH 2>"$T/err" || bad "resume failed: $(cat "$T/err")"
resumed=$(printf 'step_%08d' $(((CRASH - 1) / 3 * 3)))
grep -q "resuming from $T/b/ckpt/$resumed" "$T/err" && ok || bad "should resume from $resumed: $(cat "$T/err")"
cmp -s "$T/a/model.safetensors" "$T/b/model.safetensors" && ok || bad "resumed weights differ from the straight run's"
diff <(losses "$T/a") <(losses "$T/b") >/dev/null && ok || bad "resumed losses differ: $(diff <(losses "$T/a") <(losses "$T/b") | head -5)"
[ "$(losses "$T/b" | wc -l)" -eq "$N" ] && ok || bad "metrics.jsonl should hold each of the $N steps once"

# a different model: exit 2, one line naming the options
"$KILN" train "${args[@]}" --out="$T/b" --max-steps=$((N + 5)) --layers=2 --heads=4 >/dev/null 2>"$T/err"
rc=$?
[ $rc -eq 2 ] && ok || bad "a changed model should exit 2, got $rc"
[ "$(wc -l <"$T/err")" -eq 1 ] && ok || bad "refusal should be one line: $(cat "$T/err")"
grep -q "^error: the checkpoint holds a different model (--resume): layers 1 -> 2, heads 2 -> 4" "$T/err" && ok ||
  bad "refusal message: $(cat "$T/err")"
"$KILN" train "${args[@]}" --out="$T/b" --max-steps=$((N + 5)) --tokenizer=gpt2 >/dev/null 2>"$T/err"
rc=$?
[ $rc -eq 2 ] && grep -q "tokenizer 'char' -> 'gpt2'" "$T/err" && ok || bad "a changed tokenizer: exit $rc: $(cat "$T/err")"

# safe changes: logged, and training continues
"$KILN" train "${args[@]}" --out="$T/b" --max-steps=$((N + 4)) --lr=1e-3 2>"$T/err" || bad "lr change refused: $(cat "$T/err")"
grep -q "^kiln: resume: lr 0.003 -> 0.001$" "$T/err" && ok || bad "lr change not logged: $(cat "$T/err")"
grep -q "^kiln: resume: max-steps $N -> $((N + 4))$" "$T/err" && ok || bad "max-steps change not logged: $(cat "$T/err")"
[ "$(losses "$T/b" | tail -1 | cut -d, -f1)" = "\"step\":$((N + 4))" ] && ok || bad "did not continue to step $((N + 4))"

# --resume=never refuses a run directory that has checkpoints; --resume=PATH needs --out
"$KILN" train "${args[@]}" --out="$T/b" --resume=never >/dev/null 2>"$T/err"
[ $? -eq 2 ] && grep -q "already holds checkpoints (--resume=never)" "$T/err" && ok || bad "--resume=never: $(cat "$T/err")"
"$KILN" train "${args[@]}" --resume="$T/b/ckpt/step_00000003" >/dev/null 2>"$T/err"
[ $? -eq 2 ] && grep -q "needs --out" "$T/err" && ok || bad "--resume=PATH without --out: $(cat "$T/err")"
"$KILN" train "${args[@]}" --out="$T/c" --inject-nan=3,x >/dev/null 2>"$T/err"
[ $? -eq 2 ] && grep -q "bad value '3,x' for inject-nan" "$T/err" && ok || bad "--inject-nan=3,x: $(cat "$T/err")"

finish
