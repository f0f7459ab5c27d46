#!/usr/bin/env bash
# The Hopper attention kernels under Nsight Compute, where their time goes: attn_bench at one long shape
# (B=1, T, 16 heads of 128, causal), the first launches of the kernels matching a regex profiled with the
# sections that say what bounds a kernel (speed of light, compute and memory workload, warp states,
# schedulers, occupancy). Prints, per kernel: its time, SM and memory throughput, tensor-pipe use, issue
# activity and the warp stall reasons that cost the most. Needs ncu (Nsight Compute) on a Hopper GPU and a build
# with attn_bench.
#   bash bench/profile_attn.sh [T (32768)] [kernel regex ('wg_(fwd|bwd)_kernel')] [launches (2)]
# KILN_WGMMA_FWD, KILN_WGMMA_DQ and the like pass through, so one variant at a time can be profiled; only the
# first launches match, which are attn_bench's `wgmma` path (the defaults), run once before its timing loop.
# Writes $OUT/prof_attn_T.csv (raw, every collected metric) and prints the summary.
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/kiln-bench}
BUILD=${BUILD:-build-gpu}
T=${1:-32768}
KERNELS=${2:-'wg_(fwd|bwd)_kernel'}
N=${3:-2}
mkdir -p "$OUT"
csv="$OUT/prof_attn_$T.csv"
timeout 500 ncu --clock-control none -k "regex:$KERNELS" -c "$N" --section SpeedOfLight \
  --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats \
  --section SchedulerStats --section Occupancy \
  --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active --csv --page raw "$BUILD/attn_bench" 1 "$T" 16 128 \
  >"$csv" 2>"$OUT/prof_attn_$T.err" ||
  { echo "profile at T=$T failed: $(tail -3 "$OUT/prof_attn_$T.err")"; exit 1; }
python3 bench/profile_attn_summary.py "$csv"
