#!/usr/bin/env bash
# Tensor parallelism on a machine of several GPUs (2 or 4): the kernels it adds against the CPU, --tp against
# one GPU, and llama-8b at T=8192 under --tp against ZeRO-3 on the same GPUs. Logs in $OUT; a table last.
# KILN_PART (default "tests correct perf"):
#   tests    test_op_table_gpu's rows of the vocabulary-parallel loss and the embedding's vocabulary slice
#   correct  a Llama-shaped model (GQA 8/2, RoPE, RMSNorm, SwiGLU) with deterministic kernels, 12 steps: one
#            GPU against --tp=2, --tp=NG (key/value head copies where NG > 2; off, the default, bulk and
#            ring), and --tp=2 x ZeRO-1 over the rest; the loss at every step (bf16: the sums' order
#            differs, so within 2%)
#   perf     KILN_TP_MODEL (llama-8b) at T=KILN_TP_T (8192), B=1 a data-parallel rank: ZeRO-3 over all GPUs,
#            --tp=NG (the synchronous order, the default), --tp=NG with --tp-overlap=bulk (also with
#            --tp-keep-gathered=1) and =ring, and
#            --tp=2 x ZeRO-3 over NG/2; tok/s a GPU, MFU and peak memory, and each overlap's speed-up over
#            the synchronous order
#   trace    where the time of --tp=NG goes: KILN_TP_MODEL cut to KILN_TP_LAYERS layers (8) at T=KILN_TP_T,
#            B=1, no recompute, 10 steps, each KILN_TP_TRACE variant ("OVERLAP[+keep][:ENV=V,...]": +keep adds
#            --tp-keep-gathered=1; or zero3: ZeRO-3 over the GPUs, the same model's step at full GEMM sizes;
#            default: zero3, off, off+keep, bulk, bulk+keep; e.g. bulk:KILN_TP_COPY_ENGINE=1) under
#            KILN_TRACE_COMM: the step time, and per collective the comm stream's busy time and the compute
#            stream's wait for it (bench/overlap.py, rank 0, the first 30% of the trace left out)
#   longest  KILN_TP_MODEL at each of KILN_TP_LONG_LENGTHS (262144 524288), B=1, the whole node on one
#            sequence: tensor parallelism (--tp=NG, with its sequence parallelism) beside Ulysses
#            (--sp=NG --zero=3), each with the optimizer and the layers' inputs in host memory
#            (--offload=all) and --recompute=auto, 2 steps (the second timed): ms a step, tok/s a GPU, peak
#            GiB, or the one-line error (out of memory) where it does not train
# KILN_DEADLINE (seconds, default 560): runs that would end later are skipped and say so.
set -u
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-/tmp/kiln-tp}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
# shellcheck source=bench/gpu_lib.sh
. bench/gpu_lib.sh
gpu_deps
BUILD=${BUILD:-build-gpu}
t0=$(date +%s)
NG=${KILN_NG:-$(nvidia-smi -L | wc -l)}
gpu_build kiln test_op_table_gpu
echo "GPUs: $NG; build: ok in $(($(date +%s) - t0)) s"
K="$BUILD/kiln"
PART=" ${KILN_PART:-tests correct perf} "
has() { [[ $PART == *" $1 "* ]]; }
DEADLINE=${KILN_DEADLINE:-560}
intime() {
  [ $(($(date +%s) - t0 + $1)) -le "$DEADLINE" ] && return 0
  echo "| $2 | skipped: the deadline (${DEADLINE} s) |" | tee -a "$OUT/table.md"
  return 1
}
echo "| run | result |" >"$OUT/table.md"
echo "| --- | --- |" >>"$OUT/table.md"

if has tests; then
  KILN_OP_TABLE_ROWS=embedding,cross_entropy_parallel timeout -k 10 200 "$BUILD/test_op_table_gpu" >"$OUT/op_table.log" 2>&1
  echo "| test_op_table_gpu (embedding, cross_entropy_parallel) | exit $?: $(grep -c ' PASS' "$OUT/op_table.log") PASS, $(grep -c ' FAIL' "$OUT/op_table.log") FAIL |" |
    tee -a "$OUT/table.md"
  grep ' FAIL' "$OUT/op_table.log" | head -5
fi

if has correct; then
  a=(--layers=4 --heads=8 --kv-heads=2 --dim=512 --pos=rope --norm=rmsnorm --mlp=swiglu --bias=0 --tie-embeddings=0
    --seq=256 --block-size=256 --batch=4 --max-steps=12 --eval-every=0 --quiet --log-every=1 --device=cuda
    --deterministic=1 --schedule=constant --warmup=0 --lr=1e-3 --checkpoint=0 --data=random)
  timeout -k 10 120 "$K" train "${a[@]}" --out=/tmp/tp1 >"$OUT/tp1.log" 2>&1
  runs=("2:--tp=2" "$NG:--tp=$NG" "$NG:--tp=$NG --tp-overlap=bulk" "$NG:--tp=$NG --tp-overlap=ring")
  [ "$NG" -ge 4 ] && runs+=("$NG:--tp=2 --zero=1 --total-batch=$((4 * 256 * NG / 2))")
  for r in "${runs[@]}"; do
    n=${r%%:*}
    flags=${r#*:}
    name=$(echo "$flags" | tr -d ' -' | tr '=' '_')
    ref=/tmp/tp1
    if [[ $flags == *total-batch* ]]; then # the single GPU takes the same tokens a step in micro-steps
      ref=/tmp/tp1acc
      [ -e $ref/metrics.jsonl ] || timeout -k 10 120 "$K" train "${a[@]}" --total-batch=$((4 * 256 * NG / 2)) --out=$ref >"$OUT/tp1acc.log" 2>&1
    fi
    # shellcheck disable=SC2086 # (flags: words)
    timeout -k 10 150 "$K" launch --nproc-per-node="$n" --max-restarts=0 -- "${a[@]}" $flags --out=/tmp/$name >"$OUT/$name.log" 2>&1
    rc=$?
    res=$(python3 - "$ref" "/tmp/$name" <<'PY' 2>&1
import json, sys
def losses(d):
    return {r["step"]: r["loss"] for r in map(json.loads, open(d + "/metrics.jsonl")) if "loss" in r}
a, b = losses(sys.argv[1]), losses(sys.argv[2])
worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in a)
print(f"worst loss rel diff {worst:.2e} over {len(a)} steps (step 1: {a[1]:.5f} vs {b[1]:.5f}; step 12: {a[12]:.5f} vs {b[12]:.5f}): {'ok' if worst < 0.02 else 'FAIL'}")
PY
)
    echo "| $flags on $n GPUs against 1 | exit $rc: $res |" | tee -a "$OUT/table.md"
    [ $rc -ne 0 ] && tail -3 "$OUT/$name.log"
  done
fi

# median ms and tok/s after the first quarter of the steps, the peak GiB and the MFU of a run's metrics
kstats() {
  python3 - "$1" <<'PY' 2>/dev/null || echo "nan nan nan nan"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"ms"' in l]
late = rows[len(rows) // 4:] or rows
print(f'{statistics.median(r["ms"] for r in late):.2f} {statistics.median(r["tokens_per_s"] for r in late):.0f} '
      f'{max(r["peak_mem_bytes"] for r in rows) / 2**30:.1f} {100 * statistics.median(r.get("mfu", 0) for r in late):.1f}')
PY
}

if has perf; then
  m=${KILN_TP_MODEL:-llama-8b}
  T=${KILN_TP_T:-8192}
  declare -A tokof
  for flags in "--zero=3" "--tp=$NG" "--tp=$NG --tp-overlap=bulk" "--tp=$NG --tp-overlap=bulk --tp-keep-gathered=1" \
    "--tp=$NG --tp-overlap=ring" "--tp=2 --zero=3"; do
    intime 90 "$m $flags" || continue
    rm -rf /tmp/tpperf
    # shellcheck disable=SC2086 # (flags: words)
    timeout -k 20 200 "$K" launch --nproc-per-node="$NG" --max-restarts=0 -- --preset="$m" --seq="$T" --block-size="$T" --batch=1 \
      $flags --recompute="${KILN_TP_RECOMPUTE:-auto}" --data=random --max-steps=8 --warmup=2 --device=cuda --eval-every=0 \
      --checkpoint=0 --save-model=0 --quiet --log-every=1 --out=/tmp/tpperf >>"$OUT/perf.log" 2>&1
    rc=$?
    read -r ms tok gib mfu < <(kstats /tmp/tpperf/metrics.jsonl)
    [ $rc -eq 0 ] && tokof[$flags]=$tok
    took=$(grep -o 'recompute=auto: [a-z]*' "$OUT/perf.log" | tail -1)
    echo "| $m T=$T $flags, $NG GPUs ${took:+($took)} | exit $rc: $(python3 -c "print(round($tok / $NG))" 2>/dev/null) tok/s per GPU, MFU $mfu%, $gib GiB, $ms ms/step |" |
      tee -a "$OUT/table.md"
    [ $rc -ne 0 ] && grep -v '^\s' "$OUT/perf.log" | tail -2
  done
  off=${tokof[--tp=$NG]:-}
  for o in bulk "bulk --tp-keep-gathered=1" ring; do
    v=${tokof[--tp=$NG --tp-overlap=$o]:-}
    [ -n "$v" ] && [ -n "$off" ] &&
      echo "| $m T=$T --tp=$NG: --tp-overlap=$o against the synchronous order (off, the default) | $(python3 -c "print(f'{$v / $off:.3f}x')") |" |
      tee -a "$OUT/table.md"
  done
fi
if has longest; then
  m=${KILN_TP_MODEL:-llama-8b}
  for T in ${KILN_TP_LONG_LENGTHS:-262144 524288}; do
    for flags in "--tp=$NG" "--sp=$NG --sp-mode=ulysses --zero=3"; do
      intime 120 "$m T=$T $flags" || continue
      rm -rf /tmp/tplong
      log="$OUT/longest_${T}_${flags%% *}.log"
      log=${log//=/}
      # shellcheck disable=SC2086 # (flags: words)
      timeout -k 20 "$((DEADLINE - $(date +%s) + t0))" "$K" launch --nproc-per-node="$NG" --max-restarts=0 -- \
        --preset="$m" --seq="$T" --block-size="$T" --batch=1 $flags --offload=all --recompute=auto --data=random \
        --max-steps=2 --warmup=1 --device=cuda --eval-every=0 --checkpoint=0 --save-model=0 --quiet --log-every=1 \
        --out=/tmp/tplong >"$log" 2>&1
      rc=$?
      took=$(grep -o 'recompute=auto: [a-z]*' "$log" | tail -1)
      if [ $rc -eq 0 ] && [ -s /tmp/tplong/metrics.jsonl ]; then
        r=$(python3 - /tmp/tplong/metrics.jsonl "$NG" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"ms"' in l]
last = rows[-1]
print(f'{last["ms"]:.0f} ms a step, {last["tokens_per_s"] / int(sys.argv[2]):.0f} tok/s per GPU, '
      f'{max(x["peak_mem_bytes"] for x in rows) / 2**30:.1f} GiB')
PY
)
      else
        r="exit $rc: $(grep -m1 -i 'error' "$log" | tail -c 200)"
      fi
      echo "| $m T=$T $flags --offload=all ${took:+($took)} | $r |" | tee -a "$OUT/table.md"
    done
  done
fi

if has trace; then
  m=${KILN_TP_MODEL:-llama-8b}
  T=${KILN_TP_T:-8192}
  L=${KILN_TP_LAYERS:-8}
  tr=(--preset="$m" --layers="$L" --seq="$T" --block-size="$T" --batch=1 --recompute=none --data=random --max-steps=10
    --warmup=2 --device=cuda --eval-every=0 --checkpoint=0 --save-model=0 --quiet --log-every=1 --out=/tmp/tptrace)
  for v in ${KILN_TP_TRACE:-zero3 off off+keep bulk bulk+keep}; do
    intime 40 "$m/$L layers $v" || continue
    ov=${v%%:*} envs=()
    [[ $v == *:* ]] && IFS=, read -ra envs <<<"${v#*:}"
    flags=(--tp="$NG" --tp-overlap="${ov%+keep}")
    [[ $ov == *+keep ]] && flags+=(--tp-keep-gathered=1)
    [ "$ov" = zero3 ] && flags=(--zero=3)
    rm -rf /tmp/tptrace /tmp/tptrace.csv*
    env "${envs[@]}" KILN_TRACE_COMM=/tmp/tptrace.csv timeout -k 20 150 "$K" launch --nproc-per-node="$NG" --max-restarts=0 -- \
      "${tr[@]}" "${flags[@]}" >>"$OUT/trace.log" 2>&1
    rc=$?
    read -r ms tok gib mfu < <(kstats /tmp/tptrace/metrics.jsonl)
    cp /tmp/tptrace.csv.rank0 "$OUT/trace_${v//[:=,]/_}.csv" 2>/dev/null
    loss=$(grep -o '"loss":[-0-9.e]*' /tmp/tptrace/metrics.jsonl 2>/dev/null | tail -1) # (the same data: runs agree)
    echo "| $m, $L layers, T=$T, ${flags[*]} ${envs[*]} | exit $rc: $ms ms/step, MFU $mfu%, $gib GiB, last ${loss:-loss n/a} |" |
      tee -a "$OUT/table.md"
    [ -f /tmp/tptrace.csv.rank0 ] && python3 bench/overlap.py /tmp/tptrace.csv.rank0 30% | sed 's/^/    /' | tee -a "$OUT/table.md"
  done
  # (with NCCL_DEBUG=INFO in a variant's environment, NCCL names the collectives it runs on the copy engines)
  n=$(grep -c 'Copy Engine' "$OUT/trace.log")
  [ "$n" -gt 0 ] && echo "| NCCL's log: $n lines name the copy engine |" | tee -a "$OUT/table.md"
fi
echo
cat "$OUT/table.md"
