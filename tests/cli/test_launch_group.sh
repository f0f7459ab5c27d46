#!/usr/bin/env bash
# kiln launch --nproc-per-node=N: a group of local ranks. The ranks are a small script (KILN_LAUNCH_EXE) that
# records what it was given and then does what $BEHAVE says. Env mode: each rank's torchrun variables (one
# port for all, in one process group of their own); a failed rank brings the others down at once (SIGTERM),
# one that ignores SIGTERM is SIGKILLed after --grace, and no process of the group outlives launch; a crash
# restarts the whole group with --resume=auto and logs the rank that failed first; a usage error is not
# retried; SIGTERM to launch reaches every rank (exit 75). Mpirun mode: the command line (a fake mpirun), a
# missing mpirun, and the real one where it is installed. Bad flags.
source "$(dirname "$0")/lib.sh" launch_group "$@"

REC=$T/rec
export REC
cat >"$T/rank.sh" <<'EOF'
#!/usr/bin/env bash
# A stand-in for kiln train as one rank of kiln launch.
case $BEHAVE in
term) trap 'echo "term $RANK" >>"$REC/terms"; kill $child 2>/dev/null; exit 75' TERM ;;
stubborn) [ "$RANK" != 1 ] && trap '' TERM ;; # and the sleep below inherits it
esac
read -r _ _ _ _ pgid _ </proc/$$/stat
echo "$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT $pgid $$ $*" >>"$REC/ranks"
echo $$ >>"$REC/pids"
linger() { # a long "step" in a child process of the rank, as a data loader's could be
  sleep 100 &
  child=$!
  echo $child >>"$REC/pids"
  wait $child
}
# until the other ranks are in their long step: 1 + 2 (N - 1) pids (at most 60 s: a loaded machine is slow)
others_busy() { for _ in $(seq 6000); do [ "$(wc -l <"$REC/pids")" -ge $((2 * WORLD_SIZE - 1)) ] && break; sleep 0.01; done; }
# exit 3, noting when: the group's stop is timed from here, not from launch's start
crash() { echo "${EPOCHREALTIME/./}" >"$REC/crash_us"; exit 3; }
restarts=$(cat "$REC/run/restarts.jsonl" 2>/dev/null | wc -l)
case $BEHAVE in
ok) exit 0 ;;
crash | stubborn) [ "$RANK" = 1 ] && { others_busy; sleep 0.2; crash; } ;;
usage) [ "$RANK" = 2 ] && { sleep 0.1; exit 2; } ;;
flaky) # the first start: rank 2 is killed; the second: rank 1 exits 3; the third succeeds
  case $restarts$RANK in 02) kill -KILL $$ ;; 11) exit 3 ;; esac
  [ "$restarts" -ge 2 ] && exit 0 ;;
esac
linger
EOF
chmod +x "$T/rank.sh"
export KILN_LAUNCH_EXE=$T/rank.sh
unset KILN_LAUNCH_MPIRUN
targs=(--out="$REC/run" --max-steps=10)

# alive PID: the process exists and is not a zombie
alive() { kill -0 "$1" 2>/dev/null && ! grep -q '^[0-9]* (.*) Z ' "/proc/$1/stat" 2>/dev/null; }
# run_group BEHAVE LAUNCH-OPTIONS...: a fresh record, then launch in env mode; sets rc and ms, the time from
# a rank's crash (if one crashed) to launch's exit
run_group() {
  rm -rf "$REC" && mkdir -p "$REC/run"
  BEHAVE=$1 "$KILN" launch --mode=env "${@:2}" -- "${targs[@]}" 2>"$T/err"
  rc=$?
  local t1=${EPOCHREALTIME/./}
  ms=-1
  [ -s "$REC/crash_us" ] && ms=$(((t1 - $(cat "$REC/crash_us")) / 1000))
}
no_survivors() {
  # a SIGKILLed process may take a moment to be gone on a loaded machine: up to 3 s
  local left=""
  for _ in $(seq 30); do
    left=""
    for p in $(cat "$REC/pids"); do alive "$p" && left="$left $p"; done
    [ -z "$left" ] && break
    sleep 0.1
  done
  [ -z "$left" ] && ok || bad "$1: processes of the group still running:$left"
}

# all ranks exit 0: launch too; each rank's variables
run_group ok --nproc-per-node=4
[ $rc -eq 0 ] && ok || bad "all ranks exit 0: launch exited $rc: $(cat "$T/err")"
[ "$(cut -d' ' -f1 "$REC/ranks" | sort -n | tr '\n' ' ')" = "0 1 2 3 " ] && ok || bad "RANKs: $(cat "$REC/ranks")"
[ "$(awk '$1 == $3 && $2 == 4 && $4 == 4 && $5 == "127.0.0.1"' "$REC/ranks" | wc -l)" -eq 4 ] && ok ||
  bad "WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR: $(cat "$REC/ranks")"
ports=$(cut -d' ' -f6 "$REC/ranks" | sort -u)
[ "$(echo "$ports" | wc -l)" -eq 1 ] && [ "$ports" -ge 1 ] && [ "$ports" -le 65535 ] && ok ||
  bad "MASTER_PORT: one port for all ranks expected: $(cat "$REC/ranks")"
pgids=$(cut -d' ' -f7 "$REC/ranks" | sort -u)
[ "$(echo "$pgids" | wc -l)" -eq 1 ] && [ "$pgids" != "$(ps -o pgid= $$ | tr -d ' ')" ] && ok ||
  bad "the ranks should share one process group of their own: $(cat "$REC/ranks")"
[ "$(cut -d' ' -f9- "$REC/ranks" | sort -u)" = "train ${targs[*]}" ] && ok || bad "rank argv: $(cat "$REC/ranks")"
[ ! -e "$REC/run/restarts.jsonl" ] && ok || bad "restarts.jsonl after a clean run"
run_group ok --nproc-per-node=2 --master-addr=localhost --master-port=29577
[ $rc -eq 0 ] && [ "$(awk '$5 == "localhost" && $6 == 29577' "$REC/ranks" | wc -l)" -eq 2 ] && ok ||
  bad "--master-addr, --master-port: $(cat "$REC/ranks")"

# rank 1 exits 3 once the others sleep: they are stopped at once by SIGTERM, long before --grace's SIGKILL
run_group crash --nproc-per-node=3 --max-restarts=0 --grace=60
[ $rc -eq 3 ] && ok || bad "rank 1 exits 3, no restarts: launch should exit 3, got $rc: $(cat "$T/err")"
[ $ms -ge 0 ] && [ $ms -lt 20000 ] && ok || bad "stopping the group took $ms ms after the crash"
grep -q "^error: rank 1 of 3 exited with status 3 (kiln launch): giving up after 0 restarts (--max-restarts=0); " "$T/err" && ok ||
  bad "no give-up message: $(cat "$T/err")"
[ "$(wc -l <"$REC/pids")" -eq 5 ] && ok || bad "3 ranks and 2 children expected: $(cat "$REC/pids")"
no_survivors "after a crash"

# a rank that ignores SIGTERM is killed --grace=1 s later, with its children
run_group stubborn --nproc-per-node=3 --max-restarts=0 --grace=1
[ $rc -eq 3 ] && ok || bad "stubborn ranks: launch should exit 3, got $rc: $(cat "$T/err")"
[ $ms -ge 1000 ] && [ $ms -lt 20000 ] && ok || bad "--grace=1: the group stopped $ms ms after the crash"

grep -q "2 ranks still running 1 s after SIGTERM: SIGKILL" "$T/err" && ok || bad "no SIGKILL message: $(cat "$T/err")"
no_survivors "after SIGKILL"

# crashes, then success: the whole group restarts from --resume=auto, one line per restart names the rank
run_group flaky --nproc-per-node=3 --max-restarts=3 --backoff=0.05
[ $rc -eq 0 ] && ok || bad "a crash then a clean start: launch exited $rc: $(cat "$T/err")"
[ "$(wc -l <"$REC/run/restarts.jsonl")" -eq 2 ] && ok || bad "2 restarts: $(cat "$REC/run/restarts.jsonl")"
grep -q '"restart":1,"rank":2,"signal":9,"signal_name":"SIGKILL","uptime_s":[0-9.]*,"resume_step":0,"backoff_s":0.050}' \
  "$REC/run/restarts.jsonl" && ok || bad "first restart record: $(cat "$REC/run/restarts.jsonl")"
grep -q '"restart":2,"rank":1,"exit_status":3,"uptime_s":[0-9.]*,"resume_step":0,"backoff_s":0.100}' \
  "$REC/run/restarts.jsonl" && ok || bad "second restart record: $(cat "$REC/run/restarts.jsonl")"
[ "$(tail -n 3 "$REC/ranks" | grep -c -- '--resume=auto$')" -eq 3 ] && ! head -n 1 "$REC/ranks" | grep -q -- --resume &&
  ok || bad "restarts should add --resume=auto, the first start not: $(cat "$REC/ranks")"
[ "$(cut -d' ' -f6 "$REC/ranks" | sort -u | wc -l)" -ge 2 ] && ok || bad "each start should find a free port afresh"
no_survivors "after restarts"

# a usage error (exit 2) from one rank: the group stops, no restart
run_group usage --nproc-per-node=3 --max-restarts=3 --backoff=0
[ $rc -eq 2 ] && [ ! -e "$REC/run/restarts.jsonl" ] && ok || bad "a rank's usage error: exit $rc, retried?"
grep -q "rank 2 of 3 failed with a usage error (exit 2): not restarting" "$T/err" && ok || bad "usage: $(cat "$T/err")"
no_survivors "after a usage error"

# SIGTERM to launch reaches every rank; they exit 75, launch too, without a restart
rm -rf "$REC" && mkdir -p "$REC/run"
BEHAVE=term "$KILN" launch --mode=env --nproc-per-node=3 -- "${targs[@]}" 2>"$T/err" &
pid=$!
for _ in $(seq 500); do [ "$(cat "$REC/ranks" 2>/dev/null | wc -l)" -eq 3 ] && break; sleep 0.01; done
kill -TERM $pid
wait $pid
rc=$?
[ $rc -eq 75 ] && ok || bad "SIGTERM to launch: exit $rc, expected 75: $(cat "$T/err")"
[ "$(sort "$REC/terms" 2>/dev/null | tr '\n' ' ')" = "term 0 term 1 term 2 " ] && ok ||
  bad "SIGTERM should reach every rank: $(cat "$REC/terms" 2>/dev/null)"
[ ! -e "$REC/run/restarts.jsonl" ] && ok || bad "a forwarded SIGTERM caused a restart"
no_survivors "after SIGTERM"

# mpirun mode: one child, mpirun -np N [--oversubscribe] [--allow-run-as-root] --bind-to none EXE train ARGS
cat >"$T/mpirun" <<'EOF'
#!/usr/bin/env bash
echo "$*" >>"$REC/mpirun"
EOF
chmod +x "$T/mpirun"
root=""
[ "$(id -u)" -eq 0 ] && root="--allow-run-as-root "
ncpu=$(getconf _NPROCESSORS_ONLN)
rm -rf "$REC" && mkdir -p "$REC/run"
KILN_LAUNCH_MPIRUN=$T/mpirun "$KILN" launch --mode=mpirun --nproc-per-node=2 -- "${targs[@]}" 2>"$T/err"
rc=$?
over=""
[ "$ncpu" -lt 2 ] && over="--oversubscribe "
[ $rc -eq 0 ] && [ "$(cat "$REC/mpirun")" = "-np 2 $over$root--bind-to none $T/rank.sh train ${targs[*]}" ] && ok ||
  bad "mpirun command line: $(cat "$REC/mpirun" 2>/dev/null) (exit $rc: $(cat "$T/err"))"
# auto: mpirun for CPU training (N > 1), more ranks than CPUs oversubscribe; kiln itself runs without the hook
rm -f "$REC/mpirun"
N=$((ncpu + 1))
env -u KILN_LAUNCH_EXE KILN_LAUNCH_MPIRUN="$T/mpirun" "$KILN" launch --nproc-per-node=$N -- "${targs[@]}" --device=cpu 2>"$T/err"
rc=$?
[ $rc -eq 0 ] && [ "$(cat "$REC/mpirun")" = "-np $N --oversubscribe $root--bind-to none $(readlink -f "$KILN") train ${targs[*]} --device=cpu" ] &&
  ok || bad "auto, --device=cpu: $(cat "$REC/mpirun" 2>/dev/null) (exit $rc: $(cat "$T/err"))"
# auto with one rank: plain kiln train as before, no mpirun, no rank variables
rm -f "$REC/mpirun"
BEHAVE=ok KILN_LAUNCH_MPIRUN=$T/mpirun "$KILN" launch -- "${targs[@]}" --device=cpu 2>"$T/err"
[ $? -eq 0 ] && [ ! -e "$REC/mpirun" ] && [ "$(cut -d' ' -f1-6 "$REC/ranks")" = "     " ] && ok ||
  bad "one rank: $(cat "$REC/ranks") $(cat "$REC/mpirun" 2>/dev/null)"
# no mpirun: one line
KILN_LAUNCH_MPIRUN=$T/missing expect_error 2 "install openmpi-bin, or use --mode=env" -- launch --mode=mpirun --nproc-per-node=2 -- "${targs[@]}"
PATH=/nonexistent "$KILN" launch --nproc-per-node=2 -- "${targs[@]}" --device=cpu 2>"$T/err"
rc=$?
[ $rc -eq 2 ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -q "^error: mpirun not found.*no mpirun on PATH; install openmpi-bin" "$T/err" &&
  ok || bad "no mpirun on PATH: exit $rc: $(cat "$T/err")"

# the real mpirun, where installed: every rank starts; one that fails brings launch down (no retry here)
if command -v mpirun >/dev/null; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  cat >"$T/mpirank.sh" <<'EOF'
#!/usr/bin/env bash
echo "$OMPI_COMM_WORLD_RANK $OMPI_COMM_WORLD_SIZE $*" >>"$REC/mpiranks"
[ "$BEHAVE" = crash ] && [ "$OMPI_COMM_WORLD_RANK" = 1 ] && exit 3
[ "$BEHAVE" = crash ] && sleep 100
exit 0
EOF
  chmod +x "$T/mpirank.sh"
  rm -rf "$REC" && mkdir -p "$REC/run"
  BEHAVE=ok KILN_LAUNCH_EXE=$T/mpirank.sh "$KILN" launch --mode=mpirun --nproc-per-node=2 -- "${targs[@]}" >"$T/out" 2>"$T/err"
  rc=$?
  [ $rc -eq 0 ] && [ "$(sort "$REC/mpiranks" | tr '\n' '|')" = "0 2 train ${targs[*]}|1 2 train ${targs[*]}|" ] && ok ||
    bad "real mpirun: exit $rc, ranks $(cat "$REC/mpiranks" 2>/dev/null): $(cat "$T/err")"
  t0=$(date +%s)
  BEHAVE=crash KILN_LAUNCH_EXE=$T/mpirank.sh "$KILN" launch --mode=mpirun --nproc-per-node=2 --max-restarts=0 -- "${targs[@]}" >"$T/out" 2>"$T/err"
  rc=$?
  [ $rc -ne 0 ] && [ $(($(date +%s) - t0)) -lt 20 ] && grep -q "mpirun exited with status" "$T/err" && ok ||
    bad "real mpirun, rank 1 exits 3: exit $rc after $(($(date +%s) - t0)) s: $(tail -n 3 "$T/err")"
fi

# bad flags: one line, exit 2
for flag in --nproc-per-node=0 --nproc-per-node=x --nproc-per-node=1.5 --master-port=70000 --master-port=0 \
  --mode=foo --grace=-1 --master-addr=; do
  expect_error 2 "bad value" -- launch "$flag" -- "${targs[@]}"
done
expect_error 2 "cannot find a free port on 192.0.2.1" -- launch --mode=env --nproc-per-node=2 --master-addr=192.0.2.1 -- "${targs[@]}"
KILN_LAUNCH_EXE=$T/missing expect_error 2 "KILN_LAUNCH_EXE" -- launch -- "${targs[@]}"

finish
