#!/usr/bin/env bash
# On a machine of several GPUs (2 or 4 GPUs): NCCL data and sequence parallelism for real. kiln launch
# starts one rank per GPU (torchrun-style environment, NCCL's id over the TCP store). Logs in $OUT; a table last.
# KILN_PART is a list of what runs (issue 17's runs):
#   tests    test_cuda_ops' attention-block cases (the f32 and the tensor-core kernels against the CPU) and
#            wgmma cases (dQ by REDs and by TMA), then attn_bench: the block kernels on a 64k ring step, and
#            wgmma (dQ by TMA) against wgmma-red at 64k
#   correct  DDP, ZeRO-1/2/3, Ulysses and ring against one GPU at the same global batch (deterministic
#            kernels), and a checkpoint written on N GPUs resumed on 1 (KILN_CORRECT_ZERO, KILN_CORRECT_SP
#            and KILN_CORRECT_MPI= pick fewer: the ZeRO levels, the SP runs, the MPI ring off)
#   scale    weak scaling (the same micro-batch per GPU) at KILN_SCALE_SHAPES (124m 350m 1.3b): kiln on 1 GPU
#            and DDP, ZeRO-1/2/3 (KILN_SCALE_ZERO) on all of them, fp32 gradients everywhere; PyTorch (torch.compile) on 1 GPU,
#            DDP and FSDP2 under torchrun beside them; then kiln's DDP with NCCL held to fewer channels
#            or bf16 gradients (KILN_SCALE_NCCL_ENV; at --zero=KILN_SCALE_ENV_ZERO, default 0) and a trace of its
#            exposed communication (KILN_SCALE_TRACE=1); KILN_SCALE_TORCH= leaves PyTorch's rows out
#   weak     the older weak-scaling rows (DDP/ZeRO-1/2, fp32 and bf16 gradients, 124m and 350m)
#   zero3    ZeRO-3 weak scaling against ZeRO-3 on 1 GPU, PyTorch FSDP2 beside it
#   big      olmo-7b and llama-8b under ZeRO-3 at KILN_BIG_LENGTHS (4096 8192), --recompute=KILN_BIG_RECOMPUTE
#            (auto: the least that fits; the 4-GPU runs of 2026-11-26 took selective), KILN_BIG_BATCH sequences a GPU (1), KILN_BIG_MODELS,
#            KILN_BIG_FLAGS (more kiln flags, e.g. --reduce-dtype=bf16);
#            PyTorch FSDP2 beside llama-8b (KILN_BIG_TORCH= turns it off)
#   long     the 1.3B shape under KILN_LONG_MODES (ulysses ring hybrid; ring-tc, hybrid-tc: the ring's blocks on
#            the tensor-core kernels, not the Hopper ones) at KILN_LONG_LENGTHS (128k up), --recompute=
#            KILN_LONG_RECOMPUTE (selective; auto from 1M), PyTorch's context parallelism beside it (bench/torch_cp.py)
#   faults   a SIGKILLed rank resumed by kiln launch, a stalled rank named by kiln doctor, a checkpoint of N
#            GPUs resumed on 2 and on 1
#   all      correct and weak (the first multi-GPU runs)
# KILN_BUILD_TARGETS: build only these (e.g. kiln), not every target.
# KILN_DRY=1: no GPU and no training; every kiln run is checked by `kiln info` (bench/kiln_dry.sh, test_bench_dry).
# KILN_DEADLINE (seconds from the start, default 560): a run that would start later is skipped and says so,
# so one run always ends with its table.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kiln-multi}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
# shellcheck source=bench/gpu_lib.sh
. bench/gpu_lib.sh
gpu_deps
BUILD=${BUILD:-build-gpu}
t0=$(date +%s)
if [ -n "${KILN_DRY:-}" ]; then
  # KILN_DRY=1: no GPU, no training. Every kiln run goes to bench/kiln_dry.sh, which checks its options with
  # `kiln info` (the build in $BUILD, as it is) and notes any it refuses in $KILN_DRY_LOG, so that a bad flag
  # shows here and not on the GPU machine (tests/cli/test_bench_dry.sh).
  NG=${KILN_NG:-4}
  export KILN_REAL="$BUILD/kiln" KILN_DRY_LOG=${KILN_DRY_LOG:-$OUT/dry.log}
  : >"$KILN_DRY_LOG"
  K=bench/kiln_dry.sh
  echo "GPUs: $NG (a dry run)"
else
  NG=${KILN_NG:-$(nvidia-smi -L | wc -l)}
  echo "GPUs: $NG; $(nvidia-smi topo -m 2>/dev/null | head -3 | tail -2 | tr -s ' ' | cut -c1-60)"
  # shellcheck disable=SC2086 # (a list of targets)
  gpu_build ${KILN_BUILD_TARGETS:-}
  echo "build: ok in $(($(date +%s) - t0)) s"
  K="$BUILD/kiln"
fi
echo "| run | result |" >"$OUT/table.md"
PART=" ${KILN_PART:-all} "
[[ $PART == *" all "* ]] && PART="$PART correct weak "
has() { [[ $PART == *" $1 "* ]]; }
DEADLINE=${KILN_DEADLINE:-560}
# intime() is true while a run of about $1 seconds still ends before the deadline; else it notes the skip
intime() {
  [ $(($(date +%s) - t0 + $1)) -le "$DEADLINE" ] && return 0
  echo "| $2 | skipped: the call's deadline (${DEADLINE} s) |" | tee -a "$OUT/table.md"
  return 1
}
# cap N: a run's time limit, N seconds or what is left before the deadline (and 20 s more), whichever is less,
# so that a run which overruns its estimate (a slow kernel, a hang) still leaves the script its table. Each
# limit is `timeout -k 20`: SIGTERM (kiln launch forwards it; a rank in a hang never ends its step), then
# SIGKILL to launch, whose ranks then get their second SIGTERM (PR_SET_PDEATHSIG) and exit at once. (Before
# these, a hung run held its machine for 580 s past a 180 s limit.)
cap() {
  local left=$((DEADLINE + 20 - $(date +%s) + t0))
  [ "$left" -lt 10 ] && left=10
  [ "$1" -lt "$left" ] && left=$1
  echo "$left"
}
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

if has tests; then # the attention kernels written without a GPU, against the CPU, before anything runs on them:
  # the block op's (both families) and the wgmma backward (dQ by REDs and by TMA)
  for f in attention_block wgmma; do
    KILN_TEST_FILTER="*$f*" timeout -k 20 "$(cap 200)" "$BUILD/test_cuda_ops" >"$OUT/test_$f.log" 2>&1
    echo "| test_cuda_ops $f | exit $?: $(grep -c ' PASS' "$OUT/test_$f.log") PASS, $(grep -c ' FAIL' "$OUT/test_$f.log") FAIL |" |
      tee -a "$OUT/table.md"
    grep ' FAIL' "$OUT/test_$f.log" | head -5
  done
  # and their speed at the 1.3B shape's heads: a ring step of a 64k sequence, and the whole 64k (wgmma, wgmma-red)
  timeout -k 20 "$(cap 120)" "$BUILD/attn_bench" block 65536 16 128 2>&1 | grep '^block' | tee -a "$OUT/table.md"
  timeout -k 20 "$(cap 120)" "$BUILD/attn_bench" 1 65536 16 128 2>&1 | grep -E ' wgmma' | cut -c1-150 | tee -a "$OUT/table.md"
fi

if has correct; then
# correctness: N GPUs (NCCL) against 1, same global batch, deterministic kernels; a hang ends within 90 s
# with the watchdog's report (RUN/hang/rank-N.txt: the collective and the rank that did not join it)
a=(--layers=4 --heads=4 --dim=256 --seq=256 --block-size=256 --batch=4 --total-batch=$((4 * 256 * NG * 2)) --max-steps=12
  --eval-every=6 --quiet --log-every=1 --device=${KILN_BENCH_DEVICE:-cuda} --deterministic=1 --bucket-mb=1 --schedule=constant --warmup=0
  --lr=1e-3 --ckpt-every=6 --hang-timeout=90)
timeout -k 20 "$(cap 120)" "$K" train "${a[@]}" --out=/tmp/m1 >"$OUT/one.log" 2>&1
echo "1 GPU: exit $?"
for z in ${KILN_CORRECT_ZERO-0 1 2 3}; do
  timeout -k 20 "$(cap 180)" "$K" launch --nproc-per-node=$NG --max-restarts=0 -- "${a[@]}" --zero=$z --out=/tmp/mn$z \
    >"$OUT/nccl-z$z.log" 2>&1
  echo "$NG GPUs zero $z: exit $? $(grep -m1 -i error "$OUT/nccl-z$z.log")"
  cp -r /tmp/mn$z/hang "$OUT/hang-z$z" 2>/dev/null
done
# one sequence split over the GPUs (sp = NG, dp = 1): the same tokens per step as one GPU
# (ringtc: the ring on the tensor-core block kernels, KILN_ATTN_BLOCK=tc; ringwg: on the Hopper kernels,
# KILN_ATTN_BLOCK=wgmma, whose backward is not deterministic (atomics), so that run is not either; HS is 64;
# ulysses1: Ulysses with one sequence a micro-step, whose q, k, v stay in the all-to-all's buffers, the same
# global batch in four times the micro-steps)
for mode in ${KILN_CORRECT_SP-ulysses ulysses1 ring ringtc ringwg}; do
  blk=ref det=() spm=${mode%[tw][cg]}
  [ $mode = ringtc ] && blk=tc
  [ $mode = ringwg ] && blk=wgmma det=(--deterministic=0)
  [ $mode = ulysses1 ] && spm=ulysses det=(--batch=1)
  KILN_ATTN_BLOCK=$blk timeout -k 20 "$(cap 180)" "$K" launch --nproc-per-node=$NG \
    --max-restarts=0 -- "${a[@]}" "${det[@]}" --sp=$NG --sp-mode=$spm --out=/tmp/mn$mode \
    >"$OUT/nccl-$mode.log" 2>&1
  echo "$NG GPUs sp $mode: exit $? $(grep -m1 -i error "$OUT/nccl-$mode.log")"
  cp -r /tmp/mn$mode/hang "$OUT/hang-$mode" 2>/dev/null
done
# the same ring over MPI, both ranks on GPU 0 (operands staged through the host, no overlap): where this
# matches one GPU as closely as Ulysses does and NCCL's ring does not, the NCCL path is at fault, not numerics
if command -v mpirun >/dev/null && [ -n "${KILN_CORRECT_MPI-1}" ]; then
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 CUDA_VISIBLE_DEVICES=0 timeout -k 20 "$(cap 180)" mpirun --oversubscribe \
    --bind-to none -np $NG "$K" train "${a[@]}" --sp=$NG --sp-mode=ring --comm=mpi --out=/tmp/mnmpiring \
    >"$OUT/mpi-ring.log" 2>&1
  echo "$NG MPI ranks on one GPU, sp ring: exit $?"
fi
cp -r /tmp/mn2 /tmp/mr1 2>/dev/null
timeout -k 20 "$(cap 120)" "$K" train "${a[@]}" --max-steps=18 --out=/tmp/mr1 >"$OUT/resume1.log" 2>&1
echo "resume of the $NG-GPU ZeRO-2 checkpoint on 1 GPU: exit $? $(grep -m1 resuming "$OUT/resume1.log")"
python3 - "$NG" "$OUT" <<'PY' | tee -a "$OUT/table.md"
import json, sys
def losses(d):
    try:
        return {r["step"]: r["loss"] for r in map(json.loads, open(d + "/metrics.jsonl"))}
    except Exception:
        return {}
one = losses("/tmp/m1")
curves = {"one": one}
for z in ["0", "1", "2", "3", "ulysses", "ulysses1", "ring", "ringtc", "ringwg", "mpiring"]:
    two = curves[z] = losses(f"/tmp/mn{z}")
    if not two:
        continue  # (not run: KILN_CORRECT_*)
    common = sorted(set(one) & set(two))
    rel = [abs(one[s] - two[s]) / one[s] for s in common]
    what = f"NCCL zero {z}" if z.isdigit() else "MPI on one GPU, sp ring" if z == "mpiring" else f"NCCL sp {z}"
    # step 1's loss comes before any update: it tests the forward alone, before drift can compound
    print(f"| {sys.argv[1]} GPUs {what} vs 1 GPU, {len(common)} steps | worst loss rel diff "
          f"{max(rel, default=float('nan')):.2e}, step 1 {rel[0] if rel else float('nan'):.2e} |")
json.dump(curves, open(sys.argv[2] + "/losses.json", "w"))
r = losses("/tmp/mr1")
print(f"| {sys.argv[1]}-GPU checkpoint resumed on 1 GPU | steps to {max(r) if r else 'none'}, last loss {r.get(max(r), 'n/a') if r else 'n/a'} |")
PY

fi

median() { # median ms after 10 steps
  python3 -c "
import json, statistics, sys
rows = [json.loads(l) for l in open('$1')]
print(f'{statistics.median(r[\"ms\"] for r in rows[10:]):.2f}')"
}
if has weak; then
# weak scaling: the same micro-batch per GPU, 1 GPU and all of them. Gradients fp32 on both sides (several
# ranks reduce fp32 by default), and bf16 on both sides (--reduce-dtype=bf16; one GPU's auto default)
for shape in "124m --preset=gpt2-124m --batch=32" "350m --preset=gpt2-350m --batch=16"; do
  set -- $shape
  name=$1
  shift
  w=(--data=random --seq=1024 --max-steps=40 --warmup=10 --device=cuda --eval-every=0 --checkpoint=0 --quiet
    --log-every=1 "$@")
  for gd in fp32 bf16; do
    one=(--grad-dtype=$gd)
    many=(--reduce-dtype=$gd)
    timeout -k 20 "$(cap 200)" "$K" train "${w[@]}" "${one[@]}" --out=/tmp/w1-$name-$gd >"$OUT/w1-$name.log" 2>&1
    ms1=$(median /tmp/w1-$name-$gd/metrics.jsonl)
    for z in 0 1 2; do
      timeout -k 20 "$(cap 240)" "$K" launch --nproc-per-node=$NG --max-restarts=0 -- "${w[@]}" "${many[@]}" --zero=$z \
        --out=/tmp/wn-$name-$z-$gd >"$OUT/wn-$name-$z.log" 2>&1
      msn=$(median /tmp/wn-$name-$z-$gd/metrics.jsonl 2>/dev/null || echo nan)
      cw=$(tail -1 /tmp/wn-$name-$z-$gd/metrics.jsonl 2>/dev/null | grep -o '"comm_wait_ms":[0-9.]*')
      echo "| $name $gd grads, zero $z | 1 GPU $ms1 ms, $NG GPUs $msn ms: efficiency $(python3 -c "print(f'{$ms1/$msn*100:.1f}%')" 2>/dev/null) (total $cw over 40 steps) |" >>"$OUT/table.md"
    done
  done
done
fi

# ---- weak scaling beside PyTorch: one table per shape, fp32 gradients everywhere ----
# efficiency = tokens/s per GPU on NG GPUs over the same implementation's tokens/s on one GPU without sharding
torch_tok() { # tokens/s per GPU and peak GiB of bench/torch_fsdp.py's JSON line, or "failed"
  python3 -c "
import json, sys
l = [x for x in open('$1') if x.startswith('{')]
d = json.loads(l[-1]) if l else None
print(f\"{d['tokens_per_s']} {d['ms_per_step']} {d['peak_mem_bytes'] / 2**30:.1f}\" if d else 'failed nan nan')" 2>/dev/null ||
    echo "failed nan nan"
}
if has scale; then
  for shape in ${KILN_SCALE_SHAPES:-124m 350m 1.3b}; do
    case $shape in
    124m) B=32 L=12 D=768 H=12 ;;
    350m) B=16 L=24 D=1024 H=16 ;;
    1.3b) B=8 L=24 D=2048 H=16 ;;
    tiny) B=2 L=2 D=64 H=2 ;; # (a smoke test of this part: KILN_BENCH_DEVICE=cpu KILN_NG=2)
    *) echo "unknown shape $shape" && continue ;;
    esac
    w=(--preset=gpt2-124m --layers=$L --dim=$D --heads=$H --data=random --seq=1024 --batch=$B --max-steps=25
      --warmup=5 --device="${KILN_BENCH_DEVICE:-cuda}" --eval-every=0 --checkpoint=0 --save-model=0 --quiet
      --log-every=1)
    intime 40 "$shape kiln" || break
    timeout -k 20 "$(cap 200)" "$K" train "${w[@]}" --grad-dtype=fp32 --out=/tmp/s1-$shape >"$OUT/scale.log" 2>&1
    read -r ms1 tok1 gib1 mfu1 < <(kstats /tmp/s1-$shape/metrics.jsonl)
    echo "| $shape B=$B, kiln 1 GPU | $tok1 tok/s ($ms1 ms, MFU $mfu1%, $gib1 GiB) |" | tee -a "$OUT/table.md"
    for z in ${KILN_SCALE_ZERO:-0 1 2 3}; do
      intime 40 "$shape kiln zero $z" || break
      timeout -k 20 "$(cap 200)" "$K" launch --nproc-per-node="$NG" --max-restarts=0 -- "${w[@]}" --zero=$z \
        --out=/tmp/sn-$shape-$z >>"$OUT/scale.log" 2>&1
      read -r msn tokn gibn mfun < <(kstats /tmp/sn-$shape-$z/metrics.jsonl)
      cw=$(python3 -c "
import json, statistics
r = [json.loads(l) for l in open('/tmp/sn-$shape-$z/metrics.jsonl')]
print(f'{statistics.median(x.get(\"comm_wait_ms\", 0) for x in r[len(r) // 4:]):.2f}')" 2>/dev/null)
      # (metrics.jsonl's tokens_per_s counts every rank's tokens: a GPU's share is 1/NG of it)
      echo "| $shape B=$B, kiln $NG GPUs zero $z | $(python3 -c "print(round($tokn / $NG))" 2>/dev/null) tok/s per GPU ($msn ms, MFU $mfun%, $gibn GiB, comm wait $cw ms a step): efficiency $(python3 -c "print(f'{$ms1 / $msn * 100:.1f}%')" 2>/dev/null) |" |
        tee -a "$OUT/table.md"
    done
    # what the overlap costs: DDP again with NCCL's settings varied (VAR=VALUE: fewer channels, each a CTA,
    # so fewer SMs taken from the backward; NCCL's CTA policy) or with a flag of kiln's (--flag=VALUE, against
    # one GPU with the same flag: bf16 gradients halve the bytes reduced), and a trace of how much of the
    # reduction the compute stream waited for (KILN_TRACE_COMM). On 4 H100s (2026-11-26): 8 and 2 channels lost
    # 4 and 39 points at 1.3B, the efficiency CTA policy changed nothing; next, NCCL's Simple protocol (no
    # flag-polling LL/LL128 kernels), GEMMs planned for 16 SMs fewer (cuBLASLt's SM count target), bigger
    # buckets, bf16 gradients, and the comm stream at the greatest priority.
    # (KILN_SCALE_ENV_ZERO: these rows at another --zero level than DDP's 0, e.g. 2 with --reduce-dtype=bf16)
    ez=${KILN_SCALE_ENV_ZERO:-0}
    for e in ${KILN_SCALE_NCCL_ENV-NCCL_PROTO=Simple KILN_GEMM_SM_MARGIN=16 --bucket-mb=100 --reduce-dtype=bf16 KILN_NCCL_STREAM_PRIORITY=high}; do
      intime 60 "$shape kiln zero $ez, $e" || break
      # (an entry may join levers with +: --reduce-dtype=bf16+NCCL_PROTO=Simple)
      ms1e=$ms1 envs=(env) flags=()
      IFS=+ read -ra parts <<<"$e"
      for part in "${parts[@]}"; do
        if [[ $part == --* ]]; then flags+=("$part"); else envs+=("$part"); fi
      done
      if [ ${#flags[@]} -gt 0 ]; then
        timeout -k 20 "$(cap 200)" "$K" train "${w[@]}" "${flags[@]}" --out=/tmp/sc1-$shape >>"$OUT/scale.log" 2>&1
        read -r ms1e _ < <(kstats /tmp/sc1-$shape/metrics.jsonl)
        rm -rf /tmp/sc1-$shape
      fi
      "${envs[@]}" timeout -k 20 "$(cap 200)" "$K" launch --nproc-per-node="$NG" --max-restarts=0 -- "${w[@]}" "${flags[@]}" \
        --zero="$ez" --out=/tmp/sc-$shape >>"$OUT/scale.log" 2>&1
      read -r msn tokn gibn mfun < <(kstats /tmp/sc-$shape/metrics.jsonl)
      echo "| $shape B=$B, kiln $NG GPUs zero $ez, $e | $msn ms (1 GPU: $ms1e ms): efficiency $(python3 -c "print(f'{$ms1e / $msn * 100:.1f}%')" 2>/dev/null) |" |
        tee -a "$OUT/table.md"
      rm -rf /tmp/sc-$shape
    done
    if [ -n "${KILN_SCALE_TRACE-1}" ] && intime 40 "$shape kiln zero 0, traced"; then
      rm -f /tmp/tr-$shape.csv*
      KILN_TRACE_COMM=/tmp/tr-$shape.csv timeout -k 20 "$(cap 200)" "$K" launch --nproc-per-node="$NG" --max-restarts=0 -- "${w[@]}" \
        --zero=0 --out=/tmp/st-$shape >>"$OUT/scale.log" 2>&1
      tr="no trace came out (KILN_TRACE_COMM is the NCCL transport's)"
      [ -s /tmp/tr-$shape.csv.rank0 ] && tr=$(python3 bench/overlap.py /tmp/tr-$shape.csv.rank0 25% 2>&1 | sed 's/^trace //' | tr '\n' ';')
      echo "| $shape B=$B, kiln $NG GPUs zero 0, traced (rank 0, after the first quarter) | $tr |" | tee -a "$OUT/table.md"
      rm -rf /tmp/st-$shape
    fi
    [ -z "${KILN_SCALE_TORCH-1}" ] && continue # (KILN_SCALE_TORCH=: kiln's rows alone)
    p=(bench/torch_fsdp.py --layers $L --dim $D --heads $H --batch $B --seq 1024 --compile 1 --steps 15 --warmup 5)
    intime 100 "$shape PyTorch" || break
    timeout -k 20 "$(cap 300)" python3 "${p[@]}" --fsdp 0 >"$OUT/t1.log" 2>>"$OUT/scale.log"
    read -r ttok1 tms1 tgib1 < <(torch_tok "$OUT/t1.log")
    echo "| $shape B=$B, PyTorch compile 1 GPU | $ttok1 tok/s ($tms1 ms, $tgib1 GiB) |" | tee -a "$OUT/table.md"
    for f in 0 1; do
      name=DDP
      [ $f = 1 ] && name=FSDP2
      intime 120 "$shape PyTorch $name" || break
      timeout -k 20 "$(cap 300)" torchrun --standalone --nproc-per-node="$NG" "${p[@]}" --fsdp $f >"$OUT/tn.log" 2>>"$OUT/scale.log"
      read -r ttok tms tgib < <(torch_tok "$OUT/tn.log")
      echo "| $shape B=$B, PyTorch $name $NG GPUs | $ttok tok/s per GPU ($tms ms, $tgib GiB): efficiency $(python3 -c "print(f'{$ttok / $ttok1 * 100:.1f}%')" 2>/dev/null) |" |
        tee -a "$OUT/table.md"
    done
  done
fi

# ---- ZeRO-3 weak scaling, PyTorch FSDP2 (torch.compile, per block) beside it under torchrun ----
if has zero3; then
  for shape in "124m 32 --preset=gpt2-124m" "350m 16 --preset=gpt2-350m --layers=24 --dim=1024 --heads=16" \
    "1.3b 8 --preset=gpt2-124m --layers=24 --dim=2048 --heads=16"; do
    set -- $shape
    name=$1 B=$2
    shift 2
    w=(--data=random --seq=1024 --batch="$B" --max-steps=30 --warmup=5 --device=cuda --eval-every=0 --checkpoint=0
      --save-model=0 --quiet --log-every=1 --zero=3 --comm=nccl "$@")
    timeout -k 20 "$(cap 300)" "$K" train "${w[@]}" --out=/tmp/z1-$name >"$OUT/z3.log" 2>&1
    read -r ms1 tok1 gib1 mfu1 < <(kstats /tmp/z1-$name/metrics.jsonl)
    timeout -k 20 "$(cap 300)" "$K" launch --nproc-per-node="$NG" --max-restarts=0 -- "${w[@]}" --out=/tmp/zn-$name >>"$OUT/z3.log" 2>&1
    read -r msn tokn gibn mfun < <(kstats /tmp/zn-$name/metrics.jsonl)
    eff=$(python3 -c "print(f'{$ms1 / $msn * 100:.1f}%')" 2>/dev/null)
    read -r L D H < <(echo "$@" | python3 -c "
import re, sys
a = sys.stdin.read(); g = lambda k, d: int(re.search(k + r'=(\d+)', a).group(1)) if re.search(k + r'=(\d+)', a) else d
print(g('--layers', 24 if '350m' in a else 12), g('--dim', 1024 if '350m' in a else 768), g('--heads', 16 if '350m' in a else 12))")
    t=$(timeout -k 20 "$(cap 400)" torchrun --standalone --nproc-per-node="$NG" bench/torch_fsdp.py --layers "$L" --dim "$D" \
      --heads "$H" --batch "$B" --seq 1024 --fsdp 1 --compile 1 --steps 20 --warmup 5 2>>"$OUT/z3.log" | grep '^{' | tail -1)
    ttok=$(echo "$t" | python3 -c "import json, sys; print(json.load(sys.stdin)['tokens_per_s'])" 2>/dev/null || echo "failed")
    echo "| $name ZeRO-3, $NG GPUs | $(python3 -c "print(round($tokn / $NG))" 2>/dev/null) tok/s per GPU ($msn ms, MFU $mfun%, $gibn GiB); 1 GPU $tok1 ($ms1 ms): efficiency $eff; PyTorch FSDP2 $ttok tok/s per GPU |" |
      tee -a "$OUT/table.md"
  done
fi

# ---- ZeRO-3 at 7B/8B on all the GPUs (target >= 50% MFU) ----
if has big; then
  for m in ${KILN_BIG_MODELS:-olmo-7b llama-8b}; do
    for T in ${KILN_BIG_LENGTHS:-4096 8192}; do
      # (the estimates: 4 H100s, 2026-11-26: an 8B run took about 55 s, FSDP2's about 40, PyTorch's context
      # parallelism at 128k about 40; cap() still bounds each run by the deadline)
      intime 75 "$m ZeRO-3, T=$T" || break
      rm -rf /tmp/big
      touch "$OUT/big.log"
      n0=$(wc -l <"$OUT/big.log")
      # shellcheck disable=SC2086 # (KILN_BIG_FLAGS: words)
      timeout -k 20 "$(cap 560)" "$K" launch --nproc-per-node="$NG" --max-restarts=0 -- --preset="$m" --seq="$T" --block-size="$T" --batch="${KILN_BIG_BATCH:-1}" \
        --zero=3 --recompute="${KILN_BIG_RECOMPUTE:-auto}" --data=random --max-steps=8 --warmup=2 --device="${KILN_BENCH_DEVICE:-cuda}" --eval-every=0 \
        --checkpoint=0 --save-model=0 --quiet --log-every=1 ${KILN_BIG_FLAGS:-} --out=/tmp/big >>"$OUT/big.log" 2>&1
      rc=$?
      read -r ms tok gib mfu < <(kstats /tmp/big/metrics.jsonl)
      [ $rc -ne 0 ] && grep -v '^\s' "$OUT/big.log" | tail -1
      took=$(tail -n +$((n0 + 1)) "$OUT/big.log" | grep -o 'recompute=auto: [a-z]*' | tail -1) # what auto chose
      echo "| $m ZeRO-3, T=$T, B=${KILN_BIG_BATCH:-1}, $NG GPUs, recompute ${KILN_BIG_RECOMPUTE:-auto} ${took:+($took)}${KILN_BIG_FLAGS:+ $KILN_BIG_FLAGS} | exit $rc: $(python3 -c "print(round($tok / $NG))" 2>/dev/null) tok/s per GPU, MFU $mfu%, $gib GiB, $ms ms/step |" |
        tee -a "$OUT/table.md"
      # PyTorch FSDP2 beside llama-8b (torchtitan's comparison): the same shape and batch, compiled per block,
      # whole-block activation checkpointing (PyTorch has no selective recompute of kiln's kind)
      [ "$m" = llama-8b ] && [ -n "${KILN_BIG_TORCH-1}" ] || continue
      intime 75 "$m PyTorch FSDP2, T=$T" || break
      timeout -k 20 "$(cap 400)" torchrun --standalone --nproc-per-node="$NG" bench/torch_fsdp.py --arch llama --layers 32 \
        --dim 4096 --heads 32 --kv-heads 8 --ffn 14336 --batch "${KILN_BIG_BATCH:-1}" --seq "$T" --ckpt 1 \
        --compile 1 --steps 5 --warmup 3 --fsdp 1 >"$OUT/tbig.log" 2>>"$OUT/big.log"
      read -r ttok tms tgib < <(torch_tok "$OUT/tbig.log")
      echo "| $m PyTorch FSDP2, T=$T, B=${KILN_BIG_BATCH:-1}, $NG GPUs, block checkpointing | $ttok tok/s per GPU ($tms ms, $tgib GiB); kiln ÷ PyTorch $(python3 -c "print(f'{$tok / $NG / $ttok:.2f}')" 2>/dev/null) |" |
        tee -a "$OUT/table.md"
    done
  done
fi

# ---- long context across the GPUs: the 1.3B shape, one sequence split NG ways ----
if has long; then
  for mode in ${KILN_LONG_MODES:-ulysses ring hybrid}; do
    # (MODE-tc / MODE-wgmma: the ring's blocks on the tensor-core kernels or the Hopper ones, KILN_ATTN_BLOCK;
    # the default is wgmma's)
    spmode=${mode%-*} blk=${KILN_ATTN_BLOCK:-wgmma}
    [ "$spmode" != "$mode" ] && blk=${mode##*-}
    [ "$spmode" = hybrid ] && [ "$NG" -lt 4 ] && continue # (2 Ulysses ranks x a ring of 2 needs 4 GPUs)
    extra=()
    [ "$spmode" = hybrid ] && extra=(--sp-ulysses=2)
    for T in ${KILN_LONG_LENGTHS:-131072 524288 1048576 2097152}; do
      off=none rec=selective zero=0
      # from 1M on: layer inputs (and selective's attention outputs) in host memory, the weights and optimizer
      # sharded over the SP ranks (ZeRO-3), and the least recompute that fits (auto). 2M tokens on 4 GPUs
      # plan 72.2 GiB a GPU under selective for Ulysses and the ring, 88.2 for hybrid, 67.5 under block
      # (kiln info --world=4): selective fits an H100 but for hybrid, and skips the attention's forward in
      # the backward, about a fifth of the step (tests/cli/test_sp_mpi.sh runs the Ulysses layout)
      [ "$T" -ge 1048576 ] && off=activations zero=3 rec=auto
      rec=${KILN_LONG_RECOMPUTE:-$rec}
      intime 90 "1.3B, $T tokens, sp $NG $mode" || break
      rm -rf /tmp/long
      KILN_ATTN_BLOCK=$blk timeout -k 20 "$(cap 560)" "$K" launch --nproc-per-node="$NG" --max-restarts=0 -- --preset=gpt2-124m \
        --layers=24 --dim=2048 --heads=16 --pos=rope --batch=1 --seq="$T" --block-size="$T" --sp="$NG" --sp-mode=$spmode "${extra[@]}" \
        --recompute=$rec --offload=$off --zero=$zero --data=random --max-steps=3 --warmup=1 --device=cuda --eval-every=0 \
        --checkpoint=0 --save-model=0 --quiet --log-every=1 --out=/tmp/long >>"$OUT/long.log" 2>&1
      rc=$?
      read -r ms tok gib mfu < <(kstats /tmp/long/metrics.jsonl)
      [ "$rec" = auto ] && rec="auto ($(grep -o 'recompute=auto: [a-z]*' "$OUT/long.log" | tail -1 | sed 's/.*: //'))"
      echo "| 1.3B, $T tokens, sp $NG $mode | exit $rc: $tok tok/s, $(python3 -c "print(f'{$mfu * 9.89:.0f}')" 2>/dev/null) TFLOPS per GPU (MFU $mfu%), $gib GiB, recompute $rec, offload $off, zero $zero |" |
        tee -a "$OUT/table.md"
      [ $rc -ne 0 ] && { grep -v '^\s' "$OUT/long.log" | tail -2; break; }
    done
  done
  # PyTorch's context parallelism (ring attention over SDPA, FSDP2 for the gradients; bench/torch_cp.py) at the
  # same lengths, beside kiln's rows (KILN_LONG_TORCH= turns it off)
  for T in ${KILN_LONG_LENGTHS:-131072 524288 1048576 2097152}; do
    [ -n "${KILN_LONG_TORCH-1}" ] || break
    intime 75 "1.3B, $T tokens, PyTorch context parallel over $NG" || break
    timeout -k 20 "$(cap 400)" torchrun --standalone --nproc-per-node="$NG" bench/torch_cp.py --layers 24 --dim 2048 \
      --heads 16 --seq "$T" --steps 2 --warmup 1 >"$OUT/tcp.log" 2>>"$OUT/long.log"
    read -r ttok tms tgib < <(torch_tok "$OUT/tcp.log")
    echo "| 1.3B, $T tokens, PyTorch context parallel over $NG GPUs (RoPE, block checkpointing) | $ttok tok/s ($tms ms, $tgib GiB a GPU) |" |
      tee -a "$OUT/table.md"
    [ "$ttok" = failed ] && { grep -m2 -i 'error' "$OUT/long.log"; break; }
  done
fi

# ---- faults on real GPUs ----
if has faults && intime 90 "faults"; then
  f=(--layers=4 --heads=4 --dim=256 --seq=256 --block-size=256 --batch=4 --max-steps=400 --ckpt-every=50 --eval-every=0 --quiet
    --device=cuda --data=random)
  rm -rf /tmp/fk
  "$K" launch --nproc-per-node="$NG" --max-restarts=1 --backoff=1 -- "${f[@]}" --zero=2 --out=/tmp/fk >"$OUT/faults.log" 2>&1 &
  lp=$!
  for _ in $(seq 60); do [ -d /tmp/fk/ckpt/step_00000100 ] || [ -n "${KILN_DRY:-}" ] && break; sleep 1; done
  victim=$(pgrep -f "kiln train.*--out=/tmp/fk" | tail -1)
  [ -n "$victim" ] && kill -9 "$victim"
  wait $lp
  echo "| SIGKILL of one of $NG ranks | launch exit $?; restarts: $(wc -l </tmp/fk/restarts.jsonl 2>/dev/null); last step $(tail -1 /tmp/fk/metrics.jsonl | grep -o '"step":[0-9]*') |" |
    tee -a "$OUT/table.md"
  rm -rf /tmp/fs
  timeout -k 20 "$(cap 120)" "$K" launch --nproc-per-node="$NG" --max-restarts=0 -- "${f[@]}" --hang-timeout=5 --inject-stall=1:20 \
    --out=/tmp/fs >>"$OUT/faults.log" 2>&1
  echo "| a stalled rank (1 of $NG) | exit $?; kiln doctor: $("$K" doctor /tmp/fs 2>&1 | grep -m1 -i 'rank 1')" | tee -a "$OUT/table.md"
  for n in 2 1; do
    [ "$n" -ge "$NG" ] && continue
    rm -rf /tmp/fr$n
    cp -r /tmp/fk /tmp/fr$n
    timeout -k 20 "$(cap 200)" "$K" launch --nproc-per-node=$n --max-restarts=0 -- "${f[@]}" --zero=2 --max-steps=420 --out=/tmp/fr$n \
      >>"$OUT/faults.log" 2>&1
    echo "| the $NG-GPU checkpoint resumed on $n | exit $?; $(grep -m1 -o 'resuming[^;]*' /tmp/fr$n/*.log "$OUT/faults.log" 2>/dev/null | head -1); last step $(tail -1 /tmp/fr$n/metrics.jsonl | grep -o '"step":[0-9]*') |" |
      tee -a "$OUT/table.md"
  done
fi
cat "$OUT/table.md"
