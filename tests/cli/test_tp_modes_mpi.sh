#!/usr/bin/env bash
# Tensor parallelism with every recompute mode, the offloaded optimizer and activations, and FP8 (label mpi):
# --tp=2 on the CPU against one process with the same flags (loss and grad norm at every step within 1e-5).
# FP8's scales are each rank's part's own, so a split model rounds differently from a whole one: there the
# loss stays within FP8's own error of the f32 run's (2% at every step, as test_fp8 allows one process).
source "$(dirname "$0")/lib.sh" tp_modes_mpi "$@"
need_mpirun
test_seed
args=(--layers=2 --heads=4 --kv-heads=2 --dim=32 --seq=32 --batch=2 --eval-every=0 --threads=1 --quiet
  --log-every=1 --lr=3e-3 --warmup=2 --seed=$seed --max-steps=8 --checkpoint=0 --pos=rope --norm=rmsnorm
  --mlp=swiglu --bias=0)

close() { # close A B TOL KEYS: every step's KEYS (comma-separated) within TOL (relative)
  python3 - "$1" "$2" "$3" "$4" <<'PY'
import json, sys
def rows(d):
    return {r["step"]: r for r in map(json.loads, open(d + "/metrics.jsonl")) if "loss" in r}
a, b, tol = rows(sys.argv[1]), rows(sys.argv[2]), float(sys.argv[3])
assert sorted(a) == sorted(b) and a, "steps differ"
worst = max(abs(a[s][k] - b[s][k]) / abs(a[s][k]) for s in a for k in sys.argv[4].split(","))
print(f"  worst relative difference {worst:.2e}")
sys.exit(0 if worst <= tol else 1)
PY
}
for flags in "--recompute=none" "--recompute=act" "--recompute=mlp" "--recompute=selective" "--recompute=block" \
  "--recompute=block --offload=activations" "--zero=1 --offload=optimizer" "--zero=3 --offload=all --recompute=block" \
  "--precision=fp8" "--precision=fp8 --fp8-recipe=rowwise"; do
  name=$(echo "$flags" | tr -d ' -' | tr '=' '_')
  echo "$flags"
  "$KILN" train "${args[@]}" $flags --out="$T/one_$name" 2>"$T/err" || { bad "$flags: one process failed: $(tail -2 "$T/err")"; continue; }
  mpirun --oversubscribe --bind-to none -np 2 "$KILN" train "${args[@]}" $flags --tp=2 --out="$T/tp_$name" 2>"$T/err" ||
    { bad "$flags --tp=2 failed: $(tail -3 "$T/err")"; continue; }
  if [[ $flags == *fp8* ]]; then
    [ -e "$T/f32/metrics.jsonl" ] || "$KILN" train "${args[@]}" --out="$T/f32" 2>"$T/err"
    close "$T/f32" "$T/tp_$name" 2e-2 loss && ok || bad "$flags --tp=2 left the f32 run by more than FP8's error"
  else
    close "$T/one_$name" "$T/tp_$name" 1e-5 loss,grad_norm && ok || bad "$flags --tp=2 left the single-process run"
  fi
done
finish
