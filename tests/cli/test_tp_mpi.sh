#!/usr/bin/env bash
# Tensor parallelism on the CPU under mpirun (label mpi): --tp=2 and --tp=4 follow the single-process run
# (loss, gradient norm and validation loss at every step of 12, and the whole model it writes) for GPT-2's
# block, Llama's (RMSNorm, SwiGLU, RoPE, GQA, with fewer key/value heads than ranks too), the parallel block;
# with Megatron's sequence parallelism inside the group (the default) and without it (--tp-sp=0); tp x dp
# under every ZeRO level; tp x sp; bad combinations fail with one line.
source "$(dirname "$0")/lib.sh" tp_mpi "$@"
if ! command -v mpirun >/dev/null; then
  echo "mpirun not found: skipped (scripts/install-deps.sh installs openmpi-bin)"
  exit 77
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
MPI=(mpirun --oversubscribe --bind-to none)
# a fresh seed each run, printed so that a failure can be run again: KILN_TEST_SEED=N
seed=${KILN_TEST_SEED:-$((RANDOM + 1))}
echo "seed $seed"
args=(--layers=2 --heads=4 --dim=32 --seq=32 --batch=2 --eval-every=4 --eval-steps=2 --threads=1 --quiet
  --log-every=1 --lr=3e-3 --warmup=2 --seed=$seed --max-steps=12 --checkpoint=0)

# same_steps A B TOL: loss, grad_norm and val_loss agree at every step within TOL (relative)
same_steps() {
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
a, b, tol = sys.argv[1], sys.argv[2], float(sys.argv[3])
def rows(d):
    return {r["step"]: r for r in map(json.loads, open(d + "/metrics.jsonl")) if "loss" in r}
ra, rb = rows(a), rows(b)
assert sorted(ra) == sorted(rb) and ra, f"steps differ: {sorted(ra)} vs {sorted(rb)}"
worst, where = 0.0, ""
for s in ra:
    for k in ("loss", "grad_norm", "val_loss"):
        if k in ra[s] or k in rb[s]:
            x, y = ra[s][k], rb[s][k]
            d = abs(x - y) / max(abs(x), 1e-12)
            if d > worst:
                worst, where = d, f" ({k} at step {s}: {x} vs {y})"
print(f"  worst relative difference in loss, grad_norm, val_loss: {worst:.2e}{where}")
sys.exit(0 if worst <= tol else 1)
PY
}

# check NAME NP MODEL-ARGS -- PARALLEL-ARGS: the single-process run against NP ranks with PARALLEL-ARGS
check() {
  local name=$1 np=$2
  shift 2
  local extra=()
  while [ "$1" != -- ]; do extra+=("$1"); shift; done
  shift
  local single="$T/single_${extra[*]// /_}"
  if [ ! -e "$single/metrics.jsonl" ]; then
    "$KILN" train "${args[@]}" "${extra[@]}" --out="$single" 2>"$T/err" ||
      bad "$name: single-process run failed: $(tail -2 "$T/err")"
  fi
  echo "$name ($np ranks: $*)"
  "${MPI[@]}" -np "$np" "$KILN" train "${args[@]}" "${extra[@]}" "$@" --out="$T/$name" 2>"$T/err" ||
    { bad "$name failed: $(tail -3 "$T/err")"; return; }
  same_steps "$single" "$T/$name" 1e-5 && same_run "$single" "$T/$name" 1e-5 && ok ||
    bad "$name left the single-process run"
}

gpt=(--pos=learned)
llama=(--pos=rope --norm=rmsnorm --mlp=swiglu --bias=0 --kv-heads=2 --tie-embeddings=0)
check tp2_gpt 2 "${gpt[@]}" -- --tp=2
check tp4_gpt 4 "${gpt[@]}" -- --tp=4
check tp2_llama 2 "${llama[@]}" -- --tp=2
# 2 key/value heads over 4 ranks: each rank holds a copy of one, whose gradients its sharers sum
check tp4_llama_kvcopy 4 "${llama[@]}" -- --tp=4
check tp2_mqa 2 --pos=rope --kv-heads=1 -- --tp=2
check tp2_parallel 2 --block=parallel -- --tp=2
# every rank holding every row: all-reduces instead of all-gathers and reduce-scatters
check tp2_gpt_nosp 2 "${gpt[@]}" -- --tp=2 --tp-sp=0
check tp4_llama_kvcopy_nosp 4 "${llama[@]}" -- --tp=4 --tp-sp=0
check tp2_parallel_nosp 2 --block=parallel -- --tp=2 --tp-sp=0
check tp2_dp2_zero1_nosp 4 "${llama[@]}" --total-batch=128 -- --tp=2 --zero=1 --tp-sp=0
# tensor parallelism inside, data parallelism across, at every ZeRO level; and with sequence parallelism
# (the single-process run takes the same 128 tokens a step in two micro-steps)
for z in 0 1 2 3; do
  check tp2_dp2_zero$z 4 "${llama[@]}" --total-batch=128 -- --tp=2 --zero=$z
done
check tp2_sp2 4 "${gpt[@]}" -- --tp=2 --sp=2
check tp2_sp2_ring 4 "${llama[@]}" -- --tp=2 --sp=2 --sp-mode=ring

# one line for what cannot be split or laid out
mpi_error() { # mpi_error NP PATTERN ARGS...: every rank exits non-zero; rank 0's one error line has PATTERN
  local np=$1 pat=$2
  shift 2
  "${MPI[@]}" -np "$np" "$KILN" train "${args[@]}" "$@" --out="$T/bad" >"$T/out" 2>"$T/err" &&
    { bad "kiln train $* at $np ranks succeeded"; return; }
  local n
  n=$(grep -c 'error: ' "$T/err")
  grep -q "error: .*$pat" "$T/err" && [ "$n" -ge 1 ] && ok ||
    bad "kiln train $* at $np ranks: no one-line error with '$pat': $(head -3 "$T/err")"
}
mpi_error 3 "heads 4 split 3 ways" --tp=3
mpi_error 3 "not a multiple of it" --tp=2
mpi_error 2 "kv-heads" --kv-heads=1 --block=parallel --tp=2 --pos=rope
mpi_error 2 "sequence parts" --tp=2 --batch=1 --seq=31 --block-size=32
expect_error 2 "tp 2 with checkpoints" -- train "${args[@]}" --tp=2 --checkpoint=1 --out="$T/ck"
expect_error 2 "sample-every with tp 2" -- train "${args[@]}" --tp=2 --sample-every=2
finish
