#!/usr/bin/env bash
# bench/detached.sh, which runs a training step longer than one remote command may last (1M tokens on one GPU)
# in a process group of its own, which outlives the shell that started it: wait reports a run still going
# (3) and one that ended (0, its exit status kept), stop ends the whole group (its leader's group kill: the
# children too), and bad input is one line, exit 2.
source "$(dirname "$0")/lib.sh" detached "$@"
cd "$(dirname "$0")/../.."
D=(env KILN_DETACHED_DIR="$T/d" OUT="$T")
# started from a shell that exits at once: the run goes on without it
bash -c "$(printf '%q ' "${D[@]}") bash bench/detached.sh start r1 -- bash -c 'echo one; sleep 2; echo two; exit 7'" \
  >"$T/start" 2>&1 && grep -q "r1: started" "$T/start" && ok || bad "start: $(cat "$T/start")"
"${D[@]}" bash bench/detached.sh wait r1 0 >"$T/w0" 2>&1
[ $? -eq 3 ] && grep -q "still running" "$T/w0" && ok || bad "wait 0 s on a running run: $(cat "$T/w0")"
"${D[@]}" bash bench/detached.sh wait r1 30 >"$T/w1" 2>&1
[ $? -eq 0 ] && grep -q "ended, exit 7" "$T/w1" && grep -q two "$T/r1.log" && ok ||
  bad "wait for the run's end: $(cat "$T/w1"); log: $(cat "$T/r1.log" 2>/dev/null)"
# stop ends the process group, child processes included
# (durations of this run's own, so that another run's sleeps on the machine are not taken for these)
s1=$((100000 + RANDOM)) s2=$((200000 + RANDOM))
"${D[@]}" bash bench/detached.sh start r2 -- bash -c "sleep $s1 & sleep $s2; wait" >/dev/null 2>&1
sleep 1
pgrep -f "sleep ($s1|$s2)" >/dev/null && ok || bad "the run to stop did not start its processes"
"${D[@]}" bash bench/detached.sh stop r2 >/dev/null 2>&1
sleep 1
pgrep -f "sleep ($s1|$s2)" >/dev/null && bad "stop left the run's processes" || ok
# a second start of a running name is refused; bad names, verbs and seconds are one line, exit 2
"${D[@]}" bash bench/detached.sh start r3 -- sleep 5 >/dev/null 2>&1
"${D[@]}" bash bench/detached.sh start r3 -- sleep 5 >"$T/e" 2>&1
[ $? -eq 2 ] && grep -q "already running" "$T/e" && ok || bad "a second start of r3: $(cat "$T/e")"
"${D[@]}" bash bench/detached.sh stop r3 >/dev/null 2>&1
for args in "start bad/name -- true" "wait r1 soon" "wait never 1" "frob r1" "start r4 --"; do
  # shellcheck disable=SC2086 # (the words of args)
  "${D[@]}" bash bench/detached.sh $args >"$T/e" 2>&1
  rc=$?
  [ $rc -eq 2 ] && [ "$(wc -l <"$T/e")" -eq 1 ] && grep -q "^bench/detached.sh: " "$T/e" && ok ||
    bad "'$args': exit $rc, $(cat "$T/e")"
done
finish
