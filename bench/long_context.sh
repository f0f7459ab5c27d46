#!/usr/bin/env bash
# One GPU call for long context (docs/long_context.md; issue 15): build, the GPU tests of what long context
# uses (the attention-block op and split positions against the CPU, two ranks sharing the GPU under Ulysses
# and ring, activation offload's losses), then at the 1.3B shape (24 layers, 2048 wide, 16 heads, RoPE, B=1,
# --recompute=block) kiln's tokens/s, TFLOPS per GPU and MFU at each length of KILN_LENGTHS, with
# --offload=activations from KILN_OFFLOAD_FROM tokens on, and PyTorch (eager, SDPA, checkpointing; the seed's
# baseline) up to KILN_TORCH_MAX tokens, in the same call. KILN_PART=tests|sweep|all picks what runs. A
# length runs 10 steps up to 16k tokens, 5 up to 64k, 3 up to 256k, 2 beyond (the first is not timed): at
# 512k and more, one length is a run of its own (KILN_LENGTHS=524288). KILN_RECOMPUTE=selective|mlp runs kiln
# with less recompute (the attention's forward kept, not redone), where it fits: the 32k-64k gap's candidate;
# KILN_RECOMPUTE=auto lets kiln take the least recompute that fits the GPU at each length (the row says which).
# Logs in $OUT (few files: the device returns at most 8), each row printed as soon as it is measured; the rows
# also go to long_context.csv and, through kiln plot --bars, long_context.png (tokens/s and TFLOPS a length).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kiln-long}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# shellcheck source=bench/gpu_lib.sh
. bench/gpu_lib.sh
gpu_deps
BUILD=${BUILD:-build-gpu}
PART=${KILN_PART:-all}
LENGTHS=${KILN_LENGTHS:-"2048 8192 32768 65536 131072 262144 524288"}
OFFLOAD_FROM=${KILN_OFFLOAD_FROM:-262144}
TORCH_MAX=${KILN_TORCH_MAX:-65536}
RECOMPUTE=${KILN_RECOMPUTE:-block}
DEVICE=${KILN_BENCH_DEVICE:-cuda} # cpu: a smoke test of this script with KILN_SHAPE set small
SHAPE=${KILN_SHAPE:-"--preset=gpt2-124m --layers=24 --dim=2048 --heads=16"}
t0=$(date +%s)
K="$BUILD/kiln"
if [ -n "${KILN_DRY:-}" ]; then # no GPU, no training: each run's options checked by kiln info (bench/kiln_dry.sh)
  export KILN_REAL="$BUILD/kiln" KILN_DRY_LOG=${KILN_DRY_LOG:-$OUT/dry.log}
  : >"$KILN_DRY_LOG"
  K=bench/kiln_dry.sh
  [ "$PART" = all ] && PART=sweep
elif [ "$DEVICE" = cuda ]; then
  gpu_build kiln test_cuda_ops test_cuda_model
  echo "build: ok in $(($(date +%s) - t0)) s"
fi

if [ "$PART" = tests ] || [ "$PART" = all ]; then
  for f in "*attention_block*" "*split_positions*" "*"; do
    KILN_TEST_FILTER="$f" timeout 300 "$BUILD/test_cuda_ops" >>"$OUT/tests.log" 2>&1
    echo "test_cuda_ops $f: exit $?, $(grep -c FAIL "$OUT/tests.log") FAIL lines so far"
  done
  timeout 400 bash tests/cli/test_dist_gpu_mpi.sh "$BUILD/kiln" >>"$OUT/tests.log" 2>&1
  echo "test_dist_gpu_mpi: exit $?"
  grep -E "FAIL|worst|passed," "$OUT/tests.log" | tail -16
fi
[ "$PART" = tests ] && exit 0

# median tok/s over the timed steps (all but the first), TFLOPS per GPU and MFU (6N + 12LHQT, causal not
# halved, the seed's convention), and the peak GiB
stats() {
  python3 - "$1" <<'PY'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1]) if '"tokens_per_s"' in l]
timed = rows[1:] or rows
tok = statistics.median(r["tokens_per_s"] for r in timed)
mfu = statistics.median(r.get("mfu", 0) for r in timed)  # from the GPU's peak; 0 on the CPU
print(f'{tok:.0f} {mfu * 989:.1f} {100 * mfu:.1f} {rows[-1]["peak_mem_bytes"] / 2**30:.1f}')
PY
}
# kiln_run T OFFLOAD STEPS DIR: one kiln run at length T into DIR (its log appended to runs.log); false, with
# the failure's row in the table, where it wrote no metrics
kiln_run() {
  rm -rf "$4"
  # shellcheck disable=SC2086
  timeout 560 "$K" train $SHAPE --pos=rope --batch=1 --seq="$1" --block-size="$1" --recompute="$RECOMPUTE" \
    --offload="$2" --data=random --max-steps="$3" --warmup=1 --device="$DEVICE" \
    --eval-every=0 --checkpoint=0 --save-model=0 --quiet --log-every=1 --out="$4" >"$OUT/run.log" 2>&1
  local rc=$?
  { echo "== $1 ($2): exit $rc"; cat "$OUT/run.log" "$4/metrics.jsonl" 2>/dev/null; } >>"$OUT/runs.log"
  [ -s "$4/metrics.jsonl" ] && return 0
  echo "| $1 | failed: $(grep -v "^\s" "$OUT/run.log" | tail -1) | | | | $2 | | | |" | tee -a "$OUT/table.md"
  return 1
}
# torch_run T: PyTorch (eager, SDPA, checkpointing) at length T; sets ttok (tokens/s, or why it failed) and tgib
torch_run() {
  timeout 400 python3 .peer/bench/torch_gpt.py --layers 24 --dim 2048 --heads 16 --batch 1 --seq "$1" --ckpt 1 \
    --compile 0 --steps 6 --warmup 2 >"$OUT/torch.log" 2>&1
  cat "$OUT/torch.log" >>"$OUT/runs.log"
  local line
  line=$(grep '^{' "$OUT/torch.log" | tail -1)
  if [ -n "$line" ]; then
    ttok=$(echo "$line" | python3 -c "import json, sys; print(round(json.load(sys.stdin)['tok_per_s']))")
    tgib=$(echo "$line" | python3 -c "import json, sys; d = json.load(sys.stdin); print(round(d['peak_mem_GiB'], 1))")
  else
    ttok="failed: $(tail -1 "$OUT/torch.log" | cut -c1-60)"
  fi
}
echo "kiln --recompute=$RECOMPUTE" >"$OUT/table.md"
# the same rows for kiln plot: a bar group a length, kiln's and PyTorch's tokens/s and TFLOPS per GPU
echo "tokens,impl,tokens_per_s,tflops_per_gpu,peak_gib" >"$OUT/long_context.csv"
echo "| tokens | kiln tok/s | TFLOPS | MFU % | peak GiB | offload | PyTorch tok/s | PyTorch GiB | kiln/PyTorch |" >>"$OUT/table.md"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |" >>"$OUT/table.md"
for T in $LENGTHS; do
  off=none
  [ "$T" -ge "$OFFLOAD_FROM" ] && { [ "$RECOMPUTE" = block ] || [ "$RECOMPUTE" = selective ]; } && off=activations
  dir=/tmp/long_$T
  steps=2
  [ "$T" -le 262144 ] && steps=3
  [ "$T" -le 65536 ] && steps=5
  [ "$T" -le 16384 ] && steps=10
  # KILN_ABBA=1: kiln, PyTorch, PyTorch, kiln at each length, each side's row the mean of its two runs, so
  # that the GPU's clocks drifting over the call (heat; each side's own power draw) weigh on both alike
  # (2026-11-26, an H100: kiln ran at 1,770-1,830 MHz, PyTorch after it at 1,350-1,635, both at the 700 W cap)
  torch_on=""
  [ "$T" -le "$TORCH_MAX" ] && [ "$DEVICE" = cuda ] && [ -f .peer/bench/torch_gpt.py ] && torch_on=1
  order="k t"
  [ -n "${KILN_ABBA:-}" ] && [ -n "$torch_on" ] && order="k t t k"
  toks=() ttoks=() failed="" ttok="" tgib=""
  for side in $order; do
    if [ "$side" = k ]; then
      kiln_run "$T" "$off" "$steps" "$dir" || { failed=1; break; }
      read -r tok tf mfu gib < <(stats "$dir/metrics.jsonl")
      toks+=("$tok")
    elif [ -n "$torch_on" ]; then
      torch_run "$T"
      ttoks+=("$ttok")
    fi
  done
  [ -n "$failed" ] && continue
  ratio=""
  if [ ${#toks[@]} -gt 1 ]; then
    echo "$T: kiln runs ${toks[*]} tok/s, PyTorch runs ${ttoks[*]} (kiln, PyTorch, PyTorch, kiln)" | tee -a "$OUT/abba.log"
    mean=$(python3 -c "print(($(IFS=+; echo "${toks[*]}")) / ${#toks[@]})")
    tf=$(python3 -c "print(f'{$tf * $mean / $tok:.1f}')")
    mfu=$(python3 -c "print(f'{$mfu * $mean / $tok:.1f}')")
    tok=$(python3 -c "print(round(($(IFS=+; echo "${toks[*]}")) / ${#toks[@]}))")
    [[ "${ttoks[*]}" =~ ^[0-9\ ]+$ ]] && ttok=$(python3 -c "print(round(($(IFS=+; echo "${ttoks[*]}")) / ${#ttoks[@]}))")
  fi
  [[ $ttok =~ ^[0-9]+$ ]] && ratio=$(python3 -c "print(f'{$tok / $ttok:.2f}x')")
  # (auto: the mode it chose)
  [ "$RECOMPUTE" = auto ] && off="$off, $(grep -o 'recompute=auto: [a-z]*' "$OUT/run.log" | head -1)"
  echo "| $T | $tok | $tf | $mfu | $gib | $off | $ttok | $tgib | $ratio |" | tee -a "$OUT/table.md"
  label=$T
  [ $((T % 1024)) -eq 0 ] && label=$((T / 1024))k
  echo "$label,kiln $RECOMPUTE,$tok,$tf,$gib" >>"$OUT/long_context.csv"
  # PyTorch's TFLOPS by the same count: kiln's FLOPs a token (TFLOPS / tokens/s) are the shape's and T's
  [[ $ttok =~ ^[0-9]+$ ]] &&
    echo "$label,PyTorch,$ttok,$(python3 -c "print(f'{$ttok * $tf / $tok:.1f}')"),$tgib" >>"$OUT/long_context.csv"
done
if "$BUILD/kiln" plot --bars="$OUT/long_context.csv" --label=tokens --series=impl \
  --panels=tokens_per_s,tflops_per_gpu --out="$OUT/long_context.png" >/dev/null 2>"$OUT/plot.err"; then
  echo "plot: $OUT/long_context.png"
else
  echo "no plot: $(head -1 "$OUT/plot.err")"
fi
echo
cat "$OUT/table.md"
