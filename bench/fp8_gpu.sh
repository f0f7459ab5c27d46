#!/usr/bin/env bash
# FP8 on one Hopper GPU: its kernels against the CPU's emulation, then --precision=fp8 against bf16 in the same
# call (alternating, KILN_FP8_ROUNDS rounds, default 1) at GPT-2 124M, 350M, the 1.3B shape and llama-1b:
# median ms a step of steps 10-30, tok/s and the loss at step 30 (random tokens: a check that it trains, not
# a quality figure). KILN_FP8_SHAPES picks shapes by name; KILN_FP8_FLAGS adds flags to the fp8 runs
# (e.g. --fp8-recipe=rowwise); KILN_FP8_VARIANTS more fp8 runs (below); KILN_FP8_TORCH=1 adds the PyTorch peer (bench/torch_fp8.py: torch._scaled_mm
# with tensorwise scales under torch.compile) in bf16 and fp8 for each shape. Logs in $OUT; a table last.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kiln-fp8}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
# shellcheck source=bench/gpu_lib.sh
. bench/gpu_lib.sh
gpu_deps
BUILD=${BUILD:-build-gpu}
t0=$(date +%s)
[ -x "$BUILD/kiln" ] && [ -n "${KILN_NO_BUILD:-}" ] || gpu_build kiln test_op_table_gpu
echo "build: ok in $(($(date +%s) - t0)) s"
echo "| run | result |" >"$OUT/fp8.md"
echo "| --- | --- |" >>"$OUT/fp8.md"
KILN_OP_TABLE_ROWS=amax,fp8_matmul,bias_backward timeout -k 10 200 "$BUILD/test_op_table_gpu" >"$OUT/fp8_ops.log" 2>&1
echo "| test_op_table_gpu (amax, fp8_matmul, bias_backward) | exit $?: $(grep -c ' PASS' "$OUT/fp8_ops.log") PASS, $(grep -c ' FAIL' "$OUT/fp8_ops.log") FAIL |" |
  tee -a "$OUT/fp8.md"
grep ' FAIL' "$OUT/fp8_ops.log" | head -5
SHAPES=("124m --preset=gpt2-124m --batch=32 --seq=1024"
  "350m --preset=gpt2-350m --batch=16 --seq=1024"
  "1.3b --preset=gpt2-124m --layers=24 --dim=2048 --heads=16 --batch=8 --seq=1024"
  "llama-1b --preset=llama-1b --batch=4 --seq=2048")
# the PyTorch peer's arguments for the same shapes (bench/torch_fp8.py), run with KILN_FP8_TORCH=1
declare -A TORCH=([124m]="--model gpt --layers 12 --dim 768 --heads 12 --batch 32 --seq 1024"
  [350m]="--model gpt --layers 24 --dim 1024 --heads 16 --batch 16 --seq 1024"
  [1.3b]="--model gpt --layers 24 --dim 2048 --heads 16 --batch 8 --seq 1024"
  [llama-1b]="--model llama --layers 16 --dim 2048 --heads 32 --kv-heads 8 --hidden 8192 --batch 4 --seq 2048")
stats() { # metrics.jsonl -> median ms of steps 10 on, median tok/s, last loss
  python3 -c "
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '\"ms\"' in l]
late = rows[10:] or rows
print(f'{statistics.median(r[\"ms\"] for r in late):.2f} {statistics.median(r[\"tokens_per_s\"] for r in late):.0f} {rows[-1][\"loss\"]:.4f}')" "$1" 2>/dev/null || echo "nan nan nan"
}
for s in "${SHAPES[@]}"; do
  set -- $s
  name=$1
  shift
  [ -n "${KILN_FP8_SHAPES:-}" ] && [[ " $KILN_FP8_SHAPES " != *" $name "* ]] && continue
  # KILN_FP8_VARIANTS: more fp8 runs, flag sets separated by ';' (e.g. "--fp8-head=1;--fp8-grad=e4m3"), each
  # a row of its own against the same bf16 runs
  IFS=';' read -r -a variants <<<"${KILN_FP8_VARIANTS:-}"
  runs=(bf16 fp8)
  for v in $(seq ${#variants[@]}); do runs+=("fp8v$v"); done
  for r in $(seq "${KILN_FP8_ROUNDS:-1}"); do
    for p in "${runs[@]}"; do
      extra=()
      # shellcheck disable=SC2206 # (flags: words)
      [ "$p" = fp8 ] && extra=(--precision=fp8 ${KILN_FP8_FLAGS:-})
      # shellcheck disable=SC2206
      [[ $p == fp8v* ]] && extra=(--precision=fp8 ${KILN_FP8_FLAGS:-} ${variants[${p#fp8v} - 1]})
      dir=/tmp/fp8_${p}_${name}_$r
      rm -rf "$dir"
      timeout -k 10 200 "$BUILD/kiln" train "$@" "${extra[@]}" --data=random --max-steps=30 --warmup=10 --device=cuda \
        --eval-every=0 --checkpoint=0 --save-model=0 --quiet --log-every=1 --out="$dir" >"$OUT/${p}_${name}_$r.log" 2>&1
      rc=$?
      read -r ms tok loss < <(stats "$dir/metrics.jsonl")
      echo "$name $p $r $rc $ms $tok $loss" >>"$OUT/fp8_runs.txt"
      [ $rc -ne 0 ] && tail -3 "$OUT/${p}_${name}_$r.log"
    done
  done
  if [ -n "${KILN_FP8_TORCH:-}" ]; then
    for p in 0 1; do
      # shellcheck disable=SC2086 # (arguments: words)
      PYTHONUNBUFFERED=1 timeout -k 10 300 python3 bench/torch_fp8.py ${TORCH[$name]} --fp8 $p \
        >"$OUT/torch_${name}_fp8$p.log" 2>&1
      python3 -c "
import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')]
print(sys.argv[2], 'torch', r[-1]['precision'], r[-1]['tok_per_s'], r[-1]['peak_mem_GiB'], r[-1]['loss'])" \
        "$OUT/torch_${name}_fp8$p.log" "$name" >>"$OUT/torch_runs.txt" 2>/dev/null ||
        { echo "torch $name fp8=$p failed:"; tail -3 "$OUT/torch_${name}_fp8$p.log"; }
    done
  fi
  python3 - "$name" "$OUT/fp8_runs.txt" "${KILN_FP8_VARIANTS:-}" <<'PY' | tee -a "$OUT/fp8.md"
import statistics, sys
name, path = sys.argv[1], sys.argv[2]
rows = [l.split() for l in open(path) if l.split()[0] == name]
def med(p, i):
    v = [float(r[i]) for r in rows if r[1] == p and r[3] == "0"]
    return statistics.median(v) if v else float("nan")
b, f = med("bf16", 5), med("fp8", 5)
print(f"| {name} fp8 vs bf16 | {f:.0f} vs {b:.0f} tok/s ({f / b:.3f}x); ms {med('fp8', 4):.2f} vs {med('bf16', 4):.2f}; "
      f"loss at step 30 {med('fp8', 6):.4f} vs {med('bf16', 6):.4f} |")
for i, flags in enumerate(v for v in sys.argv[3].split(";") if v):
    p = f"fp8v{i + 1}"
    print(f"| {name} fp8 {flags} vs bf16 | {med(p, 5):.0f} vs {b:.0f} tok/s ({med(p, 5) / b:.3f}x); "
          f"loss at step 30 {med(p, 6):.4f} |")
try:
    t = {r[2]: float(r[3]) for r in (l.split() for l in open(path.replace("fp8_runs", "torch_runs"))) if r[0] == name}
    print(f"| {name} PyTorch (torch.compile, _scaled_mm) fp8 vs bf16 | {t['fp8']:.0f} vs {t['bf16']:.0f} tok/s "
          f"({t['fp8'] / t['bf16']:.3f}x); kiln fp8 / PyTorch fp8 {f / t['fp8']:.3f}x |")
except (OSError, KeyError, ZeroDivisionError):
    pass
PY
done
echo
cat "$OUT/fp8.md"
