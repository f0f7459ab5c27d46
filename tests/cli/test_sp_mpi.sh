#!/usr/bin/env bash
# Sequence parallelism on the CPU under mpirun (label mpi): Ulysses, ring (zigzag) and hybrid at 2, 4 and 6
# ranks follow the single-process run (loss, gradient norm and validation loss at every step, final weights)
# for learned positions, RoPE and ALiBi, GQA, sequential and parallel blocks; sp x dp with DDP and ZeRO-3
# and gradient accumulation; a rank whose tokens are two runs of positions (hybrid, 3 Ulysses ranks); a
# checkpoint resumed under another layout and world size; the peak memory within 10% of kiln info's plan, and
# falling with sp; bad combinations fail with one line.
source "$(dirname "$0")/lib.sh" sp_mpi "$@"
need_mpirun
test_seed
args=(--layers=2 --heads=4 --dim=32 --seq=32 --batch=2 --eval-every=2 --eval-steps=2 --threads=1 --quiet
  --log-every=1 --grad-clip=0 --schedule=constant --warmup=0 --lr=3e-3 --seed=$seed --max-steps=4)

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

# check NAME NP SINGLE-ARGS -- SP-ARGS: the single-process run against NP ranks with SP-ARGS added
check() {
  local name=$1 np=$2
  shift 2
  local extra=()
  while [ "$1" != -- ]; do extra+=("$1"); shift; done
  shift
  if [ ! -e "$T/single_${extra[*]// /_}/metrics.jsonl" ]; then
    "$KILN" train "${args[@]}" "${extra[@]}" --out="$T/single_${extra[*]// /_}" 2>"$T/err" ||
      bad "$name: single-process run failed: $(tail -2 "$T/err")"
  fi
  echo "$name ($np ranks: $*)"
  "${MPI[@]}" -np "$np" "$KILN" train "${args[@]}" "${extra[@]}" "$@" --out="$T/$name" 2>"$T/err" ||
    { bad "$name failed: $(tail -3 "$T/err")"; return; }
  same_steps "$T/single_${extra[*]// /_}" "$T/$name" 2e-5 && same_run "$T/single_${extra[*]// /_}" "$T/$name" 2e-5 &&
    ok || bad "$name left the single-process run"
}

# two ranks: every position encoding under Ulysses and the ring
for pos in learned rope alibi; do
  check uly2_$pos 2 --pos=$pos -- --sp=2 --sp-mode=ulysses
  check ring2_$pos 2 --pos=$pos -- --sp=2 --sp-mode=ring
done
# four ranks: a ring of 4 (8 zigzag chunks), Ulysses over 4, and 2 x 2 hybrid; GQA; the parallel block
check ring4_rope 4 --pos=rope -- --sp=4 --sp-mode=ring
check uly4_alibi 4 --pos=alibi -- --sp=4 --sp-mode=ulysses
check hyb4_learned 4 --pos=learned -- --sp=4 --sp-mode=hybrid --sp-ulysses=2
check hyb4_gqa 4 --pos=rope --kv-heads=2 --mlp=swiglu --norm=rmsnorm -- --sp=4 --sp-mode=hybrid --sp-ulysses=2
# --sp-mode=auto: 2 KV heads over 4 ranks of one node take Ulysses groups of 2 and a ring of 2, the layout
# above, so the same numbers bit for bit; the banner says what it chose
"${MPI[@]}" -np 4 "$KILN" train "${args[@]}" --quiet=0 --pos=rope --kv-heads=2 --mlp=swiglu --norm=rmsnorm --sp=4 \
  --sp-mode=auto --out="$T/auto4" >"$T/auto4.log" 2>&1 || bad "--sp-mode=auto at 4 ranks: $(tail -3 "$T/auto4.log")"
l1=$(grep -o '"loss":[^,]*' "$T/hyb4_gqa/metrics.jsonl")
[ -n "$l1" ] && [ "$l1" = "$(grep -o '"loss":[^,]*' "$T/auto4/metrics.jsonl")" ] &&
  grep -q "sp 4 (2 Ulysses x 2 ring" "$T/auto4.log" && ok ||
  bad "--sp-mode=auto at 4 ranks, 2 KV heads: not hybrid 2 x 2's run: $(grep -m1 'sp 4' "$T/auto4.log")"
# --sp-mode=hybrid without --sp-ulysses on one node of 4 ranks (where "the ranks per node" is the whole SP
# group): the largest Ulysses group below sp that the heads divide, so the same 2 x 2 run
"${MPI[@]}" -np 4 "$KILN" train "${args[@]}" --quiet=0 --pos=rope --kv-heads=2 --mlp=swiglu --norm=rmsnorm --sp=4 \
  --sp-mode=hybrid --out="$T/hyb4def" >"$T/hyb4def.log" 2>&1 || bad "--sp-mode=hybrid at 4 ranks: $(tail -3 "$T/hyb4def.log")"
[ -n "$l1" ] && [ "$l1" = "$(grep -o '"loss":[^,]*' "$T/hyb4def/metrics.jsonl")" ] &&
  grep -q "sp 4 (2 Ulysses x 2 ring" "$T/hyb4def.log" && ok ||
  bad "--sp-mode=hybrid without --sp-ulysses at 4 ranks: not 2 x 2's run: $(grep -m1 'sp 4' "$T/hyb4def.log")"
# and as kiln info plans it: heads that divide sp give Ulysses alone, heads that divide none of it a ring
for hv in "8 4 Ulysses x 1 ring" "7 1 Ulysses x 4 ring"; do
  read -r h want <<<"$hv"
  "$KILN" info --preset=gpt2-124m --layers=2 --heads="$h" --dim=$((h * 8)) --seq=64 --block-size=64 --world=4 --sp=4 \
    --sp-mode=auto 2>&1 | grep -q "sp 4 ($want" && ok || bad "--sp-mode=auto with $h heads at sp 4: not '$want'"
done
# Ulysses alone hands the whole sequence of its heads to the backend's own attention op (GQA: 2 heads, 1 KV head)
check uly2_gqa 2 --pos=rope --kv-heads=2 -- --sp=2 --sp-mode=ulysses
check ring4_gqa 4 --pos=alibi --kv-heads=1 -- --sp=4 --sp-mode=ring
check uly2_parallel 2 --pos=rope --block=parallel -- --sp=2 --sp-mode=ulysses
# one sequence a rank: Ulysses keeps q, k, v in the all-to-all's receive buffer and their gradients in its
# send buffer, not in copies (alone and in the hybrid)
check uly4_b1 4 --pos=rope --batch=1 -- --sp=4 --sp-mode=ulysses
check hyb4_b1 4 --pos=alibi --batch=1 --kv-heads=2 -- --sp=4 --sp-mode=hybrid --sp-ulysses=2
check sp2dp2_b1 4 --pos=rope --batch=1 --total-batch=128 -- --sp=2 --sp-mode=ulysses --zero=3
check ring4_parallel 4 --pos=learned --block=parallel --recompute=block -- --sp=4 --sp-mode=ring
# sp x dp: DDP and ZeRO-3 across the sequence-parallel groups, with gradient accumulation (2 micro-steps)
check sp2dp2 4 --pos=rope --total-batch=256 -- --sp=2 --sp-mode=ring --zero=0
check sp2dp2_zero3 4 --pos=rope --total-batch=256 -- --sp=2 --sp-mode=ulysses --zero=3
check sp2dp2_zero1 4 --pos=learned --total-batch=256 -- --sp=2 --sp-mode=ring --zero=1
# the layer inputs offloaded to the host while the ring runs (block recompute, the MLP in chunks of 5 rows)
KILN_MLP_ROWS=5 check ring2_offload 2 --pos=rope --recompute=block -- --sp=2 --sp-mode=ring --offload=activations
# --recompute=selective: the backward uses the kept attention output and log-sum-exp, with no forward ring pass
check hyb4_selective 4 --pos=rope --recompute=selective -- --sp=4 --sp-mode=hybrid --sp-ulysses=2
# the 2M-token run's layout on 4 GPUs: Ulysses with one sequence a rank (q, k, v in the all-to-all's buffers),
# selective recompute, layer inputs and attention outputs offloaded, ZeRO-3 over the SP ranks
check uly4_b1_sel_off_z3 4 --pos=rope --batch=1 --recompute=selective -- --sp=4 --sp-mode=ulysses \
  --offload=activations --zero=3
# six ranks, hybrid 3 x 2: a slot's 24 tokens over 3 Ulysses ranks, so rank 1 holds the end of one chunk and
# the start of the other (two runs of positions: learned embeddings read both)
check hyb6_learned 6 --heads=6 --dim=48 --seq=48 --pos=learned -- --sp=6 --sp-mode=hybrid --sp-ulysses=3

# a checkpoint of a ring run at 2 ranks resumes under Ulysses at 4 (sp 2 x dp 2), and under one process: the
# weights are whole on every rank, and the loader's position is the data-parallel stream's
r=(--pos=rope --total-batch=256 --max-steps=4)
"$KILN" train "${args[@]}" "${r[@]}" --out="$T/rs_single" 2>"$T/err" || bad "single: $(tail -2 "$T/err")"
for resume in "4 --sp=2 --sp-mode=ulysses" "1 --sp=1"; do
  rm -rf "$T/rs"
  "${MPI[@]}" -np 2 "$KILN" train "${args[@]}" "${r[@]}" --max-steps=2 --sp=2 --sp-mode=ring --out="$T/rs" \
    2>"$T/err" || bad "ring run to resume: $(tail -2 "$T/err")"
  # shellcheck disable=SC2086
  "${MPI[@]}" -np ${resume%% *} "$KILN" train "${args[@]}" "${r[@]}" ${resume#* } --resume=auto --out="$T/rs" \
    2>"$T/err" || bad "resume on ${resume%% *} rank(s): $(tail -2 "$T/err")"
  same_steps "$T/rs_single" "$T/rs" 2e-5 && same_run "$T/rs_single" "$T/rs" 2e-5 && ok ||
    bad "a ring checkpoint resumed with ${resume#* } on ${resume%% *} rank(s) left the single-process run"
done

# ---- memory: the measured peak against kiln info's per-rank plan; activations fall with sp ----
peak() { tail -1 "$1/metrics.jsonl" | grep -o '"peak_mem_bytes":[0-9]*' | cut -d: -f2; }
mem=(--layers=2 --heads=4 --dim=32 --seq=1024 --batch=1 --max-steps=1 --eval-every=0 --threads=1 --quiet
  --pos=rope --block-size=1024)
for sp in "2 ring" "4 ulysses" "4 ring"; do
  n=${sp%% *}
  "${MPI[@]}" -np "$n" "$KILN" train "${mem[@]}" --sp="$n" --sp-mode="${sp#* }" --out="$T/mem$n${sp#* }" \
    2>"$T/err" || bad "memory run sp $sp: $(tail -2 "$T/err")"
  p=$("$KILN" info "${mem[@]}" --world="$n" --sp="$n" --sp-mode="${sp#* }" | grep -o 'per rank: [0-9]* bytes' |
    head -1 | grep -o '[0-9]*')
  m=$(peak "$T/mem$n${sp#* }")
  echo "sp $sp: peak $m bytes, plan $p"
  if [ -n "$p" ] && [ -n "$m" ] && [ $((m * 10)) -le $((p * 11)) ] && [ $((m * 10)) -ge $((p * 9)) ]; then ok; else
    bad "sp $sp: measured peak ${m:-?} bytes is not within 10% of kiln info's plan ${p:-?}"
  fi
done
# where q, k, v live, as kiln info says (and as the peaks above count them)
for w in "ring 1:the model's rows" "ulysses 1:the all-to-all's buffers" "ulysses 2:copies of their own"; do
  mode=${w%% *} rest=${w#* } b=${rest%%:*} want=${rest#*:}
  "$KILN" info "${mem[@]}" --batch="$b" --world=4 --sp=4 --sp-mode="$mode" | grep -q "(q, k, v: $want)" && ok ||
    bad "kiln info --sp-mode=$mode --batch=$b does not say q, k, v live in $want"
done
[ "$(peak "$T/mem4ring")" -lt "$(peak "$T/mem2ring")" ] && ok ||
  bad "a ring of 4 holds no less than a ring of 2: $(peak "$T/mem4ring") vs $(peak "$T/mem2ring") bytes"

# ---- bad combinations: one line each, before any training ----
# expect_error NP WANT ARGS...: a failed job, and an error line matching WANT (a grep -E pattern; mpirun prefixes
# a rank's lines with "[rank N] ", dropped here)
expect_error() {
  local np=$1 want=$2
  shift 2
  "${MPI[@]}" -np "$np" "$KILN" train "${args[@]}" "$@" --out="$T/bad" >"$T/out" 2>"$T/err"
  local rc=$?
  local line
  line=$(grep -m1 -E "^(\[rank [0-9]+\] )?error: " "$T/err" | sed -E 's/^\[rank [0-9]+\] //')
  [ $rc -ne 0 ] && [ -n "$line" ] && echo "$line" | grep -qE "$want" && ok ||
    bad "$*: rc $rc, wanted /$want/: $(head -3 "$T/err")"
}
expect_error 2 "^error: sp 4 with 2 ranks \(--sp\): the world must be sp x data-parallel ranks" --sp=4
expect_error 4 "^error: 6 heads and 6 KV heads over 4 Ulysses ranks \(--sp=4, --sp-mode=ulysses\)" \
  --heads=6 --dim=48 --sp=4 --sp-mode=ulysses
expect_error 4 "^error: 4 heads and 2 KV heads over 4 Ulysses ranks" --kv-heads=2 --sp=4 --sp-mode=ulysses
expect_error 2 "^error: seq 30 over sp 2 \(--seq, --sp-mode=ring\): the ring's zigzag cuts the sequence into 2 x ring chunks.*use a --seq that divides by 4" \
  --seq=30 --sp=2 --sp-mode=ring
expect_error 2 "^error: sp-ulysses 2 with sp-mode ring \(--sp-ulysses\)" --sp=2 --sp-mode=ring --sp-ulysses=2
expect_error 2 "^error: sp-ulysses 2 with sp-mode auto \(--sp-ulysses\)" --sp=2 --sp-mode=auto --sp-ulysses=2
expect_error 4 "^error: sp-mode hybrid with sp 4 and 4 Ulysses ranks" --sp=4 --sp-mode=hybrid --sp-ulysses=4
"$KILN" train "${args[@]}" --sp=2 --out="$T/bad1" 2>"$T/err"
rc=$?
[ $rc -eq 2 ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -q "^error: sp 2 with 1 rank (--sp)" "$T/err" && ok ||
  bad "one process with --sp=2: rc $rc: $(cat "$T/err")"
finish
