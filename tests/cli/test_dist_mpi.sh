#!/usr/bin/env bash
# Data parallelism on the CPU under mpirun (label mpi): DDP at 2, 3 and 4 ranks follows the single-process
# trajectory with the same global batch (fp32, reduction order only), is bitwise repeatable, ZeRO-1 gives
# exactly DDP's weights, and ZeRO-2 too with one micro-step (with accumulation, within reduction order), each
# holding less memory; checkpoints reshard (4 -> 2, 2 -> 3, across --zero) and resume where the data
# stopped, bit-exact at the same world size; a SIGKILLed rank brings the job down; kiln launch restarts a
# crashed group to the uninterrupted run's weights; bad environments fail with one line.
source "$(dirname "$0")/lib.sh" dist_mpi "$@"
need_mpirun
test_seed
# 2 layers, 3 buckets of gradients, clipping active; 768 tokens a step = 12 micro-batches of 2 x 32 (accum 12,
# 6, 4, 3 on 1, 2, 3, 4 ranks); a constant LR, so that a run's schedule does not depend on --max-steps
args=(--layers=2 --heads=2 --dim=32 --seq=32 --batch=2 --total-batch=768 --eval-every=4 --eval-steps=4
  --threads=1 --quiet --log-every=1 --bucket-mb=0.02 --grad-clip=0.5 --schedule=constant --warmup=0 --lr=3e-3
  --seed=$seed)

"$KILN" train "${args[@]}" --max-steps=8 --out="$T/single" || bad "single-process run failed"
for np in 2 3 4; do
  "${MPI[@]}" -np $np "$KILN" train "${args[@]}" --max-steps=8 --zero=0 --out="$T/ddp$np" 2>"$T/err" || bad "DDP at $np ranks failed: $(tail -3 "$T/err")"
  same_run "$T/single" "$T/ddp$np" 2e-5 && ok || bad "DDP at $np ranks left the single-process trajectory"
done
grep -q '"comm_wait_ms":' "$T/ddp2/metrics.jsonl" && ok || bad "metrics.jsonl has no comm_wait_ms"
[ "$(grep -c '"step":8,' "$T/ddp2/metrics.jsonl")" -eq 1 ] && ok || bad "metrics.jsonl written more than once per step (only rank 0 writes)"
grep -q '"val_loss":' "$T/ddp3/metrics.jsonl" && ok || bad "no sharded evaluation in metrics.jsonl"

"${MPI[@]}" -np 2 "$KILN" train "${args[@]}" --max-steps=8 --zero=0 --out="$T/ddp2b" 2>/dev/null || bad "repeat failed"
cmp -s "$T/ddp2/model.safetensors" "$T/ddp2b/model.safetensors" && ok || bad "DDP at 2 ranks is not bitwise repeatable"
for z in 1 2; do
  "${MPI[@]}" -np 4 "$KILN" train "${args[@]}" --max-steps=8 --zero=$z --out="$T/zero$z" 2>"$T/err" || bad "zero $z failed: $(tail -3 "$T/err")"
done
cmp -s "$T/ddp4/model.safetensors" "$T/zero1/model.safetensors" && ok || bad "ZeRO-1's weights differ from DDP's at 4 ranks"
# the default, --zero=auto, is ZeRO-1 with several ranks (the run's config says so), none in one process
"${MPI[@]}" -np 4 "$KILN" train "${args[@]}" --max-steps=8 --out="$T/auto4" 2>"$T/err" || bad "--zero=auto at 4 ranks failed: $(tail -3 "$T/err")"
grep -q '^zero = 1$' "$T/auto4/config" && cmp -s "$T/zero1/model.safetensors" "$T/auto4/model.safetensors" &&
  ok || bad "--zero=auto at 4 ranks is not ZeRO-1: $(grep -i zero "$T/err" "$T/auto4/config")"
grep -q '^zero = 0$' "$T/single/config" && ok || bad "--zero=auto in one process: $(grep '^zero' "$T/single/config")"
# at 3 ranks the buckets do not split evenly: each rank's slice of the reduce-scatter differs in length. The
# comm thread is slow (3 ms before each operation): the updated weights' gathers land while the next forward
# runs, and each layer must wait for its bucket's
"${MPI[@]}" -np 3 -x KILN_COMM_DELAY_US=3000 "$KILN" train "${args[@]}" --max-steps=8 --zero=1 --out="$T/zero1r3" 2>"$T/err" ||
  bad "zero 1 at 3 ranks failed: $(tail -3 "$T/err")"
cmp -s "$T/ddp3/model.safetensors" "$T/zero1r3/model.safetensors" && ok || bad "ZeRO-1's weights differ from DDP's at 3 ranks"
# and with the whole gather waited for right after AdamW (the old order, a measurement's baseline)
"${MPI[@]}" -np 3 -x KILN_ZERO_GATHER=wait "$KILN" train "${args[@]}" --max-steps=8 --zero=1 --out="$T/zero1w" 2>"$T/err" ||
  bad "zero 1, KILN_ZERO_GATHER=wait: $(tail -3 "$T/err")"
cmp -s "$T/ddp3/model.safetensors" "$T/zero1w/model.safetensors" && ok || bad "ZeRO-1's weights differ from DDP's (gathers waited for)"
cmp -s <(grep -o '"loss":[^,]*' "$T/ddp4/metrics.jsonl") <(grep -o '"loss":[^,]*' "$T/zero1/metrics.jsonl") && ok ||
  bad "ZeRO-1's losses differ from DDP's"
# ZeRO-2 reduces every micro-step (its staging buffers are reused), so with accumulation its sums are grouped by
# micro-step: the same trajectory within reduction order; with one micro-step, bitwise DDP's weights
same_run "$T/single" "$T/zero2" 2e-5 && ok || bad "ZeRO-2 with accumulation left the trajectory"
one=("${args[@]}" --total-batch=256)
for z in 0 2; do # (ZeRO-2 with a slow comm thread, as ZeRO-1 above)
  "${MPI[@]}" -np 4 -x KILN_COMM_DELAY_US=$((z * 1500)) "$KILN" train "${one[@]}" --max-steps=6 --zero=$z --out="$T/one$z" \
    2>"$T/err" || bad "zero $z, one micro-step: $(tail -3 "$T/err")"
done
cmp -s "$T/one0/model.safetensors" "$T/one2/model.safetensors" && ok || bad "ZeRO-2's weights differ from DDP's with one micro-step"
# and each level holds less (peak_mem_bytes counts every allocation): ZeRO-1 a quarter of the moments, ZeRO-2
# also no whole gradient buffer (four layers' staging and a quarter of the gradients), at 12 layers and a
# bucket a layer
peak() { tail -1 "$1/metrics.jsonl" | grep -o '"peak_mem_bytes":[0-9]*' | cut -d: -f2; }
mem=(--layers=12 --heads=2 --dim=64 --seq=32 --batch=2 --total-batch=256 --max-steps=2 --eval-every=0 --threads=1
  --quiet --bucket-mb=0.01)
for z in 0 1 2; do
  "${MPI[@]}" -np 4 "$KILN" train "${mem[@]}" --zero=$z --out="$T/mem$z" 2>/dev/null || bad "memory run zero $z failed"
done
[ "$(peak "$T/mem2")" -lt "$(peak "$T/mem1")" ] && [ "$(peak "$T/mem1")" -lt "$(peak "$T/mem0")" ] && ok ||
  bad "peak memory should fall from DDP ($(peak "$T/mem0")) to ZeRO-1 ($(peak "$T/mem1")) to ZeRO-2 ($(peak "$T/mem2"))"
echo "peak bytes at 12 layers, 4 ranks: DDP $(peak "$T/mem0"), ZeRO-1 $(peak "$T/mem1"), ZeRO-2 $(peak "$T/mem2")"
ls "$T/zero2/ckpt/step_00000008/" | grep -q "optim-00003-of-00004.safetensors" && ok || bad "no optimizer shard per rank"
# sample and logits read a sharded checkpoint when the run has no model.safetensors (stopped, or still going)
cp -r "$T/zero2" "$T/nomodel"
rm "$T/nomodel/model.safetensors"
"$KILN" logits --run="$T/zero2" --tokens=1,2,3 --device=cpu >"$T/lg_final" 2>/dev/null || bad "logits of the run failed"
"$KILN" logits --run="$T/nomodel" --tokens=1,2,3 --device=cpu >"$T/lg_ckpt" 2>"$T/err" || bad "logits from the checkpoint failed: $(cat "$T/err")"
grep -q "using the newest checkpoint" "$T/err" && cmp -s "$T/lg_final" "$T/lg_ckpt" && ok ||
  bad "logits from the sharded checkpoint differ from the run's weights"
"$KILN" sample --run="$T/nomodel" --max-tokens=5 --device=cpu >/dev/null 2>&1 && ok || bad "sample from a sharded checkpoint failed"

# resharding: 8 steps at 4 ranks (ZeRO-2), then 4 more at 2 ranks (ZeRO-1) and at 3 ranks (DDP), against 12
# straight steps of one process
"$KILN" train "${args[@]}" --max-steps=12 --out="$T/single12" || bad "single 12 failed"
cp -r "$T/zero2" "$T/re42"
"${MPI[@]}" -np 2 "$KILN" train "${args[@]}" --max-steps=12 --zero=1 --out="$T/re42" 2>"$T/err" || bad "resume 4 -> 2 failed: $(tail -3 "$T/err")"
grep -q "resuming from .*step_00000008" "$T/err" && ok || bad "resume 4 -> 2 did not resume: $(cat "$T/err")"
same_run "$T/single12" "$T/re42" 2e-5 && ok || bad "4 -> 2 ranks (ZeRO-2 -> ZeRO-1) left the trajectory"
cp -r "$T/ddp2" "$T/re23"
"${MPI[@]}" -np 3 "$KILN" train "${args[@]}" --max-steps=12 --zero=0 --out="$T/re23" 2>"$T/err" || bad "resume 2 -> 3 failed: $(tail -3 "$T/err")"
same_run "$T/single12" "$T/re23" 2e-5 && ok || bad "2 -> 3 ranks left the trajectory"
cp -r "$T/zero1" "$T/re41"
"$KILN" train "${args[@]}" --max-steps=12 --out="$T/re41" 2>"$T/err" || bad "resume 4 -> 1 failed: $(tail -3 "$T/err")"
same_run "$T/single12" "$T/re41" 2e-5 && ok || bad "4 ranks -> 1 process left the trajectory"

# slow checkpoint writers (rank r's files wait (r + 1) x 150 ms, steps take a few ms): each checkpoint is
# installed steps after it began, at a step boundary every rank agrees on, or when the next one begins; the
# run's weights are the same bits as without checkpoints, and with the last one removed the run resumes from
# the one before (which must verify) to the same weights
"${MPI[@]}" -np 3 -x KILN_CKPT_DELAY_MS=150 "$KILN" train "${args[@]}" --max-steps=8 --ckpt-every=2 --keep-last=2 \
  --out="$T/slow" 2>"$T/err" || bad "slow writers: the run failed: $(tail -3 "$T/err")"
cmp -s "$T/ddp3/model.safetensors" "$T/slow/model.safetensors" && ok || bad "slow writers changed the weights"
# (the pruning of each install runs on the next write's thread, and the last one's at the end)
[ "$(ls "$T/slow/ckpt" | grep '^step_' | tr '\n' ' ')" = "step_00000006 step_00000008 " ] && ok ||
  bad "slow writers, --keep-last=2: $(ls "$T/slow/ckpt")"
ls "$T/slow/ckpt" | grep -q '^step_00000008$' && [ -f "$T/slow/ckpt/step_00000008/state.json" ] && ok ||
  bad "slow writers: no step-8 checkpoint: $(ls "$T/slow/ckpt")"
python3 -c "
import json, sys
w = [r['prev_ckpt_write_ms'] for r in map(json.loads, open('$T/slow/metrics.jsonl')) if 'prev_ckpt_write_ms' in r]
sys.exit(0 if w and max(w) >= 450 else 1)" && ok || bad "slow writers: no write took the 3 ranks' 450 ms"
rm -rf "$T/slow/ckpt/step_00000008" "$T/slow/model.safetensors"
echo step_00000006 >"$T/slow/ckpt/latest"
"${MPI[@]}" -np 3 "$KILN" train "${args[@]}" --max-steps=8 --ckpt-every=2 --keep-last=2 --out="$T/slow" 2>"$T/err" ||
  bad "slow writers: the resume failed: $(tail -3 "$T/err")"
grep -q "resuming from .*step_00000006" "$T/err" && ok || bad "slow writers: did not resume from step 6 (it must verify): $(cat "$T/err")"
cmp -s "$T/ddp3/model.safetensors" "$T/slow/model.safetensors" && ok || bad "slow writers: the resume left the weights"

# a stop (SIGUSR1, which mpirun forwards) while slow writers still write a checkpoint: that one is installed
# first, then the stop's, and the run exits 75; resumed, it ends with the straight run's weights
"${MPI[@]}" -np 2 "$KILN" train "${args[@]}" --max-steps=30 --out="$T/st0" 2>/dev/null || bad "straight 30 steps failed"
"${MPI[@]}" -np 2 -x KILN_CKPT_DELAY_MS=200 "$KILN" train "${args[@]}" --max-steps=30 --ckpt-every=3 \
  --out="$T/stop" 2>"$T/err" &
job=$!
for _ in $(seq 400); do grep -q '"step":7,' "$T/stop/metrics.jsonl" 2>/dev/null && break; sleep 0.02; done
kill -USR1 $job
wait $job
rc=$?
step=$(sed -n 's/.*after step \([0-9]*\).*/\1/p' "$T/err" | head -1)
[ $rc -eq 75 ] && [ -n "$step" ] && [ -f "$T/stop/ckpt/$(printf 'step_%08d' "$step")/state.json" ] && ok ||
  bad "a stop during a slow checkpoint: exit $rc, step '$step': $(ls "$T/stop/ckpt" 2>&1) $(tail -3 "$T/err")"
"${MPI[@]}" -np 2 "$KILN" train "${args[@]}" --max-steps=30 --ckpt-every=3 --out="$T/stop" 2>"$T/err" ||
  bad "resume after the stop failed: $(tail -3 "$T/err")"
cmp -s "$T/st0/model.safetensors" "$T/stop/model.safetensors" && ok || bad "the stopped and resumed run left the weights"

# the same world size: bit-exact (a checkpoint at step 4, killed by --inject-crash, resumed)
"${MPI[@]}" -np 2 "$KILN" train "${args[@]}" --max-steps=12 --zero=2 --out="$T/s2" 2>/dev/null || bad "straight 2-rank run failed"
"${MPI[@]}" -np 2 "$KILN" train "${args[@]}" --max-steps=12 --zero=2 --ckpt-every=4 --inject-crash=7 --out="$T/c2" >/dev/null 2>&1
[ -d "$T/c2/ckpt/step_00000004" ] && ok || bad "no checkpoint before the crash"
"${MPI[@]}" -np 2 "$KILN" train "${args[@]}" --max-steps=12 --zero=2 --ckpt-every=4 --out="$T/c2" 2>/dev/null || bad "resume at 2 ranks failed"
cmp -s "$T/s2/model.safetensors" "$T/c2/model.safetensors" && ok || bad "resume at the same world size is not bit-exact"

# resuming ranks share the hashing: each verifies the files of its index modulo the ranks (state.json's
# order); a corrupt file is named by the rank that hashed it, and every rank falls back to the checkpoint
# before it together
ck=$(ls -d "$T/c2/ckpt/step_"* | sort | tail -1)
prev=$(ls -d "$T/c2/ckpt/step_"* | sort | tail -2 | head -1)
mapfile -t listed < <(python3 -c "import json, sys; print('\n'.join(json.load(open(sys.argv[1]))['files']))" "$ck/state.json")
[ "${#listed[@]}" -ge 2 ] && [ "$ck" != "$prev" ] && ok || bad "expected 2 checkpoints of 2+ files in $T/c2"
for idx in 0 1; do
  rm -rf "$T/cv"
  cp -r "$T/c2" "$T/cv"
  f="$T/cv/ckpt/$(basename "$ck")/${listed[$idx]}"
  flip_byte "$f" -1
  "${MPI[@]}" -np 2 "$KILN" train "${args[@]}" --max-steps=14 --zero=2 --ckpt-every=4 --out="$T/cv" 2>"$T/err" ||
    bad "resume past a corrupt ${listed[$idx]} failed: $(tail -3 "$T/err")"
  grep -q "checkpoint .*$(basename "$ck") is unusable (corrupt checkpoint ($f): sha256 .*, found by rank $idx)" "$T/err" &&
    grep -q "resuming from .*$(basename "$prev")" "$T/err" && ok ||
    bad "a corrupt file at index $idx was not found by rank $idx, or the ranks did not fall back: $(cat "$T/err")"
done

# a rank SIGKILLed mid-run: mpirun ends the job, non-zero, within seconds
"${MPI[@]}" -np 2 "$KILN" train "${args[@]}" --max-steps=1000000 --out="$T/kill" >/dev/null 2>&1 &
job=$!
for _ in $(seq 300); do [ -s "$T/kill/metrics.jsonl" ] && break; sleep 0.05; done
victim=$(pgrep -f "out=$T/kill" | while read -r p; do [ "$(cat /proc/$p/comm 2>/dev/null)" = kiln ] && echo $p; done | tail -1)
[ -n "$victim" ] && kill -9 "$victim"
t0=$(date +%s)
wait $job
rc=$?
[ $rc -ne 0 ] && [ $(($(date +%s) - t0)) -le 20 ] && ok || bad "after a rank's SIGKILL the job exited $rc after $(($(date +%s) - t0)) s"
# (mpirun may take a moment to reap the other rank on a loaded machine: up to 5 s)
for _ in $(seq 50); do [ -z "$(pgrep -f "out=$T/kill")" ] && break; sleep 0.1; done
[ -z "$(pgrep -f "out=$T/kill")" ] && ok || bad "ranks left running 5 s after a rank's SIGKILL: $(pgrep -af "out=$T/kill")"

# kiln launch: a crashed 2-rank group restarts from its checkpoint to the uninterrupted run's weights
"$KILN" launch --nproc-per-node=2 --max-restarts=2 --backoff=0 -- "${args[@]}" --max-steps=12 --zero=2 \
  --ckpt-every=4 --inject-crash=7 --out="$T/l2" 2>"$T/err" || bad "kiln launch failed: $(tail -5 "$T/err")"
[ "$(wc -l <"$T/l2/restarts.jsonl" 2>/dev/null)" = 1 ] && ok || bad "one restart expected: $(cat "$T/l2/restarts.jsonl" 2>/dev/null)"
cmp -s "$T/s2/model.safetensors" "$T/l2/model.safetensors" && ok || bad "kiln launch's restarted group ended elsewhere"

# bad environments and options: one line, exit 2, never a hang
small=(--layers=1 --heads=2 --dim=32 --seq=32 --batch=2 --max-steps=2 --threads=1 --quiet)
# a rank's error: one line, prefixed with the rank
rank_error() { # CODE PATTERN -- ARGS
  local code=$1 pat=$2
  shift 3
  timeout 20 "$KILN" "$@" >/dev/null 2>"$T/err"
  local rc=$?
  [ $rc -eq "$code" ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -q "^\[rank [0-9]*\] error: .*$pat" "$T/err" && ok ||
    bad "kiln $*: exit $rc, expected $code and one line with '$pat': $(cat "$T/err")"
}
RANK=2 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29555 expect_error 2 "RANK" -- train "${small[@]}"
RANK=0 WORLD_SIZE=2 expect_error 2 "MASTER_ADDR" -- train "${small[@]}"
RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29555 rank_error 2 "mpirun" -- train "${small[@]}" --comm=mpi
expect_error 2 "comm nccl" -- train "${small[@]}" --comm=nccl --device=cpu
"${MPI[@]}" -np 2 "$KILN" train "${small[@]}" --comm=single 2>"$T/err"
[ $? -ne 0 ] && grep -q "comm single (--comm)" "$T/err" && ok || bad "--comm=single at 2 ranks: $(cat "$T/err")"
"${MPI[@]}" -np 3 "$KILN" train "${small[@]}" --total-batch=256 2>"$T/err"
[ $? -ne 0 ] && grep -q "batch\*seq\*ranks" "$T/err" && ok || bad "total-batch not divisible by the ranks: $(cat "$T/err")"
expect_error 2 "zero" -- train "${small[@]}" --zero=4
expect_error 2 "comm" -- train "${small[@]}" --comm=tcp
expect_error 2 "bucket-mb" -- train "${small[@]}" --bucket-mb=0
KILN_ZERO_GATHER=later expect_error 2 "KILN_ZERO_GATHER=later (environment): overlap (the default) or wait" -- \
  train "${small[@]}" --zero=1
expect_error 2 "reduce-dtype bf16 on device cpu" -- train "${small[@]}" --reduce-dtype=bf16 --device=cpu

# a damaged optimizer shard: the checkpoint does not verify, is named with its file, and nothing is overwritten
cp -r "$T/zero2" "$T/bad"
f="$T/bad/ckpt/step_00000008/optim-00001-of-00004.safetensors"
flip_byte "$f" 200
"${MPI[@]}" -np 2 "$KILN" train "${args[@]}" --max-steps=12 --out="$T/bad" 2>"$T/err"
[ $? -ne 0 ] && grep -q "optim-00001-of-00004.safetensors" "$T/err" && grep -q "none of the 1 checkpoints" "$T/err" && ok ||
  bad "a damaged shard: $(grep -v ORTE "$T/err" | head -5)"
[ ! -e "$T/bad/ckpt/step_00000012" ] && cmp -s "$T/bad/model.safetensors" "$T/zero2/model.safetensors" && ok ||
  bad "a refused resume changed the run directory"
finish
