#!/usr/bin/env bash
# FP8's quality against bf16 on real text: GPT-2 124M and the 1.3B shape trained on the Project Gutenberg corpus
# for KILN_Q_STEPS (2000) steps each, bf16 and --precision=fp8 (tensorwise, KILN_Q_FP8_FLAGS adds flags), the
# same data order, with validation every 250 steps on a held-out million tokens. With 4 GPUs the four runs go
# side by side (one a GPU); with fewer, in turn. KILN_Q_SHAPES picks shapes ("124m 1.3b") or runs (124m_fp8).
#   bash bench/fp8_quality.sh DATA_DIR     (DATA_DIR holds gutenberg_en_train.txt.xz)
# Each run's metrics.jsonl goes to $OUT/q_NAME.jsonl (for `kiln plot`); a table of the final validation losses
# last.
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/kiln-fp8q}
mkdir -p "$OUT"
DATA=${1:?usage: bench/fp8_quality.sh DATA_DIR}
BUILD=${BUILD:-build-gpu}
STEPS=${KILN_Q_STEPS:-2000}
K="$BUILD/kiln"
t0=$(date +%s)
"$K" tokenize --out=/tmp/gutenberg --val-tokens=1000000 --quiet "$DATA"/gutenberg_en_train.txt.xz >"$OUT/q_tokenize.log" 2>&1 ||
  { tail -3 "$OUT/q_tokenize.log"; exit 1; }
echo "tokenize: $(($(date +%s) - t0)) s"
NG=$(nvidia-smi -L 2>/dev/null | wc -l)
RUNS=("124m_bf16 --preset=gpt2-124m --batch=16 --lr=6e-4"
  "124m_fp8 --preset=gpt2-124m --batch=16 --lr=6e-4 --precision=fp8 ${KILN_Q_FP8_FLAGS:-}"
  "1.3b_bf16 --preset=gpt2-124m --layers=24 --dim=2048 --heads=16 --batch=8 --lr=3e-4"
  "1.3b_fp8 --preset=gpt2-124m --layers=24 --dim=2048 --heads=16 --batch=8 --lr=3e-4 --precision=fp8 ${KILN_Q_FP8_FLAGS:-}")
want() { # a run's name (124m_fp8) picked by KILN_Q_SHAPES, by its shape or by its name
  [[ " ${KILN_Q_SHAPES:-124m 1.3b} " == *" ${1%_*} "* || " ${KILN_Q_SHAPES:-} " == *" $1 "* ]]
}
i=0
pids=()
for r in "${RUNS[@]}"; do
  set -- $r
  name=$1
  shift
  want "$name" || continue
  rm -rf "/tmp/q_$name"
  # shellcheck disable=SC2068 # (flags: words)
  CUDA_VISIBLE_DEVICES=$((i % (NG > 0 ? NG : 1))) timeout -k 10 "${KILN_Q_LIMIT:-420}" "$K" train $@ --seq=1024 \
    --data='/tmp/gutenberg/train_*.bin' --val-data='/tmp/gutenberg/val_*.bin' --max-steps="$STEPS" --warmup=100 \
    --eval-every=250 --eval-steps=20 --device=cuda --checkpoint=0 --save-model=0 --quiet --log-every=10 \
    --out="/tmp/q_$name" >"$OUT/q_$name.log" 2>&1 &
  pids+=($!)
  i=$((i + 1))
  if [ "$NG" -lt 4 ]; then
    wait "${pids[-1]}"
  fi
done
for p in "${pids[@]}"; do wait "$p"; done
echo "runs: $(($(date +%s) - t0)) s"
for r in "${RUNS[@]}"; do
  name=${r%% *}
  want "$name" || continue
  cp "/tmp/q_$name/metrics.jsonl" "$OUT/q_$name.jsonl" 2>/dev/null || { echo "$name: no metrics"; tail -3 "$OUT/q_$name.log"; }
done
python3 - "$OUT" <<'PY'
import json, os, statistics, sys
out = sys.argv[1]
def load(name):
    p = os.path.join(out, f"q_{name}.jsonl")
    if not os.path.exists(p):
        return None
    rows = [json.loads(l) for l in open(p)]
    val = [r for r in rows if "val_loss" in r]
    tok = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r]
    return (val[-1]["step"], val[-1]["val_loss"]) if val else None, statistics.median(tok[len(tok) // 4:]) if tok else 0
print("| shape | steps | bf16 val loss | fp8 val loss | fp8 ÷ bf16 | tok/s bf16, fp8 |")
print("| --- | --- | --- | --- | --- | --- |")
for s in ("124m", "1.3b"):
    b, f = load(f"{s}_bf16"), load(f"{s}_fp8")
    if not b or not f or not b[0] or not f[0]:
        print(f"| {s} | missing | | | | |")
        continue
    print(f"| {s} | {b[0][0]} | {b[0][1]:.4f} | {f[0][1]:.4f} | {f[0][1] / b[0][1]:.4f} | {b[1]:.0f}, {f[1]:.0f} |")
PY
