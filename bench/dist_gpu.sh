#!/usr/bin/env bash
# One GPU call for the comm layer (docs/benchmarks.md, "Many processes"): build, the GPU tests that the comm
# layer touched, the NCCL path at world size 1 against no comm layer (GPT-2 124M and the 1.3B shape), and two
# ranks sharing the one GPU over MPI (DDP, ZeRO-1, ZeRO-2) against one rank. Logs in $OUT; a table last.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kiln-dist}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
# shellcheck source=bench/gpu_lib.sh
. bench/gpu_lib.sh
gpu_deps
BUILD=${BUILD:-build-gpu}
echo "mpi on this machine: $(command -v mpirun || echo no mpirun), $(ls /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h 2>/dev/null || echo no mpi.h)"
t0=$(date +%s)
gpu_build
echo "build: ok in $(($(date +%s) - t0)) s; $(grep -E "MPI|NCCL" "$OUT/build.log" | head -3)"
"$BUILD/kiln" info 2>&1 | grep -i "comm\|gpu 0" | head -3

# the CUDA ops the change touched (AdamW's state offsets) and the whole-model checks against the CPU
KILN_TEST_FILTER="*adamw*" timeout 120 "$BUILD/test_cuda_ops" >"$OUT/test_adamw.log" 2>&1
echo "test_cuda_ops adamw: exit $?, $(grep -c '\[       OK \]' "$OUT/test_adamw.log") ok, $(grep -c FAILED "$OUT/test_adamw.log") failed lines"
timeout 200 "$BUILD/test_cuda_model" >"$OUT/test_model.log" 2>&1
echo "test_cuda_model: exit $?, $(grep -c '\[       OK \]' "$OUT/test_model.log") ok, $(grep -E '^\[  FAILED  \] [0-9]' "$OUT/test_model.log")"

median() { # median ms of metrics.jsonl after 10 steps, and the last loss
  python3 - "$1" <<'PY'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f'{statistics.median(r["ms"] for r in rows[10:]):.2f} {rows[-1]["loss"]:.5f}')
PY
}
echo "| run | comm | ms/step | tok/s | last loss |" >"$OUT/table.md"
bench() { # name comm tokens args...
  local name=$1 comm=$2 tokens=$3
  shift 3
  timeout 240 "$BUILD/kiln" train "$@" --data=random --seq=1024 --max-steps=40 --warmup=10 --device=cuda --eval-every=0 \
    --checkpoint=0 --quiet --log-every=1 --comm="$comm" --out="/tmp/dist_${name}_$comm" >"$OUT/$name-$comm.log" 2>&1 ||
    { echo "| $name | $comm | failed: $(tail -1 "$OUT/$name-$comm.log") |" >>"$OUT/table.md"; return; }
  read -r ms loss < <(median "/tmp/dist_${name}_$comm/metrics.jsonl")
  echo "| $name | $comm | $ms | $(python3 -c "print(round($tokens/($ms/1e3)))") | $loss |" >>"$OUT/table.md"
}
for rep in 1 2; do # alternated, twice: the machine's drift shows as the spread
  bench "124m-r$rep" single 32768 --preset=gpt2-124m --batch=32
  bench "124m-r$rep" nccl 32768 --preset=gpt2-124m --batch=32
done
for rep in 1 2; do
  bench "1.3b-r$rep" single 8192 --preset=gpt2-124m --layers=24 --dim=2048 --heads=16 --batch=8
  bench "1.3b-r$rep" nccl 8192 --preset=gpt2-124m --layers=24 --dim=2048 --heads=16 --batch=8
done

# two ranks sharing the GPU over MPI (staged through host memory) against one rank, same global batch
if command -v mpirun >/dev/null && grep -q "kiln_core.*MPI\|MPI_C" "$BUILD/CMakeCache.txt"; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  a=(--layers=2 --heads=4 --dim=128 --seq=64 --batch=4 --total-batch=1024 --max-steps=10 --eval-every=0 --quiet
    --log-every=1 --device=cuda --deterministic=1 --bucket-mb=0.05 --schedule=constant --warmup=0 --lr=1e-3)
  "$BUILD/kiln" train "${a[@]}" --out=/tmp/sh1 >"$OUT/share1.log" 2>&1
  for z in 0 1 2; do
    mpirun --oversubscribe --bind-to none -np 2 "$BUILD/kiln" train "${a[@]}" --comm=mpi --zero=$z --out=/tmp/sh2z$z \
      >"$OUT/share2-z$z.log" 2>&1
    echo "2 ranks sharing the GPU, zero $z: exit $?"
  done
  python3 - <<'PY' | tee -a "$OUT/table.md"
import json
def losses(d):
    try:
        return [json.loads(l)["loss"] for l in open(d + "/metrics.jsonl")]
    except Exception as e:
        return []
one = losses("/tmp/sh1")
for z in range(3):
    two = losses(f"/tmp/sh2z{z}")
    d = max((abs(a - b) / a for a, b in zip(one, two)), default=float("nan")) if len(two) == len(one) else float("nan")
    print(f"| shared GPU, 2 ranks zero {z} vs 1 rank | mpi | {len(two)} steps | worst loss rel diff {d:.2e} | {two[-1] if two else 'none'} |")
PY
else
  echo "| shared GPU over MPI | skipped: no MPI in this build or no mpirun here |" >>"$OUT/table.md"
fi
cat "$OUT/table.md"
