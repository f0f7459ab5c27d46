#!/usr/bin/env bash
# A rank that stops running (SIGSTOP: what a frozen VM, the cgroup freezer or a swap storm look like to the
# others) under mpirun (label mpi): the job ends non-zero, the other ranks name it on stderr, and `kiln doctor`
# names it and blames no healthy rank, whether the stopped rank stays stopped until the job is ended (no dump
# of its own) or is woken after the others gave up (its dump comes late, after it ran on): at 2 and 3 ranks,
# each rank in turn.
source "$(dirname "$0")/lib.sh" freeze_mpi "$@"
need_mpirun
tiny=(--layers=1 --heads=2 --dim=16 --seq=16 --batch=2 --threads=1 --eval-every=0 --log-every=1 --quiet)
# the kiln process of rank $2 among those whose command line holds $1
rank_pid() {
  pgrep -f -- "$1" | while read -r p; do
    [ "$(cat /proc/"$p"/comm 2>/dev/null)" = kiln ] &&
      tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2" && echo "$p"
  done
}

# frozen NP VICTIM WAKE: stop rank VICTIM of NP once training is under way; WAKE=1: SIGCONT it once another
# rank has dumped (its own dump then comes late), else leave it stopped until mpirun ends the job
frozen() {
  local np=$1 v=$2 wake=$3 run="$T/f$1$2" what="np $1, rank $2 stopped (woken: $3)"
  timeout 90 "${MPI[@]}" -np "$np" "$KILN" train "${tiny[@]}" --max-steps=100000 --hang-timeout=2 \
    --out="$run" >/dev/null 2>"$run.err" &
  local job=$!
  for _ in $(seq 1200); do [ -s "$run/metrics.jsonl" ] && break; sleep 0.05; done
  sleep 0.3
  local pid
  pid=$(rank_pid "out=$run" "$v")
  if [ -z "$pid" ]; then
    bad "$what: no rank $v found"
    kill $job
    wait $job
    return
  fi
  kill -STOP "$pid"
  if [ "$wake" = 1 ]; then
    for _ in $(seq 200); do ls "$run"/hang/rank-*.txt >/dev/null 2>&1 && break; sleep 0.05; done
    sleep 0.3
    kill -CONT "$pid"
  fi
  wait $job
  local rc=$?
  kill -CONT "$pid" 2>/dev/null
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && ok || bad "$what: exit $rc"
  grep -Eq "^kiln: \[rank [0-9]+\] hang: rank $v wrote no dump|^kiln: \[rank $v\] hang: this rank did not run" \
    "$run.err" && ok || bad "$what: stderr does not name rank $v: $(grep 'hang:' "$run.err")"
  "$KILN" doctor "$run" >"$run.doc" 2>&1 || bad "$what: kiln doctor failed: $(cat "$run.doc")"
  grep -Eq "^rank $v did not run for|rank $v, which (wrote no dump|did not run)|^rank $v never entered" "$run.doc" &&
    ok || bad "$what: doctor does not name rank $v: $(cat "$run.doc")"
  # no healthy rank is blamed
  local blamed
  blamed=$(grep -Eo "^ranks? [0-9, ]+ never entered|waiting for ranks? [0-9, ]+ in" "$run.doc" |
    grep -Eo "[0-9]+" | grep -vx "$v")
  [ -z "$blamed" ] && ok || bad "$what: doctor blames rank(s) $blamed: $(cat "$run.doc")"
}
frozen 2 0 1
frozen 2 1 0
frozen 3 0 0
frozen 3 1 1
frozen 3 2 0
finish
