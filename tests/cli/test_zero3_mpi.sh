#!/usr/bin/env bash
# ZeRO-3 and the offloaded optimizer on the CPU under mpirun (label mpi): ZeRO-3 at 2, 3 and 4 ranks follows the
# single-process trajectory for sequential and parallel blocks, GQA with RoPE and SwiGLU, and an untied head with
# ALiBi and QK-norm; --prefetch and --recompute do not change a bit; --offload=optimizer gives bitwise the weights
# of the same run without it at every --zero level, and with a slow host that the next forward must wait for;
# --zero3-accumulate=whole and --zero3-reshard-after-forward=0 keep the trajectory, communicate less and cost
# the memory kiln info plans; in one process ZeRO-3 reads each shard in place (bitwise ZeRO-2's weights and
# peak memory with the same buckets, no gathers); checkpoints resume across every pair of --zero levels, with
# and without offload, on another world size; per-rank memory falls as the ranks grow and stays within 10% of
# kiln info's plan; bad combinations fail with one line.
source "$(dirname "$0")/lib.sh" zero3_mpi "$@"
need_mpirun
test_seed
# the offloaded optimizer in chunks of 777 elements, so that its pipeline has many (32M by default)
export KILN_OFFLOAD_CHUNK=777
# 4 layers (a bottom, two ring and a top bucket), 768 tokens a step = 12 micro-batches of 2 x 32, clipping on
args=(--layers=4 --heads=4 --dim=32 --seq=32 --batch=2 --total-batch=768 --eval-every=3 --eval-steps=2
  --threads=1 --quiet --log-every=1 --grad-clip=0.5 --schedule=constant --warmup=0 --lr=3e-3
  --seed=$seed)

# ---- the trajectory, at every world size and for the model family ----
"$KILN" train "${args[@]}" --max-steps=6 --out="$T/single" || bad "single-process run failed"
for np in 2 3 4; do
  "${MPI[@]}" -np $np "$KILN" train "${args[@]}" --max-steps=6 --zero=3 --out="$T/z3n$np" 2>"$T/err" ||
    bad "ZeRO-3 at $np ranks failed: $(tail -3 "$T/err")"
  same_run "$T/single" "$T/z3n$np" 2e-5 && ok || bad "ZeRO-3 at $np ranks left the single-process trajectory"
done
models=("--block=parallel" "--kv-heads=2 --pos=rope --mlp=swiglu --norm=rmsnorm"
  "--tie-embeddings=0 --pos=alibi --qk-norm=1 --layers=3")
for i in 0 1 2; do
  # shellcheck disable=SC2086
  "$KILN" train "${args[@]}" ${models[$i]} --max-steps=4 --out="$T/m$i" 2>"$T/err" || bad "model $i: $(tail -2 "$T/err")"
  # shellcheck disable=SC2086
  "${MPI[@]}" -np 3 "$KILN" train "${args[@]}" ${models[$i]} --max-steps=4 --zero=3 --out="$T/m${i}z" 2>"$T/err" ||
    bad "model $i under ZeRO-3: $(tail -2 "$T/err")"
  same_run "$T/m$i" "$T/m${i}z" 2e-5 && ok || bad "ZeRO-3 left the trajectory for ${models[$i]}"
done
# what is gathered when changes no number: two layers prefetched, and the backward's recompute of each block
"${MPI[@]}" -np 3 "$KILN" train "${args[@]}" --max-steps=6 --zero=3 --prefetch=2 --recompute=block \
  --out="$T/z3pf" 2>"$T/err" || bad "prefetch 2: $(tail -3 "$T/err")"
same_weights "$T/z3n3" "$T/z3pf" && ok || bad "--prefetch=2 --recompute=block changed ZeRO-3's weights"

# ---- offload: the host's AdamW is the CPU backend's, so the weights are bitwise the same ----
for z in 0 1 2 3; do
  for np in 1 3; do
    "${MPI[@]}" -np $np "$KILN" train "${args[@]}" --max-steps=4 --zero=$z --out="$T/n$z$np" 2>/dev/null &&
      "${MPI[@]}" -np $np "$KILN" train "${args[@]}" --max-steps=4 --zero=$z --offload=optimizer \
        --out="$T/o$z$np" 2>"$T/err" || bad "offload, zero $z, $np ranks: $(tail -3 "$T/err")"
    same_weights "$T/n$z$np" "$T/o$z$np" && ok || bad "offload changed the weights at zero $z, $np ranks"
  done
done
# and without mpirun: one process, no --comm
"$KILN" train "${args[@]}" --max-steps=4 --offload=optimizer --out="$T/o1" 2>"$T/err" || bad "offload alone: $(tail -3 "$T/err")"
"$KILN" train "${args[@]}" --max-steps=4 --out="$T/n1" 2>/dev/null
same_weights "$T/n1" "$T/o1" && ok || bad "offload in one process changed the weights"
# The offloaded step runs beside the next forward, which waits for each chunk it reads. A slow host (2 ms before
# each chunk) makes every one of those waits matter: a missed one reads stale weights, and the bits differ.
# Evaluation, a sample and checkpoints come between the steps too.
slow() { KILN_OFFLOAD_DELAY_US=2000 "$@"; }
for z in 0 3; do
  slow "${MPI[@]}" -np 3 "$KILN" train "${args[@]}" --max-steps=4 --zero=$z --offload=optimizer --ckpt-every=2 \
    --out="$T/s$z" 2>"$T/err" || bad "slow host, zero $z: $(tail -3 "$T/err")"
  same_weights "$T/n${z}3" "$T/s$z" && ok || bad "a slow host changed the weights at zero $z"
done
slow "$KILN" train "${args[@]}" --max-steps=4 --offload=optimizer --sample-every=2 --out="$T/s1" 2>"$T/err" ||
  bad "slow host, one process: $(tail -3 "$T/err")"
same_weights "$T/n1" "$T/s1" && ok || bad "a slow host changed the weights in one process"
# the training thread's waits are part of the host's steps, never more
python3 - "$T/s1/metrics.jsonl" <<'PY2' && ok || bad "offload_wait_ms is not within offload_ms"
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if "offload_ms" in r]
busy, wait = sum(r["offload_ms"] for r in rows), sum(r["offload_wait_ms"] for r in rows)
gbps = [r.get("offload_copy_gbps", 0) for r in rows]
print(f"slow host: {len(rows)} steps, host steps {busy:.1f} ms, waited {wait:.1f} ms, copies {min(gbps):.2f} GB/s at least")
sys.exit(0 if rows and 0 < wait <= busy + 1.0 and min(gbps) > 0 else 1)
PY2

# ---- resume across every pair of --zero levels (4 ranks -> 2), with and without offload on either side ----
ck=("${args[@]}" --ckpt-every=3)
"$KILN" train "${ck[@]}" --max-steps=6 --out="$T/full" 2>/dev/null || bad "uninterrupted run failed"
for from in 0 1 2 3; do
  off=""
  [ "$from" -eq 2 ] && off="--offload=optimizer" # a checkpoint written by an offloaded run too
  # shellcheck disable=SC2086
  "${MPI[@]}" -np 4 "$KILN" train "${ck[@]}" --max-steps=3 --zero=$from $off --out="$T/src$from" 2>"$T/err" ||
    bad "checkpoint at zero $from: $(tail -3 "$T/err")"
  for to in 0 1 2 3; do
    rm -rf "$T/dst"
    cp -r "$T/src$from" "$T/dst"
    off=""
    [ "$to" -eq 3 ] && off="--offload=optimizer"
    # shellcheck disable=SC2086
    "${MPI[@]}" -np 2 "$KILN" train "${ck[@]}" --max-steps=6 --zero=$to $off --out="$T/dst" 2>"$T/err" ||
      bad "resume zero $from -> $to: $(tail -3 "$T/err")"
    same_run "$T/full" "$T/dst" 2e-5 >/dev/null && ok || bad "resume zero $from (4 ranks) -> $to (2 ranks) left the trajectory"
  done
done
# at the same world size and level, a resume is bit-exact
"${MPI[@]}" -np 3 "$KILN" train "${ck[@]}" --max-steps=6 --zero=3 --offload=optimizer --out="$T/bx" 2>/dev/null
cp -r "$T/bx" "$T/bx2"
rm -rf "$T/bx2/ckpt/step_00000006" "$T/bx2/model.safetensors"
"${MPI[@]}" -np 3 "$KILN" train "${ck[@]}" --max-steps=6 --zero=3 --offload=optimizer --out="$T/bx2" 2>/dev/null
same_weights "$T/bx" "$T/bx2" && ok || bad "ZeRO-3 with offload: a resume at the same world size is not bit-exact"

# ---- FSDP's two trade-offs ----
ops() { python3 -c "import json,sys; print(' '.join(str(r.get('comm_ops', 0)) for r in map(json.loads, open(sys.argv[1]))))" "$1/metrics.jsonl"; }
# --zero3-accumulate=whole: whole gradients accumulate over the micro-steps (4 a step at 3 ranks) and each of
# the 4 buckets is reduce-scattered on the last one only: the same trajectory, with 3 x 4 = 12 fewer
# collectives every step than reduce-scattering every micro-step (z3n3); the plan holds the whole gradients
"${MPI[@]}" -np 3 "$KILN" train "${args[@]}" --max-steps=6 --zero=3 --zero3-accumulate=whole --out="$T/whole" \
  2>"$T/err" || bad "zero3-accumulate whole: $(tail -3 "$T/err")"
same_run "$T/single" "$T/whole" 2e-5 && ok || bad "--zero3-accumulate=whole left the single-process trajectory"
python3 - "$(ops "$T/z3n3")" "$(ops "$T/whole")" <<'PY2' && ok || bad "--zero3-accumulate=whole: not 12 fewer collectives a step"
import sys
a, b = ([int(x) for x in v.split()] for v in sys.argv[1:])
steps = [x - y for x, y in zip(a, [0] + a[:-1])], [x - y for x, y in zip(b, [0] + b[:-1])]
print(f"collectives a step: reduce-scatter every micro-step {steps[0]}, once a step {steps[1]}")
sys.exit(0 if len(a) == len(b) == 6 and all(x - y == 12 for x, y in zip(*steps)) else 1)
PY2
# --zero3-reshard-after-forward=0: each layer's gathered weights stay from its forward to its backward (8
# layers: 6 between the top and bottom buckets, more than the ring of 3): bitwise the same weights, fewer
# collectives a step (no gather in the backward, none in the later micro-steps' forwards), more memory
deep=("${args[@]}" --layers=8 --max-steps=3)
"${MPI[@]}" -np 3 "$KILN" train "${deep[@]}" --zero=3 --out="$T/rs1" 2>"$T/err" || bad "8 layers: $(tail -3 "$T/err")"
"${MPI[@]}" -np 3 "$KILN" train "${deep[@]}" --zero=3 --zero3-reshard-after-forward=0 --out="$T/rs0" 2>"$T/err" ||
  bad "zero3-reshard-after-forward 0: $(tail -3 "$T/err")"
same_weights "$T/rs1" "$T/rs0" && ok || bad "--zero3-reshard-after-forward=0 changed the weights"
# The staging buffers are not zeroed before each use, only their padding: the backward assigns every tensor's
# gradients on its first write. KILN_POISON_STAGING=1 fills them with NaN first, so an element that is neither
# shows in the norm. At 8 layers the shared buffers take different buckets in turn: ZeRO-3 (bitwise the
# unpoisoned run), and ZeRO-2 with an untied head, ALiBi and parallel blocks, follow one process.
"$KILN" train "${deep[@]}" --out="$T/deep1" 2>"$T/err" || bad "8 layers, one process: $(tail -3 "$T/err")"
same_run "$T/deep1" "$T/rs1" 2e-5 && ok || bad "ZeRO-3 at 8 layers left the single-process trajectory"
KILN_POISON_STAGING=1 "${MPI[@]}" -np 3 "$KILN" train "${deep[@]}" --zero=3 --out="$T/rs1p" 2>"$T/err" ||
  bad "ZeRO-3, poisoned staging: $(tail -3 "$T/err")"
same_weights "$T/rs1" "$T/rs1p" && ok || bad "ZeRO-3 read a staging element that the backward did not write"
odd=(--tie-embeddings=0 --pos=alibi --block=parallel)
"$KILN" train "${deep[@]}" "${odd[@]}" --out="$T/deep1o" 2>"$T/err" || bad "8 layers (untied): $(tail -3 "$T/err")"
KILN_POISON_STAGING=1 "${MPI[@]}" -np 3 "$KILN" train "${deep[@]}" "${odd[@]}" --zero=2 --bucket-mb=0.02 \
  --out="$T/deep2" 2>"$T/err" || bad "ZeRO-2 at 8 layers: $(tail -3 "$T/err")"
same_run "$T/deep1o" "$T/deep2" 2e-5 && ok || bad "ZeRO-2 (poisoned staging) left the single-process trajectory"
python3 - "$(ops "$T/rs1")" "$(ops "$T/rs0")" <<'PY2' && ok || bad "--zero3-reshard-after-forward=0 did not gather less"
import sys
a, b = ([int(x) for x in v.split()] for v in sys.argv[1:])
print(f"collectives so far: resharded after the forward {a}, kept {b}")
sys.exit(0 if len(a) == len(b) == 3 and all(y < x for x, y in zip(a, b)) else 1)
PY2
# the plan: the measured peak (the CPU counts its allocations exactly) is kiln info's, for both trade-offs
for v in "rs0:--zero3-reshard-after-forward=0:deep" "whole:--zero3-accumulate=whole:args"; do
  IFS=: read -r dir flag arr <<<"$v"
  declare -n shape=$arr
  plan=$("$KILN" info "${shape[@]}" --zero=3 --world=3 "$flag" | grep -o 'per rank: [0-9]* bytes' | head -1 | grep -o '[0-9]*')
  m=$(tail -1 "$T/$dir/metrics.jsonl" | grep -o '"peak_mem_bytes":[0-9]*' | cut -d: -f2)
  if [ -n "$plan" ] && [ -n "$m" ] && [ $((m * 100)) -le $((plan * 101)) ] && [ $((m * 100)) -ge $((plan * 99)) ]; then
    ok
  else
    bad "$flag: measured peak ${m:-?} bytes, planned ${plan:-?}"
  fi
  unset -n shape
done

# ---- one rank: each bucket's shard is the whole bucket, and the model reads it in place ----
# At world size 1 ZeRO-3 is ZeRO-2 with ZeRO-3's buckets (a layer each, --bucket-mb=0.001): bitwise the same
# weights, and the same peak memory, since no bucket is gathered into a copy of its own. A slow offloaded host
# makes the forward's waits matter: a read of the shard before its chunk is up would change the bits.
peak() { tail -1 "$1/metrics.jsonl" | grep -o '"peak_mem_bytes":[0-9]*' | cut -d: -f2; }
"$KILN" train "${args[@]}" --max-steps=4 --zero=2 --bucket-mb=0.001 --out="$T/one2" 2>"$T/err" ||
  bad "ZeRO-2 in one process: $(tail -3 "$T/err")"
"$KILN" train "${args[@]}" --max-steps=4 --zero=3 --out="$T/one3" 2>"$T/err" ||
  bad "ZeRO-3 in one process: $(tail -3 "$T/err")"
same_weights "$T/one2" "$T/one3" && ok || bad "ZeRO-3 in one process: not the weights of ZeRO-2 with its buckets"
[ -n "$(peak "$T/one3")" ] && [ "$(peak "$T/one3")" = "$(peak "$T/one2")" ] && ok ||
  bad "ZeRO-3 in one process peaked at $(peak "$T/one3") bytes, ZeRO-2 with its buckets at $(peak "$T/one2")"
slow "$KILN" train "${args[@]}" --max-steps=4 --zero=3 --offload=optimizer --prefetch=2 --recompute=block \
  --out="$T/one3s" 2>"$T/err" || bad "ZeRO-3 in one process, slow host: $(tail -3 "$T/err")"
same_weights "$T/one2" "$T/one3s" && ok || bad "ZeRO-3 in one process with a slow host changed the weights"
# nothing is gathered, so at 8 layers keeping the gathered layers saves no collective (at 3 ranks it does)
"$KILN" train "${deep[@]}" --zero=3 --out="$T/one_rs1" 2>"$T/err" || bad "8 layers, ZeRO-3: $(tail -3 "$T/err")"
"$KILN" train "${deep[@]}" --zero=3 --zero3-reshard-after-forward=0 --out="$T/one_rs0" 2>"$T/err" ||
  bad "8 layers, ZeRO-3, zero3-reshard-after-forward 0: $(tail -3 "$T/err")"
a=$(ops "$T/one_rs1") b=$(ops "$T/one_rs0")
[ -n "$a" ] && [ "$a" = "$b" ] && ok || bad "ZeRO-3 in one process gathers: collectives $a resharded, $b kept"
# KILN_ZERO3_GATHER=1 (for a trace of the prefetch on one GPU) gathers anyway: more collectives, same weights
KILN_ZERO3_GATHER=1 "$KILN" train "${deep[@]}" --zero=3 --out="$T/one_g" 2>"$T/err" ||
  bad "8 layers, ZeRO-3, KILN_ZERO3_GATHER=1: $(tail -3 "$T/err")"
c=$(ops "$T/one_g")
[ -n "$c" ] && [ -n "$a" ] && [ "${c##* }" -gt "${a##* }" ] && same_weights "$T/one_rs1" "$T/one_g" && ok ||
  bad "KILN_ZERO3_GATHER=1 in one process: collectives ${c:-?} against ${a:-?} in place, or other weights"
# and kiln info plans what it holds (the CPU counts its allocations exactly)
plan=$("$KILN" info "${args[@]}" --zero=3 --world=1 | grep -o 'per rank: [0-9]* bytes' | head -1 | grep -o '[0-9]*')
[ -n "$plan" ] && [ "$plan" = "$(peak "$T/one3")" ] && ok ||
  bad "ZeRO-3 in one process: measured peak $(peak "$T/one3") bytes, planned ${plan:-?}"

# ---- memory: the measured peak against kiln info's per-rank plan, and 1/N ----
planned() { "$KILN" info "${mem[@]}" --total-batch=$((16 * $1)) --zero=3 --world="$1" | grep -o 'per rank: [0-9]* bytes' | head -1 | grep -o '[0-9]*'; }
state() { "$KILN" info "${mem[@]}" --total-batch=$((16 * $1)) --zero=3 --world="$1" | grep -o 'sharded state: [0-9]* bytes' | head -1 | grep -o '[0-9]*'; }
mem=(--layers=12 --heads=2 --dim=96 --seq=16 --batch=1 --max-steps=2 --eval-every=0 --threads=1 --quiet)
for np in 2 4; do
  "${MPI[@]}" -np $np "$KILN" train "${mem[@]}" --total-batch=$((16 * np)) --zero=3 --out="$T/mem$np" 2>"$T/err" ||
    bad "memory run at $np ranks: $(tail -2 "$T/err")"
  p=$(planned $np)
  m=$(peak "$T/mem$np")
  if [ -n "$p" ] && [ -n "$m" ] && [ $((m * 10)) -le $((p * 11)) ] && [ $((m * 10)) -ge $((p * 9)) ]; then ok; else
    bad "ZeRO-3 at $np ranks: measured peak ${m:-?} bytes is not within 10% of the plan ${p:-?}"
  fi
done
# what falls as 1/N: the sharded state (master weights, gradients, moments); the gathered layers and the
# activations stay. The measured drop from 2 to 4 ranks is half the state at 2 ranks, within 10%.
s2=$(state 2)
d=$(($(peak "$T/mem2") - $(peak "$T/mem4")))
if [ -n "$s2" ] && [ $((d * 20)) -ge $((s2 * 9)) ] && [ $((d * 20)) -le $((s2 * 11)) ]; then ok; else
  bad "from 2 to 4 ranks the peak fell by $d bytes; half the sharded state at 2 ranks is $((s2 / 2))"
fi
echo "ZeRO-3 peak bytes at 12 layers: 2 ranks $(peak "$T/mem2") (plan $(planned 2)), 4 ranks $(peak "$T/mem4") (plan $(planned 4))"

# ---- bad combinations ----
small=(--layers=1 --heads=2 --dim=32 --seq=32 --batch=2 --max-steps=2 --threads=1 --quiet)
expect_error 2 "prefetch" -- train "${small[@]}" --zero=3 --prefetch=3
expect_error 2 "offload" -- train "${small[@]}" --offload=disk
expect_error 2 "stochastic" -- train "${small[@]}" --offload=optimizer --stochastic-rounding=1
expect_error 2 "add --zero=3" -- train "${small[@]}" --zero=2 --zero3-reshard-after-forward=0
expect_error 2 "add --zero=3" -- train "${small[@]}" --zero3-accumulate=whole
expect_error 2 "zero3-accumulate" -- train "${small[@]}" --zero=3 --zero3-accumulate=half
expect_error 2 "zero3-reshard-after-forward" -- train "${small[@]}" --zero=3 --zero3-reshard-after-forward=2
finish
