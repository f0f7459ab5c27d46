#!/usr/bin/env bash
# Tensor parallelism on the CPU under mpirun (label mpi): --tp=2 and --tp=4 follow the single-process run
# (loss, gradient norm and validation loss at every step of 12, and the whole model it writes) for GPT-2's
# block, Llama's (RMSNorm, SwiGLU, RoPE, GQA, with fewer key/value heads than ranks too), the parallel block;
# with Megatron's sequence parallelism inside the group (the default) and without it (--tp-sp=0), its
# collectives in the synchronous order (--tp-overlap=off, the default), overlapped around a ring (ring), and
# off's reordered (bulk, to the bit off's), with collectives that complete late too (a GEMM that read a chunk
# before it arrived would show);
# tp x dp under every ZeRO level; tp x sp; checkpoints across degrees and overlaps; bad combinations fail
# with one line.
source "$(dirname "$0")/lib.sh" tp_mpi "$@"
need_mpirun
test_seed
args=(--layers=2 --heads=4 --dim=32 --seq=32 --batch=2 --eval-every=4 --eval-steps=2 --threads=1 --quiet
  --log-every=1 --lr=3e-3 --warmup=2 --seed=$seed --max-steps=12 --checkpoint=0)

# same_steps A B TOL [GN]: loss, grad_norm and val_loss agree at every step within TOL (relative); the gradient
# norm within GN x TOL (default 10)
same_steps() {
  python3 - "$1" "$2" "$3" "${4:-10}" <<'PY'
import json, sys
a, b, tol, gn = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
def rows(d):
    return {r["step"]: r for r in map(json.loads, open(d + "/metrics.jsonl")) if "loss" in r}
ra, rb = rows(a), rows(b)
assert sorted(ra) == sorted(rb) and ra, f"steps differ: {sorted(ra)} vs {sorted(rb)}"
worst, where = 0.0, ""
for s in ra:
    for k in ("loss", "grad_norm", "val_loss"): # (a run cut at step 6 also evaluated there)
        if k != "val_loss" or (k in ra[s] and k in rb[s]):
            x, y = ra[s][k], rb[s][k]
            # the gradient norm is a sum of squares over every parameter, in another order: GN times the room
            d = abs(x - y) / max(abs(x), 1e-12) / (gn if k == "grad_norm" else 1)
            if d > worst:
                worst, where = d, f" ({k} at step {s}: {x} vs {y})"
print(f"  worst relative difference in loss, val_loss (grad_norm's / {gn:g}): {worst:.2e}{where}")
sys.exit(0 if worst <= tol else 1)
PY
}

# check NAME NP MODEL-ARGS -- PARALLEL-ARGS: the single-process run against NP ranks with PARALLEL-ARGS
# (mpirun gets the words of $mpi_env too, as -x VAR=VALUE)
mpi_env=()
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
  "${MPI[@]}" "${mpi_env[@]}" -np "$np" "$KILN" train "${args[@]}" "${extra[@]}" "$@" --out="$T/$name" 2>"$T/err" ||
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
check tp4_parallel 4 --block=parallel -- --tp=4
# the sequence split's collectives named: the synchronous order (the default above), and the ring
check tp2_gpt_off 2 "${gpt[@]}" -- --tp=2 --tp-overlap=off
check tp2_gpt_ring 2 "${gpt[@]}" -- --tp=2 --tp-overlap=ring
check tp4_llama_kvcopy_ring 4 "${llama[@]}" -- --tp=4 --tp-overlap=ring
# every transfer of the ring completing late (the MPI worker sleeps before each): a GEMM that read a chunk
# before its transfer was awaited, or a buffer refilled while a transfer still read it, gives other sums
mpi_env=(-x KILN_COMM_DELAY_US=3000)
check tp4_llama_ring_late 4 "${llama[@]}" -- --tp=4 --tp-overlap=ring
check tp4_gpt_ring_late 4 "${gpt[@]}" -- --tp=4 --tp-overlap=ring
check tp2_parallel_ring_late 2 --block=parallel -- --tp=2 --tp-overlap=ring
mpi_env=()
# bulk: off's collectives, with the GEMM of the rank's own rows under an all-gather (a column-parallel
# forward's input, a row-parallel backward's dL/doutput; then the rows before and after), and a
# column-parallel backward's all-gather issued before the dinp GEMM and dinp's reduce-scatter before the dW
# GEMM: every output row the same product, so off's sums to the bit
# here (f32), also with every transfer late (a GEMM that read the input before its gather was awaited gives
# other sums). Under FP8 the forward's row blocks are scaled each by its own amax: within FP8's rounding.
same_bits() { # same_bits A B: the loss and gradient norm of every step, as written
  [ -s "$T/$1/metrics.jsonl" ] && [ "$(cut -d, -f1-4 "$T/$1/metrics.jsonl")" = "$(cut -d, -f1-4 "$T/$2/metrics.jsonl")" ] &&
    ok || bad "$2's numbers differ from $1's"
}
check tp2_gpt_bulk 2 "${gpt[@]}" -- --tp=2 --tp-overlap=bulk
same_bits tp2_gpt_off tp2_gpt_bulk
# KILN_TP_COPY_ENGINE=1 asks NCCL for the copy engines; over MPI the group is split as usual and the gathered
# rows are allocated as usual (no symmetric windows): the same run
"${MPI[@]}" -x KILN_TP_COPY_ENGINE=1 -np 2 "$KILN" train "${args[@]}" "${gpt[@]}" --tp=2 --tp-overlap=bulk \
  --out="$T/tp2_gpt_bulk_ce" 2>"$T/err" || bad "KILN_TP_COPY_ENGINE=1 over MPI: $(tail -3 "$T/err")"
same_bits tp2_gpt_bulk tp2_gpt_bulk_ce
for fl in "2 --pos=rope --kv-heads=4 --mlp=swiglu --norm=rmsnorm --bias=0" "4 --block=parallel" \
  "2 --pos=rope --kv-heads=4 --mlp=swiglu --norm=rmsnorm --bias=0 --precision=fp8"; do
  read -r np flags <<<"$fl"
  # (and --tp-keep-gathered, below: the backward's column-parallel inputs kept from the forward)
  for o in off bulk; do
    for k in 0 1; do
      # shellcheck disable=SC2086 # (flags: words)
      "${MPI[@]}" -x KILN_COMM_DELAY_US=3000 -np "$np" "$KILN" train "${args[@]}" $flags --tp="$np" --tp-overlap=$o \
        --tp-keep-gathered=$k --out="$T/late_${o}_$k" 2>"$T/err" ||
        bad "$flags --tp=$np --tp-overlap=$o --tp-keep-gathered=$k, late transfers: $(tail -3 "$T/err")"
    done
  done
  echo "bulk against off, each with the gathered inputs kept too, late transfers: --tp=$np $flags"
  for r in bulk_0 off_1 bulk_1; do
    if [[ $flags == *fp8* ]] && [[ $r == bulk* ]]; then
      # (bulk scales each row block by its own amax: other e4m3 and e5m2 codes. The losses stay within 0.1%,
      # but one step's gradient norm of this 2-layer model was seen 9% off at some seeds: 6814, 30894)
      same_steps "$T/late_off_0" "$T/late_$r" 5e-3 40 && ok || bad "$flags: late_$r left off's run by more than FP8's rounding"
    else
      same_bits late_off_0 "late_$r"
    fi
  done
  rm -rf "$T"/late_*
done
# --tp-keep-gathered: each column-parallel layer's input as the forward gathered it, for dW: the same products
# as gathering it again, so the same numbers to the bit; with key/value head copies, with block recompute (the
# forward runs again inside the backward and gathers again), and over two micro-steps a step
keep_same() { # keep_same NAME NP FLAGS...: the run with --tp-keep-gathered=1 against the one without
  local name=$1 np=$2
  shift 2
  for k in 0 1; do
    "${MPI[@]}" -np "$np" "$KILN" train "${args[@]}" "$@" --tp-keep-gathered=$k --out="$T/${name}_$k" 2>"$T/err" ||
      bad "$name, --tp-keep-gathered=$k: $(tail -3 "$T/err")"
  done
  echo "$name: --tp-keep-gathered=1 against 0 ($np ranks: $*)"
  same_bits "${name}_0" "${name}_1"
}
keep_same keep_kvcopy 4 "${llama[@]}" --tp=4
keep_same keep_block 2 "${gpt[@]}" --tp=2 --recompute=block --tp-overlap=bulk
keep_same keep_parallel_micro 2 --block=parallel --tp=2 --total-batch=128
# kiln info counts the kept inputs: 8 layers x 2 column-parallel layers x (8 x 1024 rows, 1024 wide) f32, 0.5
# GiB more
tp_gib() {
  "$KILN" info --layers=8 --heads=8 --dim=1024 --seq=1024 --block-size=1024 --batch=8 --tp=2 --world=2 "$@" |
    awk '/tensor parallelism/ { sub(/.*buffers /, ""); print $1; exit }'
}
g0=$(tp_gib) g1=$(tp_gib --tp-keep-gathered=1)
echo "kiln info, tensor parallelism's buffers: $g0 GiB, kept inputs $g1 GiB"
python3 -c "import sys; sys.exit(0 if abs(float('$g1') - float('$g0') - 0.5) < 0.001 else 1)" 2>/dev/null && ok ||
  bad "kiln info does not count --tp-keep-gathered's 0.5 GiB ($g0 then $g1 GiB)"
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
check tp2_dp2_zero3_ring 4 "${llama[@]}" --total-batch=128 -- --tp=2 --zero=3 --tp-overlap=ring
check tp2_dp2_zero3_bulk 4 "${llama[@]}" --total-batch=128 -- --tp=2 --zero=3 --tp-overlap=bulk
check tp2_sp2 4 "${gpt[@]}" -- --tp=2 --sp=2
check tp2_sp2_ring 4 "${llama[@]}" -- --tp=2 --sp=2 --sp-mode=ring
check tp2_sp2_tpring 4 "${gpt[@]}" -- --tp=2 --sp=2 --tp-overlap=ring

# checkpoints reshard across tensor-parallel degrees: 6 steps under one layout, 6 more under another, against
# 12 steps of one process (metrics of every step, and the final weights); a constant learning rate, so that
# the first half's --max-steps=6 does not change the schedule
resume_check() { # resume_check NAME NP1 FLAGS1 -- NP2 FLAGS2 (each NP 1: no mpirun)
  local name=$1 np1=$2
  shift 2
  local f1=()
  while [ "$1" != -- ]; do f1+=("$1"); shift; done
  shift
  local np2=$1
  shift
  local same=("${args[@]}" "${llama[@]}" --total-batch=256 --schedule=constant --warmup=0)
  local run=("$KILN" train "${same[@]}" --checkpoint=1 --ckpt-every=6)
  local single="$T/single_ck"
  [ -e "$single/metrics.jsonl" ] || "$KILN" train "${same[@]}" --out="$single" 2>"$T/err" ||
    bad "$name: single-process run failed: $(tail -2 "$T/err")"
  launch() { if [ "$1" = 1 ]; then shift; "$@"; else local n=$1; shift; "${MPI[@]}" -np "$n" "$@"; fi; }
  echo "$name ($np1 ranks: ${f1[*]}; then $np2 ranks: $*)"
  launch "$np1" "${run[@]}" "${f1[@]}" --max-steps=6 --out="$T/$name" 2>"$T/err" ||
    { bad "$name: first half failed: $(tail -3 "$T/err")"; return; }
  launch "$np2" "${run[@]}" "$@" --out="$T/$name" 2>"$T/err" ||
    { bad "$name: resumed half failed: $(tail -3 "$T/err")"; return; }
  grep -q "resuming from .*step_00000006" "$T/err" || { bad "$name did not resume from step 6: $(tail -2 "$T/err")"; return; }
  same_steps "$single" "$T/$name" 1e-5 && same_run "$single" "$T/$name" 1e-5 && ok || bad "$name left the single-process run"
}
resume_check ck_tp2_tp2 2 --tp=2 -- 2 --tp=2
resume_check ck_tp2_to_1 2 --tp=2 -- 1
resume_check ck_1_to_tp2 1 -- 2 --tp=2 --tp-sp=0
resume_check ck_tp4_to_tp2dp2 4 --tp=4 -- 4 --tp=2 --zero=1
resume_check ck_tp2dp2z3_to_tp4 4 --tp=2 --zero=3 -- 4 --tp=4
# the overlap is no part of a checkpoint's layout: one written under either resumes under the other
resume_check ck_tp4off_to_tp2ring 4 --tp=4 --tp-overlap=off -- 2 --tp=2 --tp-overlap=ring
resume_check ck_tp4ring_to_tp4off 4 --tp=4 --tp-overlap=ring -- 4 --tp=4 --tp-overlap=off

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
expect_error 2 "sample-every with tp 2" -- train "${args[@]}" --tp=2 --sample-every=2
finish
