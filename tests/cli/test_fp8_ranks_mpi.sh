#!/usr/bin/env bash
# FP8's delayed scaling over several ranks (label mpi): each step's amaxes are the largest over every rank, so
# every rank keeps the same histories and scales each operand alike. At 2 ranks (data parallelism), 2 x 2
# (tensor x data parallelism), 2 (a ring over the sequence) and 2 x 2 (Ulysses x ZeRO-3): the run follows one
# process's within FP8's rounding; a run stopped and resumed at step 5 continues bit for bit as the run that
# was not stopped (every rank restores the histories rank 0 wrote, which are its own only if the ranks agreed
# on them).
source "$(dirname "$0")/lib.sh" fp8_ranks_mpi "$@"
need_mpirun
test_seed
args=(--layers=2 --heads=4 --kv-heads=2 --dim=32 --seq=32 --batch=2 --eval-every=0 --threads=1 --quiet
  --log-every=1 --lr=3e-3 --warmup=0 --schedule=constant --seed=$seed --max-steps=10 --pos=rope --norm=rmsnorm
  --mlp=swiglu --bias=0 --precision=fp8 --fp8-recipe=delayed --fp8-history=4 --total-batch=128)

losses() { python3 -c "import json,sys; print(' '.join(str(r['loss']) for r in map(json.loads, open(sys.argv[1])) if 'loss' in r))" "$1/metrics.jsonl"; }
close() { # close A B TOL: every step's loss within TOL (relative)
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
def rows(d):
    return {r["step"]: r["loss"] for r in map(json.loads, open(d + "/metrics.jsonl")) if "loss" in r}
a, b, tol = rows(sys.argv[1]), rows(sys.argv[2]), float(sys.argv[3])
assert sorted(a) == sorted(b) and a, "steps differ"
worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in a)
print(f"  worst relative loss difference {worst:.2e}")
sys.exit(0 if worst <= tol else 1)
PY
}

"$KILN" train "${args[@]}" --checkpoint=0 --out="$T/one" 2>"$T/err" || bad "one process: $(tail -2 "$T/err")"
for layout in "2 --zero=1" "4 --tp=2 --zero=1" "2 --sp=2 --sp-mode=ring" "4 --sp=2 --zero=3"; do
  read -r np flags <<<"$layout"
  name=np${np}$(echo "$flags" | tr -d ' -=')
  echo "$np ranks: $flags"
  # shellcheck disable=SC2086 # (flags: words)
  "${MPI[@]}" -np "$np" "$KILN" train "${args[@]}" $flags --checkpoint=0 --out="$T/$name" 2>"$T/err" ||
    { bad "$flags at $np ranks failed: $(tail -3 "$T/err")"; continue; }
  # (each rank's first step scales by its own tokens' amaxes: e5m2 gradients' rounding, 2^-3, leaves up to
  # 2.5e-3 between the runs after 10 steps, seed 28632; 5e-3 is twice that)
  close "$T/one" "$T/$name" 5e-3 && ok || bad "$flags at $np ranks left one process's run by more than FP8's rounding"
  # stopped at step 5 and resumed: the same numbers as the run above, to the bit
  # shellcheck disable=SC2086
  "${MPI[@]}" -np "$np" "$KILN" train "${args[@]}" $flags --max-steps=5 --out="$T/${name}_r" 2>"$T/err" &&
    "${MPI[@]}" -np "$np" "$KILN" train "${args[@]}" $flags --out="$T/${name}_r" 2>"$T/err" ||
    { bad "$flags at $np ranks, stopped and resumed: $(tail -3 "$T/err")"; continue; }
  [ "$(losses "$T/$name")" = "$(losses "$T/${name}_r")" ] && ok ||
    bad "$flags at $np ranks: the resumed run's losses differ from the uninterrupted run's"
done
finish
