#!/usr/bin/env bash
# --precision=fp8 on the CPU (the exact emulation of FP8 GEMMs): kiln info says so; a small model trains to
# the loss of the f32 run within 2% (FP8's rounding, 3-6% per GEMM output at random, averages out over a
# step's updates: about 0.1-0.4% was seen over 60 steps); a crashed run resumed with each recipe ends on the
# uninterrupted run's weights and losses bit for bit (delayed scaling's amax histories are in the
# checkpoint); the fp8 options without fp8, and what fp8 does not do yet, are refused in one line.
source "$(dirname "$0")/lib.sh" fp8 "$@"
losses() { grep -o '"step":[0-9]*,"loss":[^,]*' "$1/metrics.jsonl"; }

SEED=$((RANDOM * 32768 + RANDOM))
args=(--layers=2 --heads=2 --dim=32 --seq=32 --batch=4 --warmup=3 --eval-every=100 --eval-steps=2 --threads=1
  --quiet --seed=$SEED)
echo "seed $SEED"

"$KILN" info --device=cpu --precision=fp8 --layers=2 --heads=2 --dim=32 >"$T/info" 2>&1
grep -q "^precision: fp8 (emulated on the CPU), recipe tensorwise, gradients e5m2" "$T/info" && ok ||
  bad "kiln info: $(grep precision "$T/info")"
"$KILN" info --device=cpu --layers=2 --heads=2 --dim=32 | grep -q "^precision: bf16" && ok || bad "kiln info in bf16"

# loss close to the f32 run's
"$KILN" train "${args[@]}" --max-steps=40 --out="$T/f32" || bad "f32 run failed"
"$KILN" train "${args[@]}" --max-steps=40 --out="$T/fp8" --precision=fp8 || bad "fp8 run failed"
python3 - "$T/f32" "$T/fp8" <<'PY' && ok || bad "fp8's loss is not within 2% of f32's"
import json, sys
def last(d):
    return [r["loss"] for r in map(json.loads, open(d + "/metrics.jsonl")) if "loss" in r][-1]
a, b = last(sys.argv[1]), last(sys.argv[2])
print(f"final loss f32 {a:.5f}, fp8 {b:.5f}: {abs(b - a) / a:.2%}")
sys.exit(0 if abs(b - a) / a < 0.02 and a != b else 1)
PY

# resume bit for bit, each recipe
N=12
for recipe in tensorwise rowwise delayed; do
  extra=(--precision=fp8 --fp8-recipe=$recipe)
  [ $recipe = delayed ] && extra+=(--fp8-history=3)
  "$KILN" train "${args[@]}" "${extra[@]}" --max-steps=$N --out="$T/a_$recipe" || bad "$recipe: straight run failed"
  ("$KILN" train "${args[@]}" "${extra[@]}" --max-steps=$N --out="$T/b_$recipe" --ckpt-every=4 --inject-crash=7) \
    >/dev/null 2>&1 # abort()s before step 7, after the checkpoint of step 4
  "$KILN" train "${args[@]}" "${extra[@]}" --max-steps=$N --out="$T/b_$recipe" --ckpt-every=4 --inject-crash=7 \
    2>"$T/err" || bad "$recipe: resume failed: $(cat "$T/err")"
  grep -q "resuming from $T/b_$recipe/ckpt/step_00000004" "$T/err" && ok || bad "$recipe: did not resume"
  same_weights "$T/a_$recipe" "$T/b_$recipe" && ok || bad "$recipe: resumed weights differ from the straight run's"
  diff <(losses "$T/a_$recipe") <(losses "$T/b_$recipe") >/dev/null && ok || bad "$recipe: resumed losses differ"
done
python3 -c 'import json, sys; s = json.load(open(sys.argv[1]))["precision"]; sys.exit(s["recipe"] != "delayed")' \
  "$T/b_delayed/ckpt/step_00000012/state.json" && ok ||
  bad "the delayed recipe's state is not in state.json"
# the recipes differ (a checkpoint writer that leaves the histories out fails the delayed resume above)
same_weights "$T/a_delayed" "$T/a_tensorwise" && bad "delayed and tensorwise gave the same weights" || ok

# refusals: one line each, exit 2
expect_error 2 "fp8-recipe with precision bf16" -- train "${args[@]}" --fp8-recipe=rowwise
expect_error 2 "fp8-head with precision bf16" -- train "${args[@]}" --fp8-head=1
expect_error 2 "fp8-history 4 with recipe tensorwise" -- train "${args[@]}" --precision=fp8 --fp8-history=4
expect_error 2 "precision" -- train "${args[@]}" --precision=fp4
expect_error 2 "fp8-recipe" -- train "${args[@]}" --precision=fp8 --fp8-recipe=blockwise
"$KILN" train "${args[@]}" "${extra[@]}" --max-steps=$((N + 2)) --out="$T/b_delayed" --fp8-history=5 \
  >/dev/null 2>"$T/err"
[ $? -eq 2 ] && tail -1 "$T/err" | grep -q "^error: .*resume with --fp8-history=3" && ok ||
  bad "a changed history length: $(cat "$T/err")"

finish
