#!/usr/bin/env bash
# On a machine with a GPU (skipped elsewhere, exit 77): two MPI ranks sharing the one GPU (operands staged
# through host memory) train as one rank does at the same global batch, with DDP, ZeRO-1, ZeRO-2, ZeRO-3 and the
# offloaded optimizer (deterministic kernels; bf16, so within a tolerance), and with sequence parallelism
# (Ulysses and ring); the NCCL path at world size 1 trains too, ZeRO-3 and offload included; the offloaded
# step waited for chunk by chunk by the next forward; ZeRO-3's FP8 all-gather equals its bf16 gather.
source "$(dirname "$0")/lib.sh" dist_gpu_mpi "$@"
# (a kiln that cannot start, e.g. a shared library not found, is a failure, not a machine without a GPU)
info=$("$KILN" info 2>&1) || { echo "FAIL: $KILN info: $(tail -1 <<<"$info")"; exit 1; }
# (nor is one whose CUDA module or libraries do not load: kiln info says "gpus: unknown: <why>")
if grep -q "^gpus: unknown" <<<"$info"; then echo "FAIL: $KILN info: $(grep '^gpus:' <<<"$info")"; exit 1; fi
if ! grep -q "gpu 0:" <<<"$info"; then
  echo "no GPU: skipped"
  exit 77
fi
if ! command -v mpirun >/dev/null; then
  echo "no mpirun: skipped"
  exit 77
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
a=(--layers=2 --heads=4 --dim=128 --seq=64 --batch=4 --total-batch=1024 --max-steps=10 --eval-every=0 --quiet
  --log-every=1 --device=cuda --deterministic=1 --bucket-mb=0.05 --schedule=constant --warmup=0 --lr=1e-3)
"$KILN" train "${a[@]}" --out="$T/one" || bad "one rank failed"
close() { # the losses of two runs within 2e-3 relative at every step
  python3 - "$1" "$2" <<'PY'
import json, sys
l = [[json.loads(x)["loss"] for x in open(d + "/metrics.jsonl")] for d in sys.argv[1:]]
d = max(abs(a - b) / a for a, b in zip(*l)) if len(l[0]) == len(l[1]) == 10 else float("inf")
print(f"{sys.argv[2]}: worst loss rel diff {d:.2e}")
sys.exit(0 if d < 2e-3 else 1)
PY
}
# (ZeRO-2/3's staging buffers filled with NaN before each use: the GPU's backward must assign every gradient
# element that is not padding, which alone is zeroed)
for z in 0 1 2 3; do
  KILN_POISON_STAGING=1 mpirun --oversubscribe --bind-to none -np 2 -x KILN_POISON_STAGING "$KILN" train "${a[@]}" \
    --comm=mpi --zero=$z --out="$T/two$z" 2>"$T/err" ||
    bad "2 ranks sharing the GPU, zero $z: $(tail -3 "$T/err")"
  close "$T/one" "$T/two$z" && ok || bad "2 ranks sharing the GPU, zero $z, left the one-rank trajectory"
done
for z in 0 3; do # the optimizer on the host: gradients down, AdamW there, bf16 weights up
  mpirun --oversubscribe --bind-to none -np 2 "$KILN" train "${a[@]}" --comm=mpi --zero=$z --offload=optimizer \
    --out="$T/two${z}o" 2>"$T/err" || bad "2 ranks sharing the GPU, zero $z, offload: $(tail -3 "$T/err")"
  close "$T/one" "$T/two${z}o" && ok || bad "2 ranks sharing the GPU, zero $z with offload, left the trajectory"
done
# ZeRO-3's FP8 all-gather on the GPU (FP8 tensor cores: sm_89 and up): the layers' codes cast by each rank
# from its slices with the whole weight's scale, gathered, transposed for dinp by fp8_transpose: the run
# equals the run that gathers bf16 and casts, to the bit (deterministic kernels)
f8=(--layers=4 --precision=fp8 --zero=3 --comm=mpi)
if "$KILN" train "${a[@]}" --layers=4 --precision=fp8 --max-steps=1 --out="$T/f8probe" >/dev/null 2>"$T/err"; then
  for g in 0 1; do
    mpirun --oversubscribe --bind-to none -np 2 "$KILN" train "${a[@]}" "${f8[@]}" --fp8-all-gather=$g \
      --out="$T/f8g$g" 2>"$T/err" || bad "2 ranks sharing the GPU, ZeRO-3 fp8, all-gather $g: $(tail -3 "$T/err")"
  done
  [ -s "$T/f8g1/metrics.jsonl" ] && [ "$(cut -d, -f1-2 "$T/f8g0/metrics.jsonl")" = "$(cut -d, -f1-2 "$T/f8g1/metrics.jsonl")" ] &&
    ok || bad "ZeRO-3's FP8 all-gather changed the losses on the GPU"
else
  echo "fp8 not available here: $(tail -1 "$T/err")"
fi
# activation offload: the layer inputs (and, selective, the attention outputs) go to pinned host memory on
# the copy stream and come back; the same kernels on the same numbers, so the losses are those without it, bit
# for bit. 6 layers: the device keeps 3 of each, so 4 inputs and 3 outputs make the round trip
for rc in block selective; do
  "$KILN" train "${a[@]}" --layers=6 --recompute=$rc --out="$T/$rc" 2>"$T/err" || bad "recompute $rc: $(tail -3 "$T/err")"
  "$KILN" train "${a[@]}" --layers=6 --recompute=$rc --offload=activations --out="$T/${rc}o" 2>"$T/err" ||
    bad "offloaded activations ($rc): $(tail -3 "$T/err")"
  [ "$(cut -d, -f1-2 "$T/$rc/metrics.jsonl")" = "$(cut -d, -f1-2 "$T/${rc}o/metrics.jsonl")" ] && ok ||
    bad "offloaded activations changed the losses on the GPU ($rc)"
done
# sequence parallelism with 2 ranks on the GPU: Ulysses' all-to-alls and the ring's send_recv staged through
# the host, the CUDA attention-block op (GQA and RoPE in the ring, HS 64), against one rank; the ring again on
# the tensor-core block kernels (KILN_ATTN_BLOCK=tc) and on the Hopper ones (wgmma, the default; on a GPU
# before Hopper the tensor-core ones again)
for sp in "ref --sp-mode=ulysses" "ref --sp-mode=ring --pos=rope --heads=2 --kv-heads=1" \
  "tc --sp-mode=ring --pos=rope --heads=2 --kv-heads=1" "wgmma --sp-mode=ring --pos=rope --heads=2 --kv-heads=1"; do
  blk=${sp%% *} sp=${sp#* }
  # shellcheck disable=SC2086
  "$KILN" train "${a[@]}" $sp --sp=1 --out="$T/sp_one" 2>"$T/err" || bad "one rank ($sp): $(tail -3 "$T/err")"
  # shellcheck disable=SC2086
  KILN_ATTN_BLOCK=$blk mpirun --oversubscribe --bind-to none -np 2 -x KILN_ATTN_BLOCK "$KILN" train "${a[@]}" $sp \
    --sp=2 --comm=mpi --out="$T/sp_two" 2>"$T/err" || bad "2 ranks sharing the GPU, sp 2 ($sp, $blk): $(tail -3 "$T/err")"
  close "$T/sp_one" "$T/sp_two" && ok || bad "2 ranks sharing the GPU, sp 2 ($sp, $blk), left the one-rank trajectory"
  rm -rf "$T/sp_one" "$T/sp_two"
done
"$KILN" train "${a[@]}" --comm=nccl --out="$T/nccl1" 2>"$T/err" || bad "NCCL at world size 1: $(tail -3 "$T/err")"
close "$T/one" "$T/nccl1" && ok || bad "NCCL at world size 1 left the no-comm trajectory"
# NCCL's CTA policy and cap (KILN_NCCL_CTA_POLICY, KILN_NCCL_MAX_CTAS): the same numbers, and a bad value is
# one line before any rendezvous
KILN_NCCL_CTA_POLICY=efficiency KILN_NCCL_MAX_CTAS=4 "$KILN" train "${a[@]}" --comm=nccl --out="$T/nccl1e" 2>"$T/err" ||
  bad "NCCL with the efficiency CTA policy: $(tail -3 "$T/err")"
close "$T/one" "$T/nccl1e" && ok || bad "NCCL's efficiency CTA policy left the no-comm trajectory"
KILN_NCCL_CTA_POLICY=fast expect_error 2 "KILN_NCCL_CTA_POLICY=fast (environment): one of default, efficiency, zero" -- \
  train "${a[@]}" --comm=nccl --out="$T/nccl1bad"
# the comm stream at the greatest priority (KILN_NCCL_STREAM_PRIORITY=high): the same numbers; a bad value
KILN_NCCL_STREAM_PRIORITY=high "$KILN" train "${a[@]}" --comm=nccl --out="$T/nccl1p" 2>"$T/err" ||
  bad "NCCL with the comm stream at high priority: $(tail -3 "$T/err")"
close "$T/one" "$T/nccl1p" && ok || bad "NCCL's high-priority stream left the no-comm trajectory"
KILN_NCCL_STREAM_PRIORITY=urgent expect_error 2 "KILN_NCCL_STREAM_PRIORITY=urgent (environment): default or high" -- \
  train "${a[@]}" --comm=nccl --out="$T/nccl1badp"
# ZeRO-2's staging buffers over NCCL (reduce-scatter onto the shard, summed over micro-steps on the GPU)
"$KILN" train "${a[@]}" --comm=nccl --zero=2 --out="$T/nccl1z2" 2>"$T/err" || bad "NCCL ZeRO-2: $(tail -3 "$T/err")"
close "$T/one" "$T/nccl1z2" && ok || bad "NCCL ZeRO-2 at world size 1 left the no-comm trajectory"
# ZeRO-3's gathers on NCCL's stream (prefetch 2, block recompute), and the offloaded optimizer at world size 1
"$KILN" train "${a[@]}" --comm=nccl --zero=3 --prefetch=2 --recompute=block --out="$T/nccl1z3" 2>"$T/err" ||
  bad "NCCL ZeRO-3: $(tail -3 "$T/err")"
close "$T/one" "$T/nccl1z3" && ok || bad "NCCL ZeRO-3 at world size 1 left the no-comm trajectory"
"$KILN" train "${a[@]}" --offload=optimizer --out="$T/off1" 2>"$T/err" || bad "offload: $(tail -3 "$T/err")"
close "$T/one" "$T/off1" && ok || bad "the offloaded optimizer left the trajectory on the GPU"
# the offloaded step beside the next forward, on the copy thread's own stream: a slow host (2 ms before each of
# many chunks) makes the forward wait for every chunk it reads; a missed wait reads stale weights, and the
# losses would differ from those of the same run without the delay, bit for bit
KILN_OFFLOAD_CHUNK=4096 KILN_OFFLOAD_DELAY_US=2000 "$KILN" train "${a[@]}" --offload=optimizer --out="$T/off1s" \
  2>"$T/err" || bad "offload, slow host: $(tail -3 "$T/err")"
[ "$(cut -d, -f1-2 "$T/off1/metrics.jsonl")" = "$(cut -d, -f1-2 "$T/off1s/metrics.jsonl")" ] && ok ||
  bad "a slow host changed the offloaded optimizer's losses on the GPU"
# bf16 gradients on the wire (one micro-step a rank), ZeRO-2, against one rank with its bf16 gradients
b1=("${a[@]}" --total-batch=512)
"$KILN" train "${b1[@]}" --batch=8 --out="$T/oneb" || bad "one rank, one micro-step failed"
mpirun --oversubscribe --bind-to none -np 2 "$KILN" train "${b1[@]}" --batch=4 --comm=mpi --zero=2 --reduce-dtype=bf16 \
  --total-batch=512 --out="$T/twob" 2>"$T/err" || bad "2 ranks, bf16 reduction: $(tail -3 "$T/err")"
close "$T/oneb" "$T/twob" && ok || bad "2 ranks with bf16 gradients (ZeRO-2) left the one-rank trajectory"
# one NCCL rank more than this node has GPUs: refused at start, naming the variable, never a hang (a global
# batch that the n + 1 ranks divide, so that the batch check does not answer first on a node of several GPUs)
n=$("$KILN" info 2>/dev/null | grep -c "  gpu [0-9]*:")
RANK=0 WORLD_SIZE=$((n + 1)) LOCAL_RANK=0 LOCAL_WORLD_SIZE=$((n + 1)) MASTER_ADDR=127.0.0.1 MASTER_PORT=29577 \
  timeout 30 "$KILN" train "${a[@]}" --total-batch=$((4 * 64 * (n + 1))) --comm=nccl --out="$T/two_on_one" 2>"$T/err"
rc=$?
[ $rc -eq 2 ] && grep -q "LOCAL_WORLD_SIZE=$((n + 1)) (environment)" "$T/err" && ok ||
  bad "more NCCL ranks than GPUs: exit $rc: $(cat "$T/err")"
finish
