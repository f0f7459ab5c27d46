#!/usr/bin/env bash
# The hang watchdog under mpirun (label mpi): a rank made to stall (--inject-stall) ends the whole job with a
# non-zero exit within --hang-timeout + 5 s, leaves no process behind and a dump per rank in RUN/hang, and
# `kiln doctor` names the stalled rank, where it sleeps, and the ranks that waited on it; SIGUSR2 dumps a rank
# without stopping the run; a mismatched collective (test_flight_mpi --mismatch) is reported as one; bad
# --inject-stall values and doctor's own misuse give one-line errors. Also the trainer's reports: a custom model
# is called custom, and a run of one step does not report 0 tok/s.
source "$(dirname "$0")/lib.sh" hang_mpi "$@"
need_mpirun
tiny=(--layers=1 --heads=2 --dim=16 --seq=16 --batch=2 --threads=1 --eval-every=0)
now() { date +%s.%N; }
# the kiln ranks (not mpirun) whose command line holds $1
ranks_of() { pgrep -f -- "$1" | while read -r p; do [ "$(cat /proc/"$p"/comm 2>/dev/null)" = kiln ] && echo "$p"; done; }

# ---- bad values: one line each ----
for v in abc 1 1: :3 1:0 -1:3 1:x 1:3x; do
  expect_error 2 "inject-stall" -- train "${tiny[@]}" --max-steps=1 --inject-stall="$v"
done
expect_error 2 "the job has 1 rank" -- train "${tiny[@]}" --max-steps=1 --inject-stall=1:1

# ---- a stalled rank: the job ends, every rank dumps, doctor names rank 1 ----
timeout 120 "${MPI[@]}" -np 3 "$KILN" train "${tiny[@]}" --max-steps=50 --hang-timeout=3 --inject-stall=1:3 \
  --out="$T/stall" >"$T/stall.out" 2>"$T/stall.err" &
job=$!
t_stall=""
for _ in $(seq 1200); do # until rank 1 goes to sleep (at most 60 s: the ranks start slowly on a busy machine)
  grep -q 'inject-stall: sleeping before step 3' "$T/stall.err" 2>/dev/null && { t_stall=$(now); break; }
  kill -0 $job 2>/dev/null || break
  sleep 0.05
done
wait $job
rc=$?
t_end=$(now)
[ -n "$t_stall" ] && ok || bad "rank 1 never reported its stall: $(tail -3 "$T/stall.err")"
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && ok || bad "a stalled job exited $rc, expected non-zero (not the test's timeout)"
if [ -n "$t_stall" ]; then
  took=$(awk -v a="$t_stall" -v b="$t_end" 'BEGIN { printf "%.1f", b - a }')
  echo "the job ended ${took} s after the stall (--hang-timeout=3)"
  awk -v t="$took" 'BEGIN { exit !(t <= 8) }' && ok || bad "the job took ${took} s after the stall, more than timeout + 5 s"
fi
for _ in $(seq 100); do [ -z "$(ranks_of "out=$T/stall")" ] && break; sleep 0.05; done
[ -z "$(ranks_of "out=$T/stall")" ] && ok || bad "kiln processes left behind: $(ranks_of "out=$T/stall")"
for r in 0 1 2; do
  [ -s "$T/stall/hang/rank-$r.txt" ] && ok || bad "no dump from rank $r in RUN/hang: $(ls "$T/stall/hang" 2>&1)"
done
grep -q 'hang: ' "$T/stall.err" && ok || bad "the watchdog said nothing on stderr"
"$KILN" doctor "$T/stall" >"$T/doc" 2>"$T/doc.err"
rc=$?
cat "$T/doc"
[ "$rc" -eq 0 ] && ok || bad "kiln doctor exited $rc: $(cat "$T/doc.err")"
grep -q '^rank 1 never entered collective #[0-9]* on communicator 0 (world)' "$T/doc" && ok ||
  bad "doctor did not name rank 1 as the one that never entered the collective"
grep -q 'rank 1 (pid [0-9]* on .*): step 3, .*outside any collective.*, stack: kiln_train_injected_stall' "$T/doc" && ok ||
  bad "doctor did not say where rank 1 was (step 3, its stack)"
grep -q '^ranks 0, 2 were waiting for rank 1 in collective' "$T/doc" && ok || bad "doctor did not name ranks 0 and 2 as waiting"
grep -q 'no mismatched collectives' "$T/doc" && ok || bad "doctor reported a mismatch where there is none"

# ---- without --out: the dumps go to ./kiln-hang, which doctor reads too ----
mkdir -p "$T/noout"
(cd "$T/noout" && timeout 120 "${MPI[@]}" -np 2 "$KILN" train "${tiny[@]}" --max-steps=50 --hang-timeout=2 \
  --inject-stall=0:2 --quiet >/dev/null 2>&1)
[ $? -ne 0 ] && ok || bad "a stalled job without --out exited 0"
[ -s "$T/noout/kiln-hang/rank-0.txt" ] && [ -s "$T/noout/kiln-hang/rank-1.txt" ] && ok ||
  bad "no dumps in ./kiln-hang: $(ls "$T/noout" 2>&1)"
"$KILN" doctor "$T/noout/kiln-hang" 2>&1 | grep -q '^rank 0 never entered collective' && ok ||
  bad "doctor on ./kiln-hang did not name rank 0"

# ---- SIGUSR2: a dump, and the run goes on to its end ----
steps=2000
"${MPI[@]}" -np 3 "$KILN" train "${tiny[@]}" --max-steps=$steps --log-every=1 --quiet --hang-timeout=30 \
  --out="$T/usr2" >/dev/null 2>"$T/usr2.err" &
job=$!
for _ in $(seq 1200); do [ -s "$T/usr2/metrics.jsonl" ] && break; sleep 0.05; done
victim=$(ranks_of "out=$T/usr2" | sort -n | sed -n 2p)
[ -n "$victim" ] && kill -USR2 "$victim"
wait $job
rc=$?
[ "$rc" -eq 0 ] && ok || bad "the run signalled with SIGUSR2 exited $rc: $(tail -3 "$T/usr2.err")"
[ "$(grep -c '"step":' "$T/usr2/metrics.jsonl")" -eq $steps ] && ok || bad "the run did not reach step $steps after SIGUSR2"
dump=$(ls "$T/usr2/hang/"rank-*-usr2.txt 2>/dev/null | head -1)
[ -n "$dump" ] && grep -q '^trigger=usr2$' "$dump" && grep -q "^pid=$victim$" "$dump" && ok ||
  bad "no SIGUSR2 dump of pid $victim in RUN/hang: $(ls "$T/usr2/hang" 2>&1)"
[ ! -e "$T/usr2/hang/rank-0.txt" ] && ok || bad "SIGUSR2 wrote a hang dump (rank-N.txt) instead of rank-N-usr2.txt"
"$KILN" doctor "$T/usr2" >"$T/doc2" 2>&1 && ok || bad "kiln doctor on a SIGUSR2 dump failed: $(cat "$T/doc2")"

# ---- a mismatched collective ----
prog="$(dirname "$KILN")/test_flight_mpi"
if [ -x "$prog" ]; then
  timeout 120 "${MPI[@]}" -np 3 "$prog" --mismatch "$T/mm" >/dev/null 2>"$T/mm.err"
  rc=$?
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && ok || bad "the mismatched job exited $rc"
  "$KILN" doctor "$T/mm" >"$T/doc3" 2>&1
  cat "$T/doc3"
  grep -q '^mismatch: collective #[0-9]* on communicator 0 (world) differs across ranks: all_reduce, 16 bytes f32.* on ranks 0, 2; barrier.* on rank 1' "$T/doc3" && ok ||
    bad "doctor did not report the mismatched collective"
else
  echo "no $prog (a build without MPI tests): mismatch check skipped"
fi

# ---- doctor's misuse ----
mkdir -p "$T/empty/hang"
"$KILN" doctor "$T/empty" >/dev/null 2>"$T/e"
rc=$?
[ "$rc" -eq 1 ] && [ "$(wc -l <"$T/e")" -eq 1 ] && grep -q '^error: no hang dumps in' "$T/e" && ok ||
  bad "doctor on an empty RUN/hang: exit $rc, $(cat "$T/e")"
"$KILN" doctor "$T/nowhere" >/dev/null 2>"$T/e"
[ $? -eq 1 ] && [ "$(wc -l <"$T/e")" -eq 1 ] && ok || bad "doctor on a missing run: $(cat "$T/e")"
"$KILN" doctor >/dev/null 2>"$T/e"
[ $? -eq 2 ] && [ "$(wc -l <"$T/e")" -eq 1 ] && ok || bad "doctor without a run is not a one-line usage error"
"$KILN" doctor "$T/a" "$T/b" >/dev/null 2>"$T/e"
[ $? -eq 2 ] && [ "$(wc -l <"$T/e")" -eq 1 ] && ok || bad "doctor with two runs is not a one-line usage error"

# ---- the trainer's reports ----
"$KILN" train "${tiny[@]}" --max-steps=1 >/dev/null 2>"$T/one.err" || bad "a 1-step run failed"
grep -q 'custom (L=1, heads=2' "$T/one.err" && ok || bad "a custom model is not called custom: $(head -1 "$T/one.err")"
(cd "$T" && "$KILN" train --max-steps=1 --batch=1 --seq=16 --threads=1 --eval-every=0 >/dev/null 2>"$T/preset.err") ||
  bad "a 1-step run of the preset failed"
grep -q '^kiln: shakespeare-char | ' "$T/preset.err" && ok || bad "the preset is not named: $(head -1 "$T/preset.err")"
[ ! -e "$T/kiln-hang" ] && ok || bad "a run without --out that did not hang left ./kiln-hang behind"
grep -q 'kiln: done: 1 steps' "$T/one.err" && ! grep -q ' 0 tok/s' "$T/one.err" && ok ||
  bad "a 1-step run reports 0 tok/s: $(tail -1 "$T/one.err")"
finish
