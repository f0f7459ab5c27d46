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
# GPU's free memory), block when none fits, selective or block with --offload=activations, and act on the CPU
# without a budget; it says which on stderr and trains
m=(--layers=4 --heads=2 --dim=128 --seq=1024 --block-size=1024 --batch=4 --max-steps=1 --eval-every=0 --quiet
  --threads=1 --checkpoint=0 --save-model=0)
mib() { "$KILN" info "${m[@]}" "$@" | awk '/^  total/ {print $2 * 1024; exit}'; }
declare -A plan
for rc in none act mlp selective block; do plan[$rc]=$(mib --recompute=$rc); done
python3 -c "import sys; v = list(map(float, sys.argv[1:])); assert all(a > b for a, b in zip(v, v[1:])), v" \
  "${plan[none]}" "${plan[act]}" "${plan[mlp]}" "${plan[selective]}" "${plan[block]}" && ok ||
  bad "the plans do not fall from none to block: ${plan[*]}"
auto() { # BUDGET_MIB EXPECTED [ARGS]: the mode auto picks under that budget
  local budget=$1 want=$2
  shift 2
  KILN_MEM_BUDGET_MB=$budget "$KILN" train "${m[@]}" --recompute=auto "$@" --out="$T/auto" 2>"$T/err" ||
    { bad "auto under $budget MiB failed: $(cat "$T/err")"; return; }
  grep -q "^kiln: --recompute=auto: $want (planned" "$T/err" && ok ||
    bad "auto under $budget MiB: expected $want, got: $(cat "$T/err")"
}
mid() { python3 -c "import sys; print((float(sys.argv[1]) + float(sys.argv[2])) / 2)" "$1" "$2"; }
auto 100000 none
auto "$(mid "${plan[none]}" "${plan[act]}")" act
auto "$(mid "${plan[act]}" "${plan[mlp]}")" mlp
auto "$(mid "${plan[mlp]}" "${plan[selective]}")" selective
auto "$(mid "${plan[selective]}" "${plan[block]}")" block
auto 1 block
auto 100000 selective --offload=activations
"$KILN" train "${m[@]}" --recompute=auto --out="$T/auto" 2>"$T/err" && grep -q "^kiln: --recompute=auto: act (the cpu states no memory limit)" "$T/err" &&
  ok || bad "auto on the CPU without a budget: $(cat "$T/err")"
"$KILN" info "${m[@]}" --recompute=auto | grep -q "^--recompute=auto: the first of these" && ok ||
  bad "kiln info --recompute=auto lists no candidates"

finish
