#!/usr/bin/env bash
# The GPU bench scripts, dry (KILN_DRY=1). bench/dist_multi_gpu.sh's multi-GPU runs: every kiln run of the parts one GPU run takes
# (correct, scale, big, long, faults) at 4 and 2 GPUs has its options parsed, validated and planned by
# `kiln info` (bench/kiln_dry.sh), so that a bad flag (a --seq past the model's block size, an --sp that does
# not divide the world) fails here and not on the GPU machine, where each such mistake has cost a run. Then
# bench/long_context.sh's sweep and bench/strategies.sh's table the same way.
# KILN_BENCH_DRY_PART picks one part (ctest runs them as separate tests, side by side): gpus4 and gpus2
# (bench/dist_multi_gpu.sh at 4 and 2 GPUs, most of the time), or other (the rest); unset, all of them.
source "$(dirname "$0")/lib.sh" bench_dry "$@"
cd "$(dirname "$0")/../.."
part=${KILN_BENCH_DRY_PART:-all}
case $part in all | gpus4 | gpus2 | other) ;; *) echo "KILN_BENCH_DRY_PART=$part: one of gpus4, gpus2, other"; exit 2 ;; esac
gpus=(4 2)
[ "$part" = gpus4 ] && gpus=(4)
[ "$part" = gpus2 ] && gpus=(2)
[ "$part" = other ] && gpus=()
for ng in "${gpus[@]}"; do
  : >"$T/checked"
  KILN_DRY=1 KILN_NG=$ng BUILD="$(dirname "$KILN")" OUT="$T/out$ng" KILN_DRY_LOG="$T/refused$ng" \
    KILN_DRY_CHECKED="$T/checked" KILN_PART="correct scale big long faults" KILN_DEADLINE=100000 \
    timeout 600 bash bench/dist_multi_gpu.sh >"$T/console$ng" 2>&1
  rc=$?
  [ $rc -eq 0 ] && ok || bad "$ng GPUs: the dry run exited $rc: $(tail -3 "$T/console$ng")"
  [ -f "$T/refused$ng" ] && [ ! -s "$T/refused$ng" ] && ok || bad "$ng GPUs: kiln refused runs: $(cat "$T/refused$ng" 2>/dev/null)"
  # (every part ran some: correct's 1-GPU run and its launches, scale's, big's, long's and the faults')
  n=$(wc -l <"$T/checked")
  [ "$n" -ge 20 ] && ok || bad "$ng GPUs: only $n kiln runs were checked"
  for want in "--preset=llama-8b" "--sp=$ng --sp-mode=ulysses" "--inject-stall" "--zero=3"; do
    grep -q -- "$want" "$T/checked" && ok || bad "$ng GPUs: no run with $want was checked"
  done
done
if [ "$part" = gpus4 ] || [ "$part" = gpus2 ]; then
  finish
  exit
fi
# bench/long_context.sh's sweep, one GPU, 2k to 512k tokens, as each recompute mode runs it
for rc in auto selective block; do
  : >"$T/checked"
  KILN_DRY=1 BUILD="$(dirname "$KILN")" OUT="$T/long_$rc" KILN_DRY_LOG="$T/refused_$rc" KILN_DRY_CHECKED="$T/checked" \
    KILN_RECOMPUTE=$rc timeout 300 bash bench/long_context.sh >"$T/console_$rc" 2>&1
  rc_=$?
  [ $rc_ -eq 0 ] && ok || bad "long_context.sh --recompute=$rc: the dry run exited $rc_: $(tail -3 "$T/console_$rc")"
  [ -f "$T/refused_$rc" ] && [ ! -s "$T/refused_$rc" ] && ok ||
    bad "long_context.sh --recompute=$rc: kiln refused runs: $(cat "$T/refused_$rc" 2>/dev/null)"
  [ "$(wc -l <"$T/checked")" -eq 7 ] && ok || bad "long_context.sh --recompute=$rc: $(wc -l <"$T/checked") of 7 lengths checked"
done
# bench/strategies.sh's table at 4 and 2 ranks (issue 17's rows), through its --kiln
for ranks in 4 2; do
  : >"$T/checked"
  : >"$T/refused_s$ranks"
  KILN_REAL="$KILN" KILN_DRY_LOG="$T/refused_s$ranks" KILN_DRY_CHECKED="$T/checked" OMPI_ALLOW_RUN_AS_ROOT=1 \
    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 300 bash bench/strategies.sh --device=cuda --ranks=$ranks \
    --kiln="$PWD/bench/kiln_dry.sh" --models=a,b --torch=0 --out="$T/strat$ranks" >"$T/console_s$ranks" 2>&1
  rc_=$?
  [ $rc_ -eq 0 ] && ok || bad "strategies.sh --ranks=$ranks: the dry run exited $rc_: $(tail -3 "$T/console_s$ranks")"
  [ ! -s "$T/refused_s$ranks" ] && ok || bad "strategies.sh --ranks=$ranks: kiln refused runs: $(cat "$T/refused_s$ranks")"
  n=$(wc -l <"$T/checked")
  [ "$n" -ge 20 ] && ok || bad "strategies.sh --ranks=$ranks: only $n kiln runs were checked"
done
# bad values of its flags: exit 2 with one line that names the flag
for bad_flag in --deadline=abc --deadline=0 --torch-timeout=-5; do
  out=$(bash bench/strategies.sh --device=cpu "$bad_flag" --out="$T/strat_bad" 2>&1)
  rc_=$?
  [ $rc_ -eq 2 ] && [ "$(echo "$out" | wc -l)" -eq 1 ] && [[ $out == *"${bad_flag%%=*}"* ]] && ok ||
    bad "strategies.sh $bad_flag: exit $rc_, wanted 2 and one line naming the flag: $out"
done
# --deadline: the rows past it are skipped and the table is still written, each skipped row saying so (a kiln
# that takes a second a run: the first row or two end past a 2 s deadline, and the other ten or more are skipped)
printf '#!/usr/bin/env bash\nsleep 1\nexec "%s" "$@"\n' "$PWD/bench/kiln_dry.sh" >"$T/slow_kiln"
chmod +x "$T/slow_kiln"
KILN_REAL="$KILN" KILN_DRY_LOG="$T/refused_d" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  timeout 300 bash bench/strategies.sh --device=cuda --ranks=2 --kiln="$T/slow_kiln" --models=a \
  --torch=0 --deadline=2 --out="$T/strat_d" >"$T/console_d" 2>&1
rc_=$?
[ $rc_ -eq 0 ] && ok || bad "strategies.sh --deadline=2: exited $rc_: $(tail -3 "$T/console_d")"
n=$(grep -c '| skipped |' "$T/strat_d/strategies.md" 2>/dev/null)
rows=$(grep -c '^| a |' "$T/strat_d/strategies.md" 2>/dev/null)
[ "${n:-0}" -ge 10 ] && [ "${rows:-0}" -eq 12 ] && ok ||
  bad "strategies.sh --deadline=2: $n of ${rows:-0} rows skipped in its table (12 rows, 10 or more skipped)"
# bench/attn_variants.sh's verdict on attn_bench lines (an H100's times of 2026-11-26, the variants renamed as
# attn_bench now prints them): a variant wins only where it is more than 1% faster at every shape and passed
# its checks; the winner's setting is what the next command sources
row() { # SHAPE NAME FWD_MS BWD_MS [CHECK]
  printf '%-40s %-9s fwd %7.3f ms  500.0 TF/s  bwd %7.3f ms  400.0 TF/s  f+b  450.0 TF/s  x4.00  vs ref: out 1e-3 %s\n' \
    "$1" "$2" "$3" "$4" "${5:-ok}"
}
s32="B=1 T=32768 NH=16 NKV=16 HS=128 none" s64="B=1 T=65536 NH=16 NKV=16 HS=128 none"
attn_log() { # OWN_BWD_AT_64K OWN_CHECK: the two shapes' lines
  row "$s32" wgmma 7.492 23.624; row "$s32" wgmma-red 7.50 26.42; row "$s32" wgmma-ov 8.148 23.62
  row "$s32" wgmma-tma 7.49 25.02; row "$s32" wgmma-early 7.49 21.50 "$2"
  row "$s64" wgmma 29.51 97.15; row "$s64" wgmma-red 29.5 109.0; row "$s64" wgmma-ov 32.45 97.2
  row "$s64" wgmma-tma 29.5 102.4; row "$s64" wgmma-early 29.5 "$1" "$2"
}
attn_log 96.5 ok >"$T/attn.log"
OUT="$T/av" bash bench/attn_variants.sh --verdict "$T/attn.log" >"$T/av.txt" 2>&1 && ok || bad "verdict: $(cat "$T/av.txt")"
grep -q "wgmma-early bwd: x1.007 to x1.099" "$T/av.txt" && ! grep -q "wins" "$T/av.txt" && [ ! -s "$T/av/attn_choice.env" ] &&
  ok || bad "a variant 0.7% faster at one shape won, or the times were misread: $(cat "$T/av.txt")"
attn_log 90.0 ok >"$T/attn.log"
OUT="$T/av" bash bench/attn_variants.sh --verdict "$T/attn.log" >"$T/av.txt" 2>&1
grep -q "wgmma-early bwd: .* -> wins" "$T/av.txt" && [ "$(cat "$T/av/attn_choice.env")" = "export KILN_WGMMA_DQ=tma-early" ] &&
  ok || bad "the faster variant did not win: $(cat "$T/av.txt"; cat "$T/av/attn_choice.env")"
attn_log 90.0 CHECK-FAIL >"$T/attn.log"
OUT="$T/av" bash bench/attn_variants.sh --verdict "$T/attn.log" >"$T/av.txt" 2>&1
! grep -q "wins" "$T/av.txt" && [ ! -s "$T/av/attn_choice.env" ] && ok ||
  bad "a variant that failed its checks won: $(cat "$T/av.txt")"
bash bench/attn_variants.sh "1 32768" >"$T/av.txt" 2>&1
[ $? -eq 2 ] && grep -q "shape '1 32768' is not" "$T/av.txt" && ok || bad "a bad shape: $(cat "$T/av.txt")"
finish
