#!/usr/bin/env bash
# The README's real-data workflow on one GPU: tokenize the Gutenberg corpus, train GPT-2 124M on it with
# validation, sample. Usage: bench/real_data_gpu.sh BUILD_DIR DATA_DIR OUT_DIR [STEPS]
set -euo pipefail
BUILD=$1 DATA=$2 OUT=$3 STEPS=${4:-300}
t0=$(date +%s)
"$BUILD/kiln" tokenize --out=/tmp/gutenberg --val-tokens=1000000 --quiet "$DATA"/gutenberg_en_train.txt.xz
echo "tokenize: $(( $(date +%s) - t0 )) s; $(python3 -c "import json;m=json.load(open('/tmp/gutenberg/manifest.json'));print(m['tokens'],'tokens')")"
"$BUILD/kiln" train --preset=gpt2-124m --data='/tmp/gutenberg/train_*.bin' --val-data='/tmp/gutenberg/val_*.bin' \
  --batch=16 --seq=1024 --total-batch=131072 --max-steps="$STEPS" --warmup=30 --lr=1e-3 --eval-every=100 \
  --eval-steps=20 --device=cuda --out="$OUT/gutenberg_124m" 2>&1 | tr '\r' '\n' | grep -v "^step [0-9]*/" | tail -12
"$BUILD/kiln" sample --run="$OUT/gutenberg_124m" --prompt="It was a dark and stormy night" --max-tokens=60 --device=cuda
