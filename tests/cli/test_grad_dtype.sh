#!/usr/bin/env bash
# --grad-dtype as a user meets it: bad values and the refused combinations (bf16 on the CPU, bf16 with
# gradient accumulation) give one line naming the option, kiln info's CUDA memory plan follows the choice,
# and a run records it in its config.
source "$(dirname "$0")/lib.sh" grad_dtype "$@"

expect_error 2 "allowed values are auto,fp32,bf16" -- train --grad-dtype=fp16
expect_error 2 "grad-dtype bf16 on device cpu (--grad-dtype)" -- train --grad-dtype=bf16 --device=cpu
expect_error 2 "grad-dtype bf16 with 2 micro-steps per step (--grad-dtype)" -- \
  train --grad-dtype=bf16 --batch=4 --seq=64 --total-batch=512
expect_error 2 "grad-dtype bf16 with 2 micro-steps per step (--grad-dtype)" -- \
  info --grad-dtype=bf16 --batch=4 --seq=64 --total-batch=512
# where --device=auto finds no GPU, the CPU backend refuses bf16 itself
if "$KILN" info | grep -q "^gpus: none"; then
  expect_error 2 "the cpu backend keeps fp32 gradients" -- train --grad-dtype=bf16 --max-steps=1 --quiet
fi

# kiln info: one micro-step plans bf16 gradients on CUDA (half of fp32's), accumulation or fp32 plans fp32
grads() { "$KILN" info --preset=gpt2-124m "$@" | awk '/^memory \(cuda/ {m = 1} m && /^  gradients/ {print $2; exit}'; }
bf=$(grads)
f32=$(grads --grad-dtype=fp32)
acc=$(grads --total-batch=8192)
"$KILN" info --preset=gpt2-124m | grep -q "^memory (cuda: bf16 weights, activations and gradients" && ok ||
  bad "kiln info does not name bf16 gradients"
python3 -c "import sys; b, f, a = map(float, sys.argv[1:]); assert abs(2 * b - f) < 1e-3 and a == f, (b, f, a)" \
  "$bf" "$f32" "$acc" && ok || bad "cuda gradient plans: auto $bf, fp32 $f32, accumulating $acc GiB"

# a CPU run keeps fp32 gradients under auto and writes the option into its config
"$KILN" train --layers=1 --heads=2 --dim=16 --seq=16 --batch=2 --max-steps=1 --threads=1 --device=cpu \
  --out="$T/run" 2>"$T/train.err" || bad "train failed: $(cat "$T/train.err")"
grep -q "grads f32" "$T/train.err" && ok || bad "the run's banner does not say grads f32: $(cat "$T/train.err")"
grep -q "^grad-dtype = auto$" "$T/run/config" && ok || bad "RUN/config lacks grad-dtype = auto"

finish
