#!/usr/bin/env bash
# One GPU call for ZeRO-3 and the offloaded optimizer (docs/benchmarks.md, "ZeRO-3 and offload"): build, the GPU
# tests they touch (AdamW's compact shards, the model against the CPU, two ranks sharing the GPU at every --zero
# level and with offload), then at the 1.3B shape: plain single-GPU training, NCCL at world size 1 with ZeRO-0
# and ZeRO-3 (prefetch 1 and 2), and the offloaded optimizer; and the largest models on one GPU with offload
# (KILN_BIG="olmo-7b llama-8b" to ask for them). Logs in $OUT; a table last.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kiln-zero3}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if [ -d .debs ] && ! dpkg -s libcmocka-dev >/dev/null 2>&1; then
  eval "$(bash scripts/gpu-deps.sh .debs /tmp/kiln-deps)"
fi
BUILD=${BUILD:-build-gpu}
t0=$(date +%s)
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA_ARCHS=90a >"$OUT/build.log" 2>&1 &&
  cmake --build "$BUILD" -j "$(nproc)" >>"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "build: ok in $(($(date +%s) - t0)) s"

if [ "${KILN_SKIP_TESTS:-0}" != 1 ]; then
  KILN_TEST_FILTER="*adamw*" timeout 120 "$BUILD/test_cuda_ops" >"$OUT/test_adamw.log" 2>&1
  echo "test_cuda_ops adamw: exit $?, $(grep -c '\[       OK \]' "$OUT/test_adamw.log") ok"
  timeout 200 "$BUILD/test_cuda_model" >"$OUT/test_model.log" 2>&1
  echo "test_cuda_model: exit $?, $(grep -c '\[       OK \]' "$OUT/test_model.log") ok, $(grep -E '^\[  FAILED  \] [0-9]' "$OUT/test_model.log")"
  KILN="$BUILD/kiln" timeout 300 bash tests/cli/test_dist_gpu_mpi.sh "$BUILD/kiln" >"$OUT/test_dist_gpu_mpi.log" 2>&1
  echo "test_dist_gpu_mpi: exit $?, $(tail -1 "$OUT/test_dist_gpu_mpi.log")"
  grep -E "FAIL|worst" "$OUT/test_dist_gpu_mpi.log" | head -20
fi

stats() { # median ms after the first 5 steps, the last loss, the peak bytes, and the peak GiB
  python3 - "$1" <<'PY'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f'{statistics.median(r["ms"] for r in rows[5:]):.2f} {rows[-1]["loss"]:.5f} {rows[-1]["peak_mem_bytes"] / 2**30:.2f}')
PY
}
echo "| run | ms/step | tok/s | last loss | peak GiB (GPU) | host RSS GiB |" >"$OUT/table.md"
echo "| --- | --- | --- | --- | --- | --- |" >>"$OUT/table.md"
TIMEV=()
[ -x /usr/bin/time ] && TIMEV=(/usr/bin/time -v) # the host's peak resident memory, where the machine has it
bench() { # name tokens-per-step steps args...
  local name=$1 tokens=$2 steps=$3
  shift 3
  local dir="/tmp/z3_$name"
  rm -rf "$dir"
  "${TIMEV[@]}" timeout 400 "$BUILD/kiln" train "$@" --data=random --max-steps="$steps" --warmup=2 --device=cuda \
    --eval-every=0 --checkpoint=0 --quiet --log-every=1 --out="$dir" >"$OUT/$name.log" 2>&1 ||
    { echo "| $name | failed: $(grep -v "^\s" "$OUT/$name.log" | tail -1) |" >>"$OUT/table.md"; return; }
  local rss
  rss=$(grep "Maximum resident" "$OUT/$name.log" | awk '{printf "%.1f", $6 / 1048576}')
  rss=${rss:-?}
  read -r ms loss gib < <(stats "$dir/metrics.jsonl")
  echo "| $name | $ms | $(python3 -c "print(round($tokens/($ms/1e3)))") | $loss | $gib | $rss |" >>"$OUT/table.md"
}
s13=(--preset=gpt2-124m --layers=24 --dim=2048 --heads=16 --seq=1024 --batch=8)
for rep in 1 2; do # alternated, twice: the machine's drift shows as the spread
  bench "1.3b-plain-r$rep" 8192 25 "${s13[@]}"
  bench "1.3b-nccl-z0-r$rep" 8192 25 "${s13[@]}" --comm=nccl
  bench "1.3b-nccl-z3-r$rep" 8192 25 "${s13[@]}" --comm=nccl --zero=3
  bench "1.3b-nccl-z3-pf2-r$rep" 8192 25 "${s13[@]}" --comm=nccl --zero=3 --prefetch=2
done
bench "1.3b-offload" 8192 15 "${s13[@]}" --offload=optimizer
bench "1.3b-offload-accum8" 65536 8 "${s13[@]}" --offload=optimizer --total-batch=65536
bench "1.3b-plain-accum8" 65536 8 "${s13[@]}" --total-batch=65536
for m in ${KILN_BIG:-}; do
  bench "$m-offload" 2048 6 --preset="$m" --seq=2048 --batch=1 --recompute=block --offload=optimizer
done
echo "host: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB; $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader)"
cat "$OUT/table.md"
