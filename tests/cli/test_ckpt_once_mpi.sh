#!/usr/bin/env bash
# An unusable checkpoint is reported once, not once per rank (label mpi): a checkpoint that every rank finds
# unusable (a file with bytes appended: rank 0 sees the size, the others the hash) gives one line, by the
# first rank that found it, when the job falls back past it and when it refuses it (--resume=PATH, or none of
# the run's checkpoints usable); a --resume path that does not exist is one line too. Every rank still exits
# non-zero, and the job ends within seconds.
source "$(dirname "$0")/lib.sh" ckpt_once_mpi "$@"
need_mpirun
tiny=(--layers=2 --heads=2 --dim=32 --block-size=32 --seq=32 --batch=4 --threads=1 --eval-every=0 --quiet)
# every rank's exit status: a wrapper writes it to $T/rc.RANK
cat >"$T/wrap.sh" <<'SH'
#!/bin/sh
"$@"
rc=$?
echo $rc >"$RCDIR/rc.$OMPI_COMM_WORLD_RANK"
exit $rc
SH
chmod +x "$T/wrap.sh"
export RCDIR=$T

# once NP PATTERN WHAT ARGS...: the job ends non-zero within 20 s, every rank non-zero, and PATTERN is on
# exactly one line of stderr
once() {
  local np=$1 pat=$2 what=$3
  shift 3
  rm -f "$T"/rc.*
  local t0=$SECONDS
  timeout 60 "${MPI[@]}" -np "$np" "$T/wrap.sh" "$KILN" train "${tiny[@]}" "$@" >"$T/out" 2>"$T/err"
  local rc=$? took=$((SECONDS - t0))
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$took" -le 20 ] && ok || bad "$what at $np: exit $rc after $took s"
  local n
  n=$(grep -c -- "$pat" "$T/err")
  [ "$n" -eq 1 ] && ok || bad "$what at $np: '$pat' on $n lines: $(cat "$T/err")"
  # no other rank's "its error is above" pointer, nor a second error line
  [ "$(grep -c 'error: ' "$T/err")" -eq 1 ] && ok || bad "$what at $np: error lines: $(grep 'error: ' "$T/err")"
  for r in $(seq 0 $((np - 1))); do
    # (a rank that mpirun ended before its status was written, once another had exited non-zero, did not
    # exit 0 either)
    [ "$(cat "$T/rc.$r" 2>/dev/null)" != 0 ] && ok || bad "$what at $np: rank $r exited 0"
  done
}

for np in 2 3; do
  rm -rf "$T/run"
  "${MPI[@]}" -np "$np" "$KILN" train "${tiny[@]}" --max-steps=4 --ckpt-every=2 --keep-last=0 --out="$T/run" \
    2>"$T/err" || bad "the run to resume failed: $(cat "$T/err")"
  c2="$T/run/ckpt/step_00000002" c4="$T/run/ckpt/step_00000004"
  echo x >>"$c4/model.safetensors"
  # --resume=auto falls back past it: one "unusable" line, then the resume
  cp -r "$T/run" "$T/fb"
  "${MPI[@]}" -np "$np" "$KILN" train "${tiny[@]}" --max-steps=6 --out="$T/fb" 2>"$T/err" ||
    bad "falling back at $np failed: $(cat "$T/err")"
  [ "$(grep -c "checkpoint $c4 is unusable\|checkpoint .*step_00000004 is unusable" "$T/err")" -eq 1 ] &&
    grep -q "resuming from .*step_00000002" "$T/err" && ok || bad "falling back at $np: $(cat "$T/err")"
  rm -rf "$T/fb"
  # --resume=PATH refuses it: one line
  once "$np" "model.safetensors" "a refused checkpoint" --max-steps=6 --out="$T/r" --resume="$c4"
  # none usable
  echo x >>"$c2/model.safetensors"
  once "$np" "none of the 2 checkpoints in $T/run/ckpt is usable" "no usable checkpoint" --max-steps=6 --out="$T/run"
  [ "$(grep -c "is unusable" "$T/err")" -eq 2 ] && ok || bad "no usable checkpoint at $np: $(cat "$T/err")"
  # a path that does not exist
  once "$np" "no checkpoint ($T/nonexistent): the path does not exist" "a missing --resume" --max-steps=6 \
    --out="$T/r" --resume="$T/nonexistent"
done
finish
