#!/usr/bin/env bash
# On a machine of several GPUs (nvidia-h200-x2/x4): NCCL data parallelism for real. kiln launch starts one
# rank per GPU (torchrun-style environment, NCCL's id over the TCP store). Checks DDP, ZeRO-1 and ZeRO-2
# against one GPU at the same global batch (deterministic kernels), a checkpoint written on N GPUs resumed on
# 1, then weak scaling at GPT-2 124M and 350M (the same micro-batch per GPU). Logs in $OUT; a table last.
# KILN_PART picks what runs (issue 17's list): correct | weak (the above) | zero3 (weak scaling under ZeRO-3
# at 124M, 350M and the 1.3B shape, with PyTorch FSDP2 under torchrun beside it) | big (olmo-7b and llama-8b
# under ZeRO-3 at T=4096 and 8192) | long (the 1.3B shape under Ulysses, ring and hybrid from 128k up;
# KILN_LONG_LENGTHS) | faults (a SIGKILLed rank resumed by kiln launch, a stalled rank named by kiln doctor, a
# checkpoint of N GPUs resumed on 2 and on 1) | all (correct and weak: what earlier sessions ran).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kiln-multi}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
if [ -d .debs ] && ! dpkg -s libcmocka-dev >/dev/null 2>&1; then
  eval "$(bash scripts/gpu-deps.sh .debs /tmp/kiln-deps)"
fi
BUILD=${BUILD:-build-gpu}
NG=$(nvidia-smi -L | wc -l)
echo "GPUs: $NG; $(nvidia-smi topo -m 2>/dev/null | head -3 | tail -2 | tr -s ' ' | cut -c1-60)"
t0=$(date +%s)
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA_ARCHS=90a >"$OUT/build.log" 2>&1 &&
  cmake --build "$BUILD" -j "$(nproc)" >>"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "build: ok in $(($(date +%s) - t0)) s"
K="$BUILD/kiln"
echo "| run | result |" >"$OUT/table.md"
PART=${KILN_PART:-all}
has() { [ "$PART" = "$1" ] || { [ "$PART" = all ] && { [ "$1" = correct ] || [ "$1" = weak ]; }; }; }
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

if has correct; then
# correctness: N GPUs (NCCL) against 1, same global batch, deterministic kernels
a=(--layers=4 --heads=4 --dim=256 --seq=256 --block-size=256 --batch=4 --total-batch=$((4 * 256 * NG * 2)) --max-steps=12
  --eval-every=6 --quiet --log-every=1 --device=cuda --deterministic=1 --bucket-mb=1 --schedule=constant --warmup=0
  --lr=1e-3 --ckpt-every=6)
timeout 120 "$K" train "${a[@]}" --out=/tmp/m1 >"$OUT/one.log" 2>&1
echo "1 GPU: exit $?"
for z in 0 1 2; do
  timeout 180 "$K" launch --nproc-per-node=$NG --max-restarts=0 -- "${a[@]}" --zero=$z --out=/tmp/mn$z \
    >"$OUT/nccl-z$z.log" 2>&1
  echo "$NG GPUs zero $z: exit $? $(grep -m1 -i error "$OUT/nccl-z$z.log")"
done
cp -r /tmp/mn2 /tmp/mr1
timeout 120 "$K" train "${a[@]}" --max-steps=18 --out=/tmp/mr1 >"$OUT/resume1.log" 2>&1
echo "resume of the $NG-GPU ZeRO-2 checkpoint on 1 GPU: exit $? $(grep -m1 resuming "$OUT/resume1.log")"
python3 - "$NG" <<'PY' | tee -a "$OUT/table.md"
import json, sys
def losses(d):
    try:
        return {r["step"]: r["loss"] for r in map(json.loads, open(d + "/metrics.jsonl"))}
    except Exception:
        return {}
one = losses("/tmp/m1")
for z in range(3):
    two = losses(f"/tmp/mn{z}")
    common = sorted(set(one) & set(two))
    d = max((abs(one[s] - two[s]) / one[s] for s in common), default=float("nan"))
    print(f"| {sys.argv[1]} GPUs NCCL zero {z} vs 1 GPU, {len(common)} steps | worst loss rel diff {d:.2e} |")
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
    timeout 200 "$K" train "${w[@]}" "${one[@]}" --out=/tmp/w1-$name-$gd >"$OUT/w1-$name.log" 2>&1
    ms1=$(median /tmp/w1-$name-$gd/metrics.jsonl)
    for z in 0 1 2; do
      timeout 240 "$K" launch --nproc-per-node=$NG --max-restarts=0 -- "${w[@]}" "${many[@]}" --zero=$z \
        --out=/tmp/wn-$name-$z-$gd >"$OUT/wn-$name-$z.log" 2>&1
      msn=$(median /tmp/wn-$name-$z-$gd/metrics.jsonl 2>/dev/null || echo nan)
      cw=$(tail -1 /tmp/wn-$name-$z-$gd/metrics.jsonl 2>/dev/null | grep -o '"comm_wait_ms":[0-9.]*')
      echo "| $name $gd grads, zero $z | 1 GPU $ms1 ms, $NG GPUs $msn ms: efficiency $(python3 -c "print(f'{$ms1/$msn*100:.1f}%')" 2>/dev/null) (total $cw over 40 steps) |" >>"$OUT/table.md"
    done
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
    timeout 300 "$K" train "${w[@]}" --out=/tmp/z1-$name >"$OUT/z3.log" 2>&1
    read -r ms1 tok1 gib1 mfu1 < <(kstats /tmp/z1-$name/metrics.jsonl)
    timeout 300 "$K" launch --nproc-per-node="$NG" --max-restarts=0 -- "${w[@]}" --out=/tmp/zn-$name >>"$OUT/z3.log" 2>&1
    read -r msn tokn gibn mfun < <(kstats /tmp/zn-$name/metrics.jsonl)
    eff=$(python3 -c "print(f'{$ms1 / $msn * 100:.1f}%')" 2>/dev/null)
    read -r L D H < <(echo "$@" | python3 -c "
import re, sys
a = sys.stdin.read(); g = lambda k, d: int(re.search(k + r'=(\d+)', a).group(1)) if re.search(k + r'=(\d+)', a) else d
print(g('--layers', 24 if '350m' in a else 12), g('--dim', 1024 if '350m' in a else 768), g('--heads', 16 if '350m' in a else 12))")
    t=$(timeout 400 torchrun --standalone --nproc-per-node="$NG" bench/torch_fsdp.py --layers "$L" --dim "$D" \
      --heads "$H" --batch "$B" --seq 1024 --fsdp 1 --compile 1 --steps 20 --warmup 5 2>>"$OUT/z3.log" | grep '^{' | tail -1)
    ttok=$(echo "$t" | python3 -c "import json, sys; print(json.load(sys.stdin)['tokens_per_s'])" 2>/dev/null || echo "failed")
    echo "| $name ZeRO-3, $NG GPUs | $tokn tok/s per GPU ($msn ms, MFU $mfun%, $gibn GiB); 1 GPU $tok1 ($ms1 ms): efficiency $eff; PyTorch FSDP2 $ttok tok/s per GPU |" |
      tee -a "$OUT/table.md"
  done
fi

# ---- ZeRO-3 at 7B/8B on all the GPUs (target >= 50% MFU) ----
if has big; then
  for m in olmo-7b llama-8b; do
    for T in 4096 8192; do
      rm -rf /tmp/big
      timeout 560 "$K" launch --nproc-per-node="$NG" --max-restarts=0 -- --preset="$m" --seq="$T" --batch=1 \
        --zero=3 --recompute=block --data=random --max-steps=8 --warmup=2 --device=cuda --eval-every=0 \
        --checkpoint=0 --save-model=0 --quiet --log-every=1 --out=/tmp/big >"$OUT/big.log" 2>&1
      rc=$?
      read -r ms tok gib mfu < <(kstats /tmp/big/metrics.jsonl)
      echo "| $m ZeRO-3, T=$T, $NG GPUs | exit $rc: $(python3 -c "print(round($tok / $NG))" 2>/dev/null) tok/s per GPU, MFU $mfu%, $gib GiB, $ms ms/step |" |
        tee -a "$OUT/table.md"
    done
  done
fi

# ---- long context across the GPUs: the 1.3B shape, one sequence split NG ways ----
if has long; then
  for mode in ulysses ring hybrid; do
    [ "$mode" = hybrid ] && [ "$NG" -lt 4 ] && continue # (2 Ulysses ranks x a ring of 2 needs 4 GPUs)
    extra=()
    [ "$mode" = hybrid ] && extra=(--sp-ulysses=2)
    for T in ${KILN_LONG_LENGTHS:-131072 524288 1048576 2097152}; do
      off=none
      [ "$T" -ge 1048576 ] && off=activations
      rm -rf /tmp/long
      timeout 560 "$K" launch --nproc-per-node="$NG" --max-restarts=0 -- --preset=gpt2-124m --layers=24 --dim=2048 \
        --heads=16 --pos=rope --batch=1 --seq="$T" --block-size="$T" --sp="$NG" --sp-mode=$mode "${extra[@]}" \
        --recompute=block --offload=$off --data=random --max-steps=3 --warmup=1 --device=cuda --eval-every=0 \
        --checkpoint=0 --save-model=0 --quiet --log-every=1 --out=/tmp/long >"$OUT/long.log" 2>&1
      rc=$?
      read -r ms tok gib mfu < <(kstats /tmp/long/metrics.jsonl)
      echo "| 1.3B, $T tokens, sp $NG $mode | exit $rc: $tok tok/s, $(python3 -c "print(f'{$mfu * 9.89:.0f}')" 2>/dev/null) TFLOPS per GPU (MFU $mfu%), $gib GiB, offload $off |" |
        tee -a "$OUT/table.md"
      [ $rc -ne 0 ] && { grep -v '^\s' "$OUT/long.log" | tail -2; break; }
    done
  done
fi

# ---- faults on real GPUs ----
if has faults; then
  f=(--layers=4 --heads=4 --dim=256 --seq=256 --batch=4 --max-steps=400 --ckpt-every=50 --eval-every=0 --quiet
    --device=cuda --data=random)
  rm -rf /tmp/fk
  "$K" launch --nproc-per-node="$NG" --max-restarts=1 --backoff=1 -- "${f[@]}" --zero=2 --out=/tmp/fk >"$OUT/faults.log" 2>&1 &
  lp=$!
  for _ in $(seq 60); do [ -d /tmp/fk/ckpt/step_00000100 ] && break; sleep 1; done
  victim=$(pgrep -f "kiln train.*--out=/tmp/fk" | tail -1)
  [ -n "$victim" ] && kill -9 "$victim"
  wait $lp
  echo "| SIGKILL of one of $NG ranks | launch exit $?; restarts: $(wc -l </tmp/fk/restarts.jsonl 2>/dev/null); last step $(tail -1 /tmp/fk/metrics.jsonl | grep -o '"step":[0-9]*') |" |
    tee -a "$OUT/table.md"
  rm -rf /tmp/fs
  timeout 120 "$K" launch --nproc-per-node="$NG" --max-restarts=0 -- "${f[@]}" --hang-timeout=5 --inject-stall=1:20 \
    --out=/tmp/fs >>"$OUT/faults.log" 2>&1
  echo "| a stalled rank (1 of $NG) | exit $?; kiln doctor: $("$K" doctor /tmp/fs 2>&1 | grep -m1 -i 'rank 1')" | tee -a "$OUT/table.md"
  for n in 2 1; do
    [ "$n" -ge "$NG" ] && continue
    rm -rf /tmp/fr$n
    cp -r /tmp/fk /tmp/fr$n
    timeout 200 "$K" launch --nproc-per-node=$n --max-restarts=0 -- "${f[@]}" --zero=2 --max-steps=420 --out=/tmp/fr$n \
      >>"$OUT/faults.log" 2>&1
    echo "| the $NG-GPU checkpoint resumed on $n | exit $?; $(grep -m1 -o 'resuming[^;]*' /tmp/fr$n/*.log "$OUT/faults.log" 2>/dev/null | head -1); last step $(tail -1 /tmp/fr$n/metrics.jsonl | grep -o '"step":[0-9]*') |" |
      tee -a "$OUT/table.md"
  done
fi
cat "$OUT/table.md"
