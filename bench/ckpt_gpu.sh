#!/usr/bin/env bash
# GPU checks of issue 6 and recompute (one GPU run): the checkpoint stall on the step loop, bit-exact
# resume after a crash in --deterministic mode, and --recompute against none (bitwise losses, memory, speed).
# Usage: bench/ckpt_gpu.sh BUILD_DIR OUT_DIR
set -u
BUILD=$1 OUT=$2
K="$BUILD/kiln"
med() { python3 -c "import json,statistics,sys;r=[json.loads(l) for l in open(sys.argv[1])];print(round(statistics.median(x['ms'] for x in r[5:]),2))" "$1"; }
# 1. checkpoint stall: GPT-2 124M (1.5 GB of state per checkpoint), a checkpoint every 10 steps
"$K" train --preset=gpt2-124m --data=random --batch=16 --seq=1024 --max-steps=40 --warmup=5 --ckpt-every=10 \
  --keep-last=2 --device=cuda --eval-every=0 --quiet --out="$OUT/stall" >"$OUT/stall.log" 2>&1 || tail -3 "$OUT/stall.log"
python3 - "$OUT/stall/metrics.jsonl" <<'PY'
import json, sys, statistics
r = [json.loads(l) for l in open(sys.argv[1])]
st = [(x["step"], x["ckpt_stall_ms"], x.get("prev_ckpt_write_ms")) for x in r if "ckpt_stall_ms" in x]
ms = statistics.median(x["ms"] for x in r if "ckpt_stall_ms" not in x)
print(f"gpt2-124m B=16: median step {ms:.1f} ms; checkpoint (step, stall ms, previous write ms): {st}")
PY
# 2. deterministic resume on the GPU: 30 steps straight vs a crash at step 25 + resume from step 20
common=(--preset=shakespeare-char --batch=16 --seq=128 --max-steps=30 --warmup=5 --ckpt-every=10 --device=cuda
        --deterministic=1 --eval-every=0 --quiet)
"$K" train "${common[@]}" --out="$OUT/straight" >/dev/null 2>&1
"$K" train "${common[@]}" --out="$OUT/crashed" --inject-crash=25 >/dev/null 2>&1
echo "crash run exit status: $?"
"$K" train "${common[@]}" --out="$OUT/crashed" >"$OUT/resume.log" 2>&1
echo "resume: $(grep -m1 -i resum "$OUT/resume.log")"
if cmp -s "$OUT/straight/model.safetensors" "$OUT/crashed/model.safetensors"; then
  echo "deterministic GPU resume: final weights byte-identical: PASS"
else
  echo "deterministic GPU resume: final weights differ: FAIL"
fi
# 3. recompute: identical losses in deterministic mode; memory and speed at GPT-2 124M B=32
for r in none mlp block; do
  "$K" train --preset=gpt2-124m --data=random --batch=32 --seq=1024 --max-steps=15 --warmup=5 --device=cuda \
    --deterministic=1 --recompute=$r --checkpoint=0 --eval-every=0 --quiet --out="$OUT/rc_$r" >/dev/null 2>&1
  echo "recompute=$r: median ms $(med "$OUT/rc_$r/metrics.jsonl"), plan $(python3 -c "import json;r=[json.loads(l) for l in open('$OUT/rc_$r/metrics.jsonl')];print(round(r[-1]['peak_mem_bytes']/2**30,2), 'GiB, mfu', r[-1].get('mfu'), 'hfu', r[-1].get('hfu'))")"
done
for r in mlp block; do
  if [ "$(grep -o '"loss":[^,]*' "$OUT/rc_none/metrics.jsonl")" = "$(grep -o '"loss":[^,]*' "$OUT/rc_$r/metrics.jsonl")" ]; then
    echo "recompute=$r losses bitwise equal to none: PASS"; else echo "recompute=$r losses differ from none: FAIL"; fi
done
rm -rf "$OUT"/*/ckpt "$OUT"/*/model.safetensors 2>/dev/null
