#!/usr/bin/env bash
# On a machine of several GPUs (nvidia-h200-x2/x4): NCCL data parallelism for real. kiln launch starts one
# rank per GPU (torchrun-style environment, NCCL's id over the TCP store). Checks DDP, ZeRO-1 and ZeRO-2
# against one GPU at the same global batch (deterministic kernels), a checkpoint written on N GPUs resumed on
# 1, then weak scaling at GPT-2 124M and 350M (the same micro-batch per GPU). Logs in $OUT; a table last.
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

median() { # median ms after 10 steps
  python3 -c "
import json, statistics, sys
rows = [json.loads(l) for l in open('$1')]
print(f'{statistics.median(r[\"ms\"] for r in rows[10:]):.2f}')"
}
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
cat "$OUT/table.md"
