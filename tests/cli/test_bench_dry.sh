#!/usr/bin/env bash
# The device calls' bench scripts, dry (KILN_DRY=1). bench/dist_multi_gpu.sh's multi-GPU runs: every kiln run of the parts a device call takes
# (correct, scale, big, long, faults) at 4 and 2 GPUs has its options parsed, validated and planned by
# `kiln info` (bench/kiln_dry.sh), so that a bad flag (a --seq past the model's block size, an --sp that does
# not divide the world) fails here and not in device time, where each such mistake has cost a call. Then
# bench/long_context.sh's sweep and bench/strategies.sh's table the same way.
source "$(dirname "$0")/lib.sh" bench_dry "$@"
cd "$(dirname "$0")/../.."
for ng in 4 2; do
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
finish
