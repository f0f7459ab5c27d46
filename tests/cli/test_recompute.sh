#!/usr/bin/env bash
# --recompute as a user meets it: a bad value names the allowed ones, and kiln info's CUDA plan shrinks with
# each mode (act keeps the MLP activation's input only, mlp keeps neither per layer, block only the residual);
# the default is act. --offload=activations changes no number and moves the layer inputs out of the plan.
source "$(dirname "$0")/lib.sh" recompute "$@"

expect_error 2 "allowed values are none,mlp,block,act,selective" -- train --recompute=gelu
expect_error 2 "allowed values are none,mlp,block,act,selective" -- info --recompute=

acts() { "$KILN" info --preset=gpt2-124m --batch=8 --seq=1024 "$@" |
  awk '/^memory \(cuda/ {m = 1} m && /^  activations/ {print $2; exit}'; }
none=$(acts --recompute=none)
act=$(acts --recompute=act)
default=$(acts)
[ "$default" = "$act" ] && ok || bad "default plan $default GiB, --recompute=act $act GiB: act should be the default"
mlp=$(acts --recompute=mlp)
block=$(acts --recompute=block)
selective=$(acts --recompute=selective)
python3 -c "import sys; n, a, m, s, b = map(float, sys.argv[1:]); assert n > a > m > s > b > 0, (n, a, m, s, b)" \
  "$none" "$act" "$mlp" "$selective" "$block" && ok ||
  bad "activation plans none $none, act $act, mlp $mlp, selective $selective, block $block GiB"
# selective keeps each layer's attention output (N x C, act dtype) and log-sum-exp (N x heads, f32), where
# block keeps one layer's: 11 more of each, 11 x 8192 x (768 x 2 + 12 x 4) bytes
python3 -c "import sys; s, b = map(float, sys.argv[1:]); d = (s - b) * 2**30; e = 11 * 8192 * (768 * 2 + 12 * 4); assert abs(d - e) < 2e-3 * 2**30, (d, e)" \
  "$selective" "$block" && ok || bad "selective keeps $selective - $block GiB more than block, not the attention outputs"

# --offload=activations: each layer's input goes to host memory and back (training with --recompute=block
# only); the same run without it gives bitwise the same weights and metrics on the CPU, and kiln info's
# device plan shrinks by the inputs that leave, which its host line then holds
expect_error 2 "offload activations without --recompute=block (--offload)" -- train --offload=activations
big=(--preset=gpt2-124m --batch=8 --seq=1024 --recompute=block)
dev() { "$KILN" info "${big[@]}" "$@" | awk '/^memory \(cuda/ {m = 1} m && /^  activations/ {print $2; exit}'; }
host=$("$KILN" info "${big[@]}" --offload=activations | awk '/^memory \(cuda/ {m = 1} m && /host memory \(offloaded activations\)/ {print $5; exit}')
python3 -c "import sys; k, m, h = map(float, sys.argv[1:]); assert abs((k - m) - h) < 2e-3 and h > 0, (k, m, h)" \
  "$(dev)" "$(dev --offload=activations)" "$host" && ok || bad "plans: kept $(dev), offloaded $(dev --offload=activations), host $host GiB"
run=(--layers=5 --heads=2 --dim=32 --seq=16 --batch=2 --max-steps=3 --eval-every=2 --eval-steps=1 --threads=1 --quiet
  --recompute=block --total-batch=64)
"$KILN" train "${run[@]}" --out="$T/kept" && "$KILN" train "${run[@]}" --offload=activations --out="$T/moved" ||
  bad "training with and without offloaded activations"
same_weights "$T/kept" "$T/moved" && [ "$(cut -d, -f1-4 "$T/kept/metrics.jsonl")" = "$(cut -d, -f1-4 "$T/moved/metrics.jsonl")" ] &&
  ok || bad "offloaded activations changed the run"
# --recompute=selective (the attention kept, not redone) trains bitwise as block does, with offload too
"$KILN" train "${run[@]}" --recompute=selective --offload=activations --out="$T/sel" ||
  bad "training with --recompute=selective"
same_weights "$T/kept" "$T/sel" && [ "$(cut -d, -f1-4 "$T/kept/metrics.jsonl")" = "$(cut -d, -f1-4 "$T/sel/metrics.jsonl")" ] &&
  ok || bad "--recompute=selective changed the run"

# --recompute=auto takes the least recompute whose plan fits the budget (KILN_MEM_BUDGET_MB stands in for a
# GPU's free memory): walked down through kiln info, each budget just under the last choice's plan takes the
# next mode, none to block, then block when nothing fits; selective first with --offload=activations; act on
# the CPU without a budget; and the trainer takes what info says, says so, and trains
m=(--layers=4 --heads=2 --dim=128 --seq=1024 --block-size=1024 --batch=4 --max-steps=1 --eval-every=0 --quiet
  --threads=1 --checkpoint=0 --save-model=0)
pick() { # BUDGET_MIB [ARGS]: "MODE PLANNED_BYTES" that kiln info says auto takes for the run m
  local budget=$1
  shift
  KILN_MEM_BUDGET_MB=$budget "$KILN" info "${m[@]}" --recompute=auto "$@" |
    awk '/^under KILN_MEM_BUDGET_MB/ {print $(NF - 3), $(NF - 1)}'
}
mib_between() { python3 -c "import sys; a, b = map(float, sys.argv[1:]); print((a + b) / 2 / 1048576)" "$1" "$2"; }
budget=1000000 seen=""
for want in none act mlp selective block; do
  read -r got planned < <(pick $budget)
  [ "$got" = "$want" ] && ok || bad "auto under $budget MiB: expected $want, got '$got'"
  seen="$seen $got:$planned"
  budget=$(python3 -c "print(($planned - 4096) / 1048576)") # just under this choice's plan
done
read -r got _ < <(pick 0.01)
[ "$got" = block ] && ok || bad "auto when nothing fits: expected block, got '$got' ($seen)"
read -r got _ < <(pick 1000000 --offload=activations)
[ "$got" = selective ] && ok || bad "auto with --offload=activations: expected selective, got '$got'"
# the trainer, on a smaller run (a step of m takes 20 s on one busy core): a budget just under the plan of
# none, where info takes some recompute
small=(--seq=256 --block-size=256 --batch=1)
read -r _ planned < <(pick 1000000 "${small[@]}")
budget=$(python3 -c "print(($planned - 4096) / 1048576)")
read -r want _ < <(pick "$budget" "${small[@]}")
[ -n "$want" ] && [ "$want" != none ] && ok || bad "auto under $budget MiB (the smaller run): '$want'"
KILN_MEM_BUDGET_MB=$budget "$KILN" train "${m[@]}" "${small[@]}" --recompute=auto --out="$T/auto" 2>"$T/err" &&
  grep -q "^kiln: --recompute=auto: $want (planned" "$T/err" && grep -q "^recompute = $want$" "$T/auto/config" && ok ||
  bad "training under $budget MiB: expected $want (as info said), got: $(cat "$T/err")"
"$KILN" train "${m[@]}" "${small[@]}" --recompute=auto --out="$T/auto" 2>"$T/err" &&
  grep -q "^kiln: --recompute=auto: act (the cpu states no memory limit)" "$T/err" && ok ||
  bad "auto on the CPU without a budget: $(cat "$T/err")"
# when nothing fits, auto says whether keeping the layer inputs in host memory would, and with what mode: the
# budgets from kiln info's plans of this run (block's, and with --offload=activations the most and the least
# memory that auto takes), between block's and offloaded selective's, then under offloaded block's
L=(--preset=gpt2-124m --layers=12 --dim=64 --heads=2 --pos=rope --batch=1 --seq=1024 --block-size=1024 --tokenizer=char
  --data=random --max-steps=1 --device=cpu --eval-every=0 --checkpoint=0 --save-model=0 --quiet --threads=1)
pickL() { KILN_MEM_BUDGET_MB=$1 "$KILN" info "${L[@]}" --recompute=auto "${@:2}" |
  awk '/^under KILN_MEM_BUDGET_MB/ {print $(NF - 3), $(NF - 1)}'; }
read -r _ blk < <(pickL 0.01)
read -r off_mode off_most < <(pickL 1000000 --offload=activations)
read -r _ off_least < <(pickL 0.01 --offload=activations)
python3 -c "import sys; b, s, l = map(int, sys.argv[1:]); assert b > s >= l > 0, (b, s, l)" "$blk" "$off_most" \
  "$off_least" && [ "$off_mode" = selective ] && ok ||
  bad "plans of the hint's run: block $blk, offloaded $off_mode $off_most, offloaded least $off_least bytes"
KILN_MEM_BUDGET_MB=$(mib_between "$blk" "$off_most") "$KILN" train "${L[@]}" --recompute=auto --out="$T/hint" 2>"$T/err" &&
  grep -q "^kiln: --recompute=auto: no mode fits the device's budget; with --offload=activations selective plans" \
    "$T/err" && ok || bad "auto's offload hint: $(cat "$T/err")"
KILN_MEM_BUDGET_MB=$(mib_between "$off_least" 0) "$KILN" train "${L[@]}" --recompute=auto --out="$T/hint0" 2>"$T/err"
grep -q "^kiln: --recompute=auto: no mode fits the device's budget, nor with --offload=activations (block:" "$T/err" &&
  ok || bad "auto when offload would not fit either: $(cat "$T/err")"
# kiln info says whether a rank's GPU plan fits the budget auto uses (KILN_MEM_BUDGET_MB standing in for a GPU),
# and what takes less memory when it does not; without a GPU or a budget it says nothing
gpu=$("$KILN" info "${m[@]}" | awk '/^  total on the GPU/ {print $5}')
fits() { KILN_MEM_BUDGET_MB=$1 "$KILN" info "${m[@]}" | grep '^fits'; }
mib=$(python3 -c "print(int($gpu * 1024) + 64)")
fits "$mib" | grep -q "^fits KILN_MEM_BUDGET_MB: yes, $gpu GiB planned" && ok || bad "a budget above the plan: $(fits "$mib")"
mib=$(python3 -c "print(int($gpu * 1024) - 64)")
fits "$mib" | grep -q "^fits KILN_MEM_BUDGET_MB: no, $gpu GiB planned" &&
  KILN_MEM_BUDGET_MB=$mib "$KILN" info "${m[@]}" | grep -q "less memory: more recompute" && ok ||
  bad "a budget under the plan: $(fits "$mib")"
[ -z "$("$KILN" info "${m[@]}" | grep '^fits')" ] && ok || bad "a fit verdict without a GPU or a budget"
# a bad budget is refused at start-up, in one line naming the variable (run/knobs.c)
KILN_MEM_BUDGET_MB=lots expect_error 2 "KILN_MEM_BUDGET_MB=lots (environment): a number above 0" -- \
  info "${m[@]}" --recompute=auto

finish
