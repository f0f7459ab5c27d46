#!/usr/bin/env bash
# A rank killed under a bare mpirun gets a kiln line (label mpi; parallel/comm/peers.h): at 2 and 3 ranks,
# each rank in turn SIGKILLed mid-run (and one SIGSEGVed), a surviving rank on the machine prints exactly one
# line naming the dead rank and its pid, with the signal where /proc still showed it and otherwise saying
# that it died and only its launcher knows how; the job ends non-zero within seconds. A run that ends
# normally, ranks leaving at their own pace, names no rank.
source "$(dirname "$0")/lib.sh" rank_death_mpi "$@"
need_mpirun
tiny=(--layers=2 --heads=2 --dim=32 --block-size=32 --seq=32 --batch=4 --threads=1 --eval-every=0 --quiet)

# the pid of rank R of the job writing into RUN
rank_pid() {
  local run=$1 rank=$2 p
  for p in $(pgrep -f -- "--out=$run"); do
    [ "$(cat /proc/"$p"/comm 2>/dev/null)" = kiln ] || continue
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$rank" && echo "$p"
  done | head -1
}

# killed NP RANK SIG
killed() {
  local np=$1 rank=$2 sig=$3 what="np $1, rank $2 $3"
  local run="$T/run_${np}_${rank}_$sig"
  "${MPI[@]}" -np "$np" "$KILN" train "${tiny[@]}" --max-steps=1000000 --out="$run" >/dev/null 2>"$T/err" &
  local job=$!
  for _ in $(seq 600); do [ -s "$run/metrics.jsonl" ] && break; sleep 0.05; done
  local victim
  victim=$(rank_pid "$run" "$rank")
  if [ -z "$victim" ]; then
    bad "$what: no rank $rank found"
    kill "$job"
    wait "$job"
    return
  fi
  kill -"$sig" "$victim"
  local t0=$SECONDS
  wait "$job"
  local rc=$? took=$((SECONDS - t0))
  [ "$rc" -ne 0 ] && [ "$took" -le 20 ] && ok || bad "$what: exit $rc after $took s"
  local lines
  lines=$(grep -E "^kiln: \[rank [0-9]+\] during step [0-9]+, rank $rank \(pid $victim on [^)]*\) (was killed by signal [0-9]+ \(SIG$sig\)|died: its process is gone; the signal or exit status that ended it went to its launcher alone \(mpirun and srun report it\)); ending the job \(exit 1\)$" "$T/err" | wc -l)
  [ "$lines" -eq 1 ] && ok || bad "$what: $lines lines name rank $rank (pid $victim): $(grep kiln "$T/err")"
  # one line, by a living rank: no rank named twice, nor one that lived
  [ "$(grep -c "^kiln: \[rank .*during step" "$T/err")" -eq 1 ] && ok || bad "$what: $(grep kiln "$T/err")"
  ! grep -q "^kiln: \[rank $rank\] during step" "$T/err" && ok || bad "$what: the dead rank spoke"
}
for np in 2 3; do
  for rank in $(seq 0 $((np - 1))); do
    killed "$np" "$rank" KILL
  done
done
killed 2 1 SEGV

# no rank is named when the job ends normally (ranks leave at their own pace), nor when it stops on SIGTERM
for np in 2 3; do
  "${MPI[@]}" -np "$np" "$KILN" train "${tiny[@]}" --max-steps=6 --ckpt-every=3 --out="$T/ok$np" >/dev/null 2>"$T/err" &&
    ok || bad "a normal run at $np failed: $(cat "$T/err")"
  ! grep -q "during step" "$T/err" && ok || bad "a normal run at $np named a rank: $(cat "$T/err")"
done
finish
