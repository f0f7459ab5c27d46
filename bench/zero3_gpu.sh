#!/usr/bin/env bash
# One GPU call for ZeRO-3 and the offloaded optimizer (docs/benchmarks.md, "ZeRO-3 and offload"): build, the GPU
# tests they touch (AdamW's compact shards, the model against the CPU, two ranks sharing the GPU at every --zero
# level and with offload), then at the 1.3B shape: plain single-GPU training, NCCL at world size 1 with ZeRO-0
# and ZeRO-3 (prefetch 1 and 2), and the offloaded optimizer; and the largest models on one GPU with offload
# (KILN_BIG="olmo-7b llama-8b" to ask for them), and the hang watchdog on NCCL. KILN_PART=tests|fsdp|offload|
# hang|trace|all picks what runs; z3one is fsdp's first rows alone (plain against ZeRO-3 over NCCL at world
# size 1, alternated, twice: issue 14's "at most 3% slower"). Logs in $OUT
# (few files: the device returns at most 8), each table row printed as soon as it is measured, the table last.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kiln-zero3}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# shellcheck source=bench/gpu_lib.sh
. bench/gpu_lib.sh
gpu_deps
BUILD=${BUILD:-build-gpu}
t0=$(date +%s)
gpu_build kiln test_cuda_ops test_cuda_model
PART=${KILN_PART:-all}
echo "build: ok in $(($(date +%s) - t0)) s"

if [ "$PART" = tests ] || [ "$PART" = all ]; then
  KILN_TEST_FILTER="*adamw*" timeout 120 "$BUILD/test_cuda_ops" >"$OUT/tests.log" 2>&1
  echo "test_cuda_ops adamw: exit $?, $(grep -c PASS "$OUT/tests.log") PASS lines, $(grep -c FAIL "$OUT/tests.log") FAIL"
  timeout 200 "$BUILD/test_cuda_model" >>"$OUT/tests.log" 2>&1
  echo "test_cuda_model: exit $?, $(grep -E '^\[  FAILED  \] [0-9]' "$OUT/tests.log")"
  timeout 300 bash tests/cli/test_dist_gpu_mpi.sh "$BUILD/kiln" >>"$OUT/tests.log" 2>&1
  echo "test_dist_gpu_mpi: exit $?"
  grep -E "FAIL|worst|passed," "$OUT/tests.log" | tail -14
fi

stats() { # median ms after the first 5 steps, the last loss, the peak GiB, and (offload) the host step's and
  # the wait's medians in ms ("-" without offload)
  python3 - "$1" <<'PY'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1])]
late = rows[min(5, len(rows) - 1):]
off = [r for r in late if "offload_ms" in r]
host = (f'{statistics.median(r["offload_ms"] for r in off):.1f}/{statistics.median(r["offload_wait_ms"] for r in off):.1f}'
        f'/{statistics.median(r.get("offload_copy_gbps", 0) for r in off):.1f}') if off else "-"
print(f'{statistics.median(r["ms"] for r in late):.2f} {rows[-1]["loss"]:.5f} {rows[-1]["peak_mem_bytes"] / 2**30:.2f} {host}')
PY
}
echo "| run | ms/step | tok/s | last loss | peak GiB (GPU) | host RSS GiB | host step / waited ms / copies GB/s |" >"$OUT/table.md"
echo "| --- | --- | --- | --- | --- | --- | --- |" >>"$OUT/table.md"
TIMEV=()
[ -x /usr/bin/time ] && TIMEV=(/usr/bin/time -v) # the host's peak resident memory, where the machine has it
bench() { # name tokens-per-step steps args...
  local name=$1 tokens=$2 steps=$3
  shift 3
  local dir="/tmp/z3_$name"
  rm -rf "$dir"
  "${TIMEV[@]}" timeout 400 "$BUILD/kiln" train "$@" --data=random --max-steps="$steps" --warmup=2 --device=cuda \
    --eval-every=0 --checkpoint=0 --save-model=0 --quiet --log-every=1 --out="$dir" >"$OUT/run.log" 2>&1 ||
    { echo "| $name | failed: $(grep -v "^\s" "$OUT/run.log" | tail -1) |" | tee -a "$OUT/table.md"; cat "$OUT/run.log" >>"$OUT/runs.log"; return; }
  { echo "== $name"; cat "$OUT/run.log" "$dir/metrics.jsonl"; } >>"$OUT/runs.log"
  local rss
  rss=$(grep "Maximum resident" "$OUT/run.log" | awk '{printf "%.1f", $6 / 1048576}')
  rss=${rss:-?}
  read -r ms loss gib host < <(stats "$dir/metrics.jsonl")
  echo "| $name | $ms | $(python3 -c "print(round($tokens/($ms/1e3)))") | $loss | $gib | $rss | $host |" | tee -a "$OUT/table.md"
}
s13=(--preset=gpt2-124m --layers=24 --dim=2048 --heads=16 --seq=1024 --batch=8)
if [ "$PART" = z3one ]; then
  for rep in 1 2; do # alternated, twice: the machine's drift shows as the spread
    bench "1.3b-plain-r$rep" 8192 25 "${s13[@]}"
    bench "1.3b-nccl-z3-r$rep" 8192 25 "${s13[@]}" --comm=nccl --zero=3
  done
fi
if [ "$PART" = fsdp ] || [ "$PART" = all ] || [ "$PART" = trace ]; then
  if [ "$PART" != trace ]; then
    for rep in 1 2; do # alternated, twice: the machine's drift shows as the spread
      bench "1.3b-plain-r$rep" 8192 25 "${s13[@]}"
      bench "1.3b-nccl-z3-r$rep" 8192 25 "${s13[@]}" --comm=nccl --zero=3
    done
    bench "1.3b-nccl-z0" 8192 25 "${s13[@]}" --comm=nccl
    bench "1.3b-nccl-z3-pf2" 8192 25 "${s13[@]}" --comm=nccl --zero=3 --prefetch=2
    # FSDP's trade-offs: the layers kept gathered to the backward; whole gradients over 8 micro-steps
    bench "1.3b-nccl-z3-keep" 8192 25 "${s13[@]}" --comm=nccl --zero=3 --zero3-reshard-after-forward=0
    bench "1.3b-nccl-z3-accum8" 65536 8 "${s13[@]}" --comm=nccl --zero=3 --total-batch=65536
    bench "1.3b-nccl-z3-accum8-whole" 65536 8 "${s13[@]}" --comm=nccl --zero=3 --total-batch=65536 \
      --zero3-accumulate=whole
    bench "1.3b-offload" 8192 10 "${s13[@]}" --offload=optimizer
  fi
  # does the prefetch overlap? a CUDA-event trace of each gather against the compute stream (KILN_TRACE_COMM;
  # at world size 1 ZeRO-3 reads its shard in place unless KILN_ZERO3_GATHER=1 makes it gather)
  for pf in 1 2; do
    rm -rf /tmp/z3_trace
    KILN_ZERO3_GATHER=1 KILN_TRACE_COMM=/tmp/z3_trace.csv timeout 200 "$BUILD/kiln" train "${s13[@]}" --comm=nccl --zero=3 \
      --prefetch=$pf --data=random --max-steps=8 --device=cuda --eval-every=0 --checkpoint=0 --save-model=0 \
      --quiet --out=/tmp/z3_trace >/dev/null 2>&1
    echo "prefetch $pf:" | tee -a "$OUT/table.md"
    python3 bench/overlap.py /tmp/z3_trace.csv 1000 2>&1 | tee -a "$OUT/table.md"
  done
fi
if [ "$PART" = offload ] || [ "$PART" = all ]; then
  # the link as the pipeline uses it (pinned, a chunk at a time): what its copies' GB/s is measured against
  [ -x "$BUILD/link_bench" ] || cmake --build "$BUILD" -t link_bench >>"$OUT/build.log" 2>&1
  echo "link (pinned, 128 MiB copies): $("$BUILD/link_bench" 128)" | tee -a "$OUT/table.md"
  [ "$PART" = offload ] && bench "1.3b-offload" 8192 10 "${s13[@]}" --offload=optimizer
  bench "1.3b-plain-accum64" 524288 3 "${s13[@]}" --total-batch=524288
  bench "1.3b-offload-accum64" 524288 3 "${s13[@]}" --offload=optimizer --total-batch=524288
  # KILN_OFFLOAD_THREADS="14 12": the one-micro-step row again with fewer host threads for AdamW (--threads),
  # so that the copy thread and the training thread have cores of their own (the copies' share of the link)
  for n in ${KILN_OFFLOAD_THREADS:-}; do
    bench "1.3b-offload-threads$n" 8192 10 "${s13[@]}" --offload=optimizer --threads="$n"
  done
  for m in ${KILN_BIG:-}; do
    bench "$m-offload" 2048 5 --preset="$m" --seq=2048 --batch=1 --recompute=block --offload=optimizer
  done
fi
if [ "$PART" = hang ] || [ "$PART" = all ]; then # the watchdog on NCCL: a stalled rank dumps and ends the job
  rm -rf /tmp/z3_hang
  t1=$(date +%s)
  timeout 120 "$BUILD/kiln" train --layers=2 --dim=128 --heads=4 --seq=64 --batch=4 --max-steps=50 --device=cuda \
    --comm=nccl --hang-timeout=3 --inject-stall=0:5 --quiet --out=/tmp/z3_hang >"$OUT/run.log" 2>&1
  rc=$?
  echo "| NCCL hang at world size 1 | exit $rc after $(($(date +%s) - t1)) s | dumps: $(ls /tmp/z3_hang/hang 2>/dev/null | tr '\n' ' ') |" |
    tee -a "$OUT/table.md"
  "$BUILD/kiln" doctor /tmp/z3_hang 2>&1 | head -5 | tee -a "$OUT/table.md"
fi
echo "host: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB; $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader)"
cat "$OUT/table.md"
