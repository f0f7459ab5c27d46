#!/usr/bin/env bash
# ZeRO-3's FP8 all-gather (label mpi): with --fp8-all-gather the layers' linear weights travel as e4m3 codes
# that each rank casts from its own slices, with the amax of the whole weight (the largest of the ranks'), so
# the codes are those the FP8 hook would cast from the gathered bf16 weights: the run equals the run without
# the option to the bit. At 3 ranks (uneven slices, a weight cut between ranks), at 2 with parallel blocks
# (c_attn and c_fc one GEMM, one scale), and at 2 x 2 tensor x data parallelism; a run stopped and resumed
# continues bit for bit; the run follows one process's within FP8's rounding; what it cannot do is refused
# in one line.
source "$(dirname "$0")/lib.sh" fp8_gather_mpi "$@"
need_mpirun
test_seed
args=(--layers=4 --heads=4 --kv-heads=2 --dim=32 --seq=32 --batch=2 --eval-every=0 --threads=1 --quiet
  --log-every=1 --lr=3e-3 --warmup=0 --schedule=constant --seed=$seed --max-steps=8 --pos=rope --norm=rmsnorm
  --mlp=swiglu --bias=0 --precision=fp8 --zero=3 --checkpoint=0 --total-batch=384)

losses() { python3 -c "import json,sys; print(' '.join(str(r['loss']) for r in map(json.loads, open(sys.argv[1])) if 'loss' in r))" "$1/metrics.jsonl"; }

# same LAYOUT NP FLAGS...: the run with --fp8-all-gather=1 against the run without, to the bit
same() {
  local name=$1 np=$2
  shift 2
  for g in 0 1; do
    "${MPI[@]}" -np "$np" "$KILN" train "${args[@]}" "$@" --fp8-all-gather=$g --out="$T/${name}_$g" 2>"$T/err" ||
      { bad "$name, --fp8-all-gather=$g: $(tail -3 "$T/err")"; return; }
  done
  [ -n "$(losses "$T/${name}_1")" ] && [ "$(losses "$T/${name}_0")" = "$(losses "$T/${name}_1")" ] && ok ||
    bad "$name: the FP8 all-gather's losses differ from the bf16 gather's: $(losses "$T/${name}_0") / $(losses "$T/${name}_1")"
}

same np3 3
same parallel 2 --block=parallel --mlp=gelu --bias=1 --norm=layernorm --pos=learned
same tp2dp2 4 --tp=2

# stopped at step 4 and resumed: the codes are cast again from the resumed weights, bit for bit
"${MPI[@]}" -np 3 "$KILN" train "${args[@]}" --fp8-all-gather=1 --checkpoint=1 --max-steps=4 --out="$T/r" 2>"$T/err" &&
  "${MPI[@]}" -np 3 "$KILN" train "${args[@]}" --fp8-all-gather=1 --checkpoint=1 --out="$T/r" 2>"$T/err" ||
  bad "stopped and resumed: $(tail -3 "$T/err")"
[ "$(losses "$T/np3_1")" = "$(losses "$T/r")" ] && ok || bad "the resumed run's losses differ from the uninterrupted run's"

# one process (no gather at all) within FP8's rounding
"$KILN" train "${args[@]}" --zero=0 --out="$T/one" 2>"$T/err" || bad "one process: $(tail -2 "$T/err")"
python3 - "$T/one" "$T/np3_1" <<'PY' && ok || bad "3 ranks with the FP8 all-gather left one process's run by more than FP8's rounding"
import json, sys
rows = lambda d: [r["loss"] for r in map(json.loads, open(d + "/metrics.jsonl")) if "loss" in r]
a, b = rows(sys.argv[1]), rows(sys.argv[2])
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b)) if a and len(a) == len(b) else 1
print(f"  worst relative loss difference against one process {worst:.2e}")
sys.exit(0 if worst <= 5e-3 else 1)  # (each rank scales its own tokens: FP8's rounding, as test_fp8_ranks_mpi)
PY

# refused in one line, naming the option
refuse() { # refuse WHAT PATTERN FLAGS...
  local what=$1 pat=$2
  shift 2
  "$KILN" train "${args[@]}" --max-steps=1 --out="$T/x" "$@" >"$T/out" 2>&1
  local rc=$?
  [ $rc -eq 2 ] && [ "$(grep -c . "$T/out")" -eq 1 ] && grep -q -- "$pat" "$T/out" && ok ||
    bad "$what: exit $rc, $(head -c 300 "$T/out")"
}
refuse "bf16" "--fp8-all-gather with precision bf16" --precision=bf16 --fp8-all-gather=1
refuse "ZeRO-1" "without --zero=3" --zero=1 --fp8-all-gather=1
refuse "rowwise" "recipe rowwise" --fp8-recipe=rowwise --fp8-all-gather=1
refuse "offload" "fp8-all-gather with --offload=optimizer" --offload=optimizer --fp8-all-gather=1
finish
