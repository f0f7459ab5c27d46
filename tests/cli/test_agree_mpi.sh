#!/usr/bin/env bash
# Every rank runs the same job (label mpi; docs/distributed.md, "What the ranks agree on"): a rank given one
# option other than rank 0's (a wrapper appends it to that rank's command line) stops the job within seconds,
# every rank exiting 2 with one line that names the first differing rank, the option and both values, at 2
# and 3 ranks for a model, a data, a schedule and a parallelism option; options that may differ (--log-every,
# --threads, --quiet, --out's spelling) run; a rank resuming from another checkpoint than rank 0's refuses,
# and so does one whose --resume mode differs.
source "$(dirname "$0")/lib.sh" agree_mpi "$@"
need_mpirun
tiny=(--layers=2 --heads=2 --dim=32 --block-size=32 --seq=32 --batch=4 --threads=1 --eval-every=0 --quiet)
# the wrapper: rank N's command line gets $R<N>ARGS appended
cat >"$T/wrap.sh" <<'SH'
#!/bin/sh
eval "extra=\${R${OMPI_COMM_WORLD_RANK}ARGS:-}"
exec "$@" $extra
SH
chmod +x "$T/wrap.sh"

# refused NP RANK 'EXTRA' PATTERN: rank RANK of NP gets EXTRA; the job ends non-zero within 20 s (not by the
# test's timeout), each rank that spoke printed exactly PATTERN's line, rank 0 among them, and nothing crashed
refused() {
  local np=$1 rank=$2 extra=$3 pat=$4 what="np $1, rank $2 with $3"
  rm -rf "$T/run"
  local t0=$SECONDS
  timeout 60 "${MPI[@]}" -np "$np" -x "R${rank}ARGS=$extra" "$T/wrap.sh" "$KILN" train "${tiny[@]}" \
    --max-steps=20 --out="$T/run" >"$T/out" 2>"$T/err"
  local rc=$? took=$((SECONDS - t0))
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && ok || bad "$what: exit $rc"
  [ "$took" -le 20 ] && ok || bad "$what: took $took s"
  grep -q "^\[rank 0\] error: $pat" "$T/err" && ok || bad "$what: rank 0 did not say '$pat': $(grep error "$T/err")"
  # every kiln line is that error (no other rank's different story, no heap corruption, no MPI abort)
  local other
  other=$(grep -E '^\[rank|error|corrupt|MPI_ABORT|malloc' "$T/err" | grep -v "^\[rank [0-9]\] error: $pat")
  [ -z "$other" ] && ok || bad "$what: other lines: $other"
}
for np in 2 3; do
  r=$((np - 1))
  refused "$np" "$r" --dim=48 "rank $r has dim=48 where rank 0 has dim=32 (--dim): every rank must run the same config"
  refused "$np" "$r" --data=random "rank $r has data=random where rank 0 has data=(none) (--data): "
  refused "$np" "$r" --schedule=linear "rank $r has schedule=linear where rank 0 has schedule=cosine (--schedule): "
  refused "$np" "$r" --zero=2 "rank $r has zero=2 where rank 0 has zero=1 (--zero): "
done
# with two ranks differing, the first is named
refused 3 1 --bucket-mb=1 "rank 1 has bucket-mb=1 where rank 0 has bucket-mb=25 (--bucket-mb): "
# the first option in the table's order: --layers comes before --max-steps
refused 2 1 "--max-steps=30 --layers=3" "rank 1 has layers=3 where rank 0 has layers=2 (--layers): "

# ---- options that may differ ----
"${MPI[@]}" -np 2 -x "R1ARGS=--log-every=3 --threads=2 --quiet=0 --hang-timeout=60" "$T/wrap.sh" "$KILN" train \
  "${tiny[@]}" --max-steps=4 --ckpt-every=2 --keep-last=0 --out="$T/a" >/dev/null 2>"$T/err" && ok ||
  bad "options that may differ were refused: $(grep error "$T/err")"
# --out's spelling: rank 1 names the same run directory relative to its working directory
(cd "$T" && "${MPI[@]}" -np 2 -x "R1ARGS=--out=a" "$T/wrap.sh" "$KILN" train "${tiny[@]}" --max-steps=6 \
  --out="$T/a" >/dev/null 2>"$T/err") && ok || bad "--out spelled otherwise on rank 1 was refused: $(grep error "$T/err")"
# but a rank without --out would skip the checkpoints' collectives
refused 2 1 --out= "rank 1 has out=(none) where rank 0 has out=$T/run (--out): "

# ---- resume: the same checkpoint on every rank ----
ck="$T/a/ckpt"
[ -d "$ck/step_00000002" ] && [ -d "$ck/step_00000004" ] || bad "no checkpoints to resume from: $(ls "$ck")"
t0=$SECONDS
timeout 60 "${MPI[@]}" -np 2 -x "R1ARGS=--resume=$ck/step_00000002" "$T/wrap.sh" "$KILN" train "${tiny[@]}" \
  --max-steps=8 --resume="$ck/step_00000004" --out="$T/b" >/dev/null 2>"$T/err"
rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ $((SECONDS - t0)) -le 20 ] && ok || bad "two checkpoints: exit $rc after $((SECONDS - t0)) s"
grep -q "^\[rank 0\] error: rank 1 resumes from $ck/step_00000002 (step 2, state.json [0-9a-f]*) where rank 0 resumes from $ck/step_00000004 (step 4, .*(--resume): every rank must resume from the same checkpoint" "$T/err" && ok ||
  bad "a rank resuming from another checkpoint was not named: $(grep error "$T/err")"
# the same checkpoint spelled otherwise resumes
(cd "$T" && "${MPI[@]}" -np 2 -x "R1ARGS=--resume=a/ckpt/step_00000004" "$T/wrap.sh" "$KILN" train "${tiny[@]}" \
  --max-steps=8 --resume="$ck/step_00000004" --out="$T/c" >/dev/null 2>"$T/err") && ok ||
  bad "one checkpoint spelled two ways was refused: $(grep error "$T/err")"
refused 2 1 --resume=never "rank 1 has resume=never where rank 0 has resume=auto (--resume): "
finish
