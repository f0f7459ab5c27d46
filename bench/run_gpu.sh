#!/usr/bin/env bash
# One GPU call (see docs/benchmarks.md): build, run the GPU tests, time kiln at the PyTorch baseline's shapes.
#   bash bench/run_gpu.sh [build|wgmma|test|kiln|family|torch|all]...     (default: all but wgmma)
# Logs go to $OUT (a folder the caller collects) or /tmp/kiln-bench; the short table is printed last.
# ONLY="350m 1.5b" times only those kiln shapes.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kiln-bench}
RUNS=${RUNS:-$OUT} # run directories (metrics.jsonl); RUNS=/tmp/... keeps them out of $OUT
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
stages=${*:-all}
has() { [[ " $stages " == *" $1 "* || (" $stages " == *" all "* && $1 != wgmma) ]]; }
# shellcheck source=bench/gpu_lib.sh
. bench/gpu_lib.sh
gpu_deps
BUILD=${BUILD:-build-gpu}
if has build; then
  t0=$(date +%s)
  gpu_build
  echo "build: ok in $(( $(date +%s) - t0 )) s"
fi
if has wgmma; then # the Hopper attention kernels alone, under a timeout (a synchronisation bug hangs)
  for t in wgmma_matches wgmma_backward; do
    KILN_TEST_SKIP= KILN_TEST_FILTER="*$t*" KILN_SOURCE_DIR=$PWD timeout 90 "$BUILD/test_cuda_ops" >"$OUT/test_$t.log" 2>&1
    echo "$t: exit $?, $(grep -c " PASS" "$OUT/test_$t.log") PASS lines"; grep -E "FAIL|kiln:|PASSED|path" "$OUT/test_$t.log" | head -24
  done
fi
if has test; then
  (cd "$BUILD" && ctest -L gpu -V --timeout 300) >"$OUT/gpu_tests.log" 2>&1
  echo "gpu tests: exit $?, $(grep -c " PASS" "$OUT/gpu_tests.log") PASS lines"
  grep -E "FAIL|tests passed|Failed|skipped" "$OUT/gpu_tests.log" | tail -30
fi
median_ms() { # median step time of metrics.jsonl, skipping the first 10 steps
  python3 - "$1" <<'PY'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1])]
ms = [r["ms"] for r in rows[10:]] or [r["ms"] for r in rows]
r = rows[-1]
med = statistics.median(ms)
mfu = r.get("mfu", 0) * r["ms"] / med  # mfu is proportional to 1/ms: the median step's MFU
print(f'{med:.2f} {mfu:.4f} {r.get("peak_mem_bytes", 0)/2**30:.2f} {r["loss"]:.4f}')
PY
}
SHAPES=("124m gpt2-124m 32 --layers=12" "350m gpt2-350m 16 --layers=24" "1.5b gpt2-1.5b 8 --layers=48"
        "1.3b gpt2-124m 8 --layers=24 --dim=2048 --heads=16")
# every shape again keeping the GELU's output per layer (--recompute=none; the default is act)
[ -n "${KILN_BENCH_NONE:-}" ] && SHAPES+=("124m-none gpt2-124m 32 --layers=12 --recompute=none"
  "350m-none gpt2-350m 16 --layers=24 --recompute=none" "1.5b-none gpt2-1.5b 8 --layers=48 --recompute=none"
  "1.3b-none gpt2-124m 8 --layers=24 --dim=2048 --heads=16 --recompute=none")
if has kiln; then
  echo "| shape | kiln ms/step | kiln tok/s | mfu | peak GiB | loss |" >"$OUT/kiln_table.md"
  for s in "${SHAPES[@]}"; do
    set -- $s
    name=$1 preset=$2 B=$3
    shift 3
    [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]] && continue
    timeout 240 "$BUILD/kiln" train --preset="$preset" "$@" --data=random --batch="$B" --seq=1024 --max-steps=30 \
      --warmup=10 --device=cuda --eval-every=0 --checkpoint=0 --quiet --out="$RUNS/run_$name" >"$OUT/kiln_$name.log" 2>&1
    rc=$?
    if [ $rc -ne 0 ]; then echo "| $name | failed (exit $rc): $(tail -1 "$OUT/kiln_$name.log") |" >>"$OUT/kiln_table.md"; continue; fi
    read -r ms mfu mem loss < <(median_ms "$RUNS/run_$name/metrics.jsonl")
    tok=$(python3 -c "print(round($B*1024/($ms/1e3)))")
    echo "| $name B=$B | $ms | $tok | $mfu | $mem | $loss |" >>"$OUT/kiln_table.md"
    rm -f "$RUNS/run_$name/model.safetensors"
  done
fi
if has family; then
  # issue 5: llama-1b-style training next to a like-for-like PyTorch baseline, parallel (fused input projection,
  # and its two-GEMM form) vs sequential blocks at the 1.3B shape, and the cost of RoPE/ALiBi inside attention
  echo "| run | ms/step | tok/s | mfu | mem GiB |" >"$OUT/family_table.md"
  fam() { # name, kiln args...
    local name=$1
    shift
    timeout 240 "$BUILD/kiln" train "$@" --data=random --max-steps=30 --warmup=10 --device=cuda --eval-every=0 \
      --checkpoint=0 --quiet --out="$RUNS/run_$name" >"$OUT/kiln_$name.log" 2>&1 || { echo "| kiln $name | failed |" >>"$OUT/family_table.md"; return; }
    read -r ms mfu mem loss < <(median_ms "$RUNS/run_$name/metrics.jsonl")
    echo "| kiln $name | $ms | $(python3 -c "print(round($TOKENS/($ms/1e3)))") | $mfu | $mem |" >>"$OUT/family_table.md"
    rm -f "$RUNS/run_$name/model.safetensors"
  }
  TOKENS=8192 fam llama-1b --preset=llama-1b --batch=4 --seq=2048
  TOKENS=8192 fam 1.3b-seq --preset=gpt2-124m --layers=24 --dim=2048 --heads=16 --batch=8 --seq=1024
  TOKENS=8192 fam 1.3b-parallel --preset=gpt2-124m --layers=24 --dim=2048 --heads=16 --batch=8 --seq=1024 --block=parallel
  KILN_PARALLEL_FUSED=0 TOKENS=8192 fam 1.3b-parallel-unfused --preset=gpt2-124m --layers=24 --dim=2048 --heads=16 \
    --batch=8 --seq=1024 --block=parallel
  PYTHONUNBUFFERED=1 timeout 300 python3 bench/torch_llama.py --layers 16 --dim 2048 --heads 32 --kv-heads 8 \
    --hidden 8192 --seq 2048 --batch 4 >"$OUT/torch_llama.log" 2>&1
  python3 - "$OUT/torch_llama.log" >>"$OUT/family_table.md" <<'PY'
import json, sys
try:
    r = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])
    print(f'| torch llama-1b | {r["ms_per_step"]} | {r["tok_per_s"]} | {r["mfu_989"]} | {r["peak_mem_GiB"]} |')
except Exception as e:
    print(f"| torch llama-1b | failed: {e} |")
PY
  timeout 200 "$BUILD/attn_bench" pos >"$OUT/attn_pos.log" 2>&1
  grep -E " new  " "$OUT/attn_pos.log" | cut -c1-130
fi
if has torch; then
  echo "| shape | torch ms/step | torch tok/s | mfu | peak GiB |" >"$OUT/torch_table.md"
  for s in "124m 12 768 12 32" "350m 24 1024 16 16" "1.5b 48 1600 25 8" "1.3b 24 2048 16 8"; do
    set -- $s
    PYTHONUNBUFFERED=1 timeout 300 python3 .peer/bench/torch_gpt.py --layers "$2" --dim "$3" --heads "$4" --batch "$5" \
      >"$OUT/torch_$1.log" 2>&1
    python3 - "$OUT/torch_$1.log" "$1" "$5" >>"$OUT/torch_table.md" <<'PY'
import json, sys
try:
    r = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])
    print(f'| {sys.argv[2]} B={sys.argv[3]} | {r["ms_per_step"]} | {r["tok_per_s"]} | {r["mfu_989"]} | {r["peak_mem_GiB"]} |')
except Exception as e:
    print(f"| {sys.argv[2]} | failed: {e} |")
PY
  done
fi
for f in "$OUT"/kiln_table.md "$OUT"/torch_table.md "$OUT"/family_table.md; do [ -f "$f" ] && cat "$f"; done
exit 0
