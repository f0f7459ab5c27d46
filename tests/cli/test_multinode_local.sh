#!/usr/bin/env bash
# kiln launch --nnodes across launchers on one host (127.0.0.1), with a small script as the ranks
# (KILN_LAUNCH_EXE): in env mode every node's ranks get RANK = node * N + i, WORLD_SIZE = nodes * N, their
# local rank and node 0's address with one port, found by node 0 for each start; a rank that fails on one node
# brings the other node's ranks down within seconds, and both launchers restart together (one restarts.jsonl
# line) and give up with the rank's status; a node that never arrives is named with its ranks by the nodes
# that did, within --rdzv-timeout; node 0 missing is named too; mpirun mode refuses two nodes at one address;
# bad flags. The real transport across two network namespaces is test_multinode.sh.
source "$(dirname "$0")/lib.sh" multinode_local "$@"

REC=$T/rec
export REC
cat >"$T/rank.sh" <<'EOS'
#!/usr/bin/env bash
echo "$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT $NODE $*" >>"$REC/ranks"
echo $$ >>"$REC/pids"
restarts=$(cat "$REC/run/restarts.jsonl" 2>/dev/null | wc -l)
case $BEHAVE in
ok) exit 0 ;;
crash) [ "$RANK" = 3 ] && [ "$restarts" = 0 ] && { sleep 0.5; exit 3; } ;; # the first start only
crash_always) [ "$RANK" = 3 ] && { sleep 0.5; exit 3; } ;;
esac
[ "$restarts" -ge 1 ] && exit 0
sleep 100 &
echo $! >>"$REC/pids"
wait
EOS
chmod +x "$T/rank.sh"
export KILN_LAUNCH_EXE=$T/rank.sh
targs=(--out="$REC/run" --max-steps=10)
# a port for the launchers' store: free now (bind port 0), distinct for each case below
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
alive() { kill -0 "$1" 2>/dev/null && ! grep -q '^[0-9]* (.*) Z ' "/proc/$1/stat" 2>/dev/null; }

# two_nodes BEHAVE LAUNCH-OPTIONS...: node 1 in the background, node 0 in front; sets rc0, rc1 and ms
two_nodes() {
  rm -rf "$REC" && mkdir -p "$REC/run"
  local p
  p=$(port)
  local t0=${EPOCHREALTIME/./}
  NODE=1 BEHAVE=$1 "$KILN" launch --mode=env --nnodes=2 --node-rank=1 --master-port="$p" "${@:2}" -- "${targs[@]}" 2>"$T/err1" &
  local pid1=$!
  NODE=0 BEHAVE=$1 "$KILN" launch --mode=env --nnodes=2 --node-rank=0 --master-port="$p" "${@:2}" -- "${targs[@]}" 2>"$T/err0"
  rc0=$?
  wait $pid1
  rc1=$?
  ms=$(((${EPOCHREALTIME/./} - t0) / 1000))
}

# the environment each rank gets
two_nodes ok --nproc-per-node=2
[ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] && ok || bad "two nodes, all ranks exit 0: $rc0 $rc1: $(cat "$T/err0" "$T/err1")"
# RANK WORLD LOCAL_RANK LOCAL_WORLD MASTER_ADDR NODE, for ranks 0..3
[ "$(awk '{print $1, $2, $3, $4, $5, $7}' "$REC/ranks" | sort | tr '\n' '|')" = \
  "0 4 0 2 127.0.0.1 0|1 4 1 2 127.0.0.1 0|2 4 0 2 127.0.0.1 1|3 4 1 2 127.0.0.1 1|" ] && ok ||
  bad "ranks' variables: $(cat "$REC/ranks")"
[ "$(cut -d' ' -f6 "$REC/ranks" | sort -u | wc -l)" -eq 1 ] && ok || bad "one MASTER_PORT for all nodes: $(cat "$REC/ranks")"
grep -q "all 2 nodes joined" "$T/err1" && ok || bad "node 1 should say that the nodes joined: $(cat "$T/err1")"

# rank 3 (node 1) exits 3: node 0's ranks are stopped too (they would sleep 100 s), both restart once together
two_nodes crash --nproc-per-node=2 --max-restarts=2 --backoff=0.1
[ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] && ok || bad "a crash on node 1, then a clean start: $rc0 $rc1: $(cat "$T/err0" "$T/err1")"
[ $ms -lt 15000 ] && ok || bad "the crash on node 1 took $ms ms to stop node 0"
grep -q "another node failed; stopping this node's 2 ranks" "$T/err0" && ok || bad "node 0 was not told: $(cat "$T/err0")"
[ "$(wc -l <"$REC/run/restarts.jsonl")" -eq 1 ] && grep -q '"rank":3,"exit_status":3' "$REC/run/restarts.jsonl" && ok ||
  bad "one restarts.jsonl line naming rank 3: $(cat "$REC/run/restarts.jsonl")"
[ "$(grep -c -- '--resume=auto$' "$REC/ranks")" -eq 4 ] && ok || bad "all 4 ranks restart with --resume=auto: $(cat "$REC/ranks")"
left=""
for p in $(cat "$REC/pids"); do alive "$p" && left="$left $p"; done
[ -z "$left" ] && ok || bad "processes left running: $left"
two_nodes crash_always --nproc-per-node=2 --max-restarts=0
[ $rc0 -eq 3 ] && [ $rc1 -eq 3 ] && ok || bad "give up: both launchers should exit 3: $rc0 $rc1"
grep -q "^error: rank 3 of 4 exited with status 3 (kiln launch): giving up" "$T/err0" && ok || bad "node 0's give-up line: $(cat "$T/err0")"

# a node that never arrives: the others name it and its ranks within --rdzv-timeout (3 nodes, node 2 missing)
rm -rf "$REC" && mkdir -p "$REC/run"
p=$(port)
t0=$(date +%s)
BEHAVE=ok "$KILN" launch --mode=env --nnodes=3 --node-rank=1 --nproc-per-node=2 --master-port="$p" --rdzv-timeout=3 -- "${targs[@]}" 2>"$T/err1" &
pid1=$!
BEHAVE=ok "$KILN" launch --mode=env --nnodes=3 --node-rank=0 --nproc-per-node=2 --master-port="$p" --rdzv-timeout=3 -- "${targs[@]}" 2>"$T/err0"
rc0=$?
wait $pid1
rc1=$?
[ $rc0 -eq 1 ] && [ $rc1 -eq 1 ] && [ $(($(date +%s) - t0)) -le 10 ] && ok || bad "missing node: exits $rc0 $rc1 after $(($(date +%s) - t0)) s"
for f in "$T/err0" "$T/err1"; do
  [ "$(grep -c '^error: ' "$f")" -eq 1 ] && grep -q "^error: node 2 (ranks 4-5) never arrived (kiln launch --nnodes=3 .*): 2 of 3 nodes joined in 3 s; start kiln launch --node-rank=2" "$f" && ok ||
    bad "missing node 2: $(cat "$f")"
done
[ ! -e "$REC/ranks" ] && ok || bad "ranks started without all nodes"
# node 0 never arrives
p=$(port)
BEHAVE=ok expect_error 1 "node 0 (ranks 0-1) never arrived (kiln launch --nnodes=2 --node-rank=1, store at 127.0.0.1:$p)" -- \
  launch --mode=env --nnodes=2 --node-rank=1 --nproc-per-node=2 --master-port="$p" --rdzv-timeout=1 -- "${targs[@]}"
grep -q "^error: node 0 (ranks 0-1) never arrived (kiln launch --nnodes=2 --node-rank=1, store at 127.0.0.1:[0-9]*): .*; start kiln launch --node-rank=0 on 127.0.0.1, or raise --rdzv-timeout$" "$T/err" && ok ||
  bad "node 0 missing: $(cat "$T/err")"

# mpirun mode: two nodes at one address cannot be told apart by mpirun
rm -rf "$REC" && mkdir -p "$REC/run"
p=$(port)
"$KILN" launch --mode=mpirun --nnodes=2 --node-rank=1 --master-port="$p" --rdzv-timeout=10 -- "${targs[@]}" 2>"$T/err1" &
pid1=$!
"$KILN" launch --mode=mpirun --nnodes=2 --node-rank=0 --master-port="$p" --rdzv-timeout=10 -- "${targs[@]}" 2>"$T/err0"
rc0=$?
wait $pid1
rc1=$?
[ $rc0 -eq 2 ] && [ $rc1 -eq 2 ] && grep -q "^error: nodes 0 and 1 are both at 127.0.0.1 (kiln launch --mode=mpirun --nnodes=2): .*; run each node's launcher on its own host, or use --mode=env$" "$T/err0" &&
  grep -q "^error: nodes 0 and 1 are both at 127.0.0.1" "$T/err1" && ok || bad "mpirun mode, one address: $rc0 $rc1: node 0: $(cat "$T/err0") node 1: $(cat "$T/err1")"

# bad flags: one line, exit 2
for flag in --nnodes=0 --nnodes=x --node-rank=-1 --rdzv-timeout=0; do
  name=${flag%%=*}
  expect_error 2 "^error: bad value '${flag#*=}' for ${name#--} (kiln launch $name): " -- launch "$flag" -- "${targs[@]}"
done
expect_error 2 "^error: bad value '2' for node-rank (kiln launch --node-rank): not below --nnodes" -- launch --nnodes=2 --node-rank=2 -- "${targs[@]}"
expect_error 2 "^error: bad value '1' for node-rank (kiln launch --node-rank): --node-rank needs --nnodes" -- launch --node-rank=1 -- "${targs[@]}"
finish
