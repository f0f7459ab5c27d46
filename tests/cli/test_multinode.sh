#!/usr/bin/env bash
# Multi-node rendezvous for real on one machine (root only): two "nodes", each a network namespace (a veth
# pair, 10.x addresses) with a hostname of its own (a UTS namespace, as two hosts have), each running
# `kiln launch --nnodes=2 --node-rank=i --nproc-per-node=2 --master-addr=NODE0`. On the CPU the ranks talk
# through MPI: node 0's mpirun reaches node 1 through kiln's rsh-agent relay. A 4-rank run follows the
# single-process trajectory (as test_dist_mpi.sh's mpirun run at 4 ranks); a rank SIGKILLed on node 1 brings
# both nodes down within seconds, leaving no process behind; a node that never arrives is named, with its
# ranks, within --rdzv-timeout.
source "$(dirname "$0")/lib.sh" multinode "$@"
if [ "$(id -u)" -ne 0 ]; then echo "not root: skipped (network namespaces need root)"; exit 77; fi
for c in ip unshare mpirun python3; do
  command -v $c >/dev/null || { echo "$c not found: skipped"; exit 77; }
done
NS=kmn$$
if ! ip netns add ${NS}a 2>/dev/null; then echo "ip netns unavailable: skipped"; exit 77; fi
cleanup() {
  for n in a b; do
    for p in $(ip netns pids ${NS}$n 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
    ip netns del ${NS}$n 2>/dev/null
  done
  rm -rf "$T"
}
trap cleanup EXIT
# 10.X.Y.0/24 from the pid, so that two runs of this test at once do not share a subnet
NET=10.$((200 + $$ % 50)).$(($$ / 50 % 250))
A=$NET.1
B=$NET.2
ip netns add ${NS}b && ip link add ${NS}va type veth peer name ${NS}vb &&
  ip link set ${NS}va netns ${NS}a && ip link set ${NS}vb netns ${NS}b &&
  ip -n ${NS}a addr add $A/24 dev ${NS}va && ip -n ${NS}b addr add $B/24 dev ${NS}vb &&
  ip -n ${NS}a link set ${NS}va up && ip -n ${NS}b link set ${NS}vb up &&
  ip -n ${NS}a link set lo up && ip -n ${NS}b link set lo up || { bad "cannot set up the namespaces"; finish; exit; }

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# on_node I COMMAND...: runs COMMAND on node I (its network namespace and hostname)
on_node() {
  local i=$1
  shift
  ip netns exec ${NS}$([ "$i" = 0 ] && echo a || echo b) unshare --uts sh -c 'hostname "$0"; exec "$@"' "kiln-node$i" "$@"
}
PORT=29400
# no launcher may outlive this (a hang must fail the test, not stall the suite); OpenMPI's launch steps go to
# the logs that a failure prints
LIMIT=150
export OMPI_MCA_plm_base_verbose=5
# two_nodes LAUNCH-AND-TRAIN-ARGS...: node 1 in the background, node 0 in front; sets rc0, rc1, s (seconds)
two_nodes() {
  PORT=$((PORT + 1))
  local t0=$(date +%s)
  on_node 1 timeout -k 10 $LIMIT "$KILN" launch --nnodes=2 --node-rank=1 --nproc-per-node=2 --master-addr=$A --master-port=$PORT "$@" \
    >"$T/out1" 2>"$T/err1" &
  local pid1=$!
  on_node 0 timeout -k 10 $LIMIT "$KILN" launch --nnodes=2 --node-rank=0 --nproc-per-node=2 --master-addr=$A --master-port=$PORT "$@" \
    >"$T/out0" 2>"$T/err0"
  rc0=$?
  wait $pid1
  rc1=$?
  s=$(($(date +%s) - t0))
  echo "$rc0 $rc1" >"$T/rcs" # for a caller that ran this in the background
}

args=(--layers=2 --heads=2 --dim=32 --seq=32 --batch=2 --total-batch=768 --eval-every=4 --eval-steps=4
  --threads=1 --quiet --log-every=1 --bucket-mb=0.02 --grad-clip=0.5 --schedule=constant --warmup=0 --lr=3e-3
  --seed=$((RANDOM + 1)) --device=cpu)
# 4 ranks on 2 nodes follow the single-process trajectory
"$KILN" train "${args[@]}" --max-steps=8 --out="$T/single" || bad "single-process run failed"
two_nodes --rdzv-timeout=60 --max-restarts=0 -- "${args[@]}" --max-steps=8 --out="$T/multi"
[ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] && ok || bad "2 nodes x 2 ranks: exits $rc0 $rc1: $(tail -5 "$T/err0") / $(tail -5 "$T/err1")"
grep -q "all 2 nodes joined at $A:$PORT" "$T/err1" && ok || bad "node 1 did not join: $(cat "$T/err1")"
same_run "$T/single" "$T/multi" 2e-5 && ok || bad "4 ranks on 2 nodes left the single-process trajectory"

rm -f "$T/rcs"
# a rank SIGKILLed on node 1: both nodes' launchers give up (--max-restarts=0) within seconds, nothing left
two_nodes --rdzv-timeout=60 --max-restarts=0 --grace=2 -- "${args[@]}" --max-steps=1000000 --out="$T/kill" &
job=$!
started=$(date +%s)
victim=""
for _ in $(seq 600); do
  # past the 10 s + grace after which node 0 would call a daemon that left gone (it must not: it stays)
  if [ -s "$T/kill/metrics.jsonl" ] && [ $(($(date +%s) - started)) -ge 14 ]; then
    victim=$(for p in $(ip netns pids ${NS}b); do
      [ "$(cat /proc/$p/comm 2>/dev/null)" = kiln ] && tr '\0' ' ' </proc/$p/cmdline | grep -q " train " && echo $p
    done | head -1)
    [ -n "$victim" ] && break
  fi
  sleep 0.1
done
[ -n "$victim" ] && ok || bad "no rank of the long run found on node 1: $(tail -40 "$T/err0") / $(tail -40 "$T/err1")"
# OpenMPI daemonizes the daemons it starts without tree spawn unless told to stay attached: a daemonizing
# daemon leaves the relayed command at once, which node 1's launcher ends, process group and all, maybe
# before the daemon has left the group (CI hung so)
grep "plm:rsh: final template argv" -A1 "$T/err0" | grep -q -- "--daemonize" &&
  bad "mpirun asks the daemons to daemonize: $(grep -A1 "final template argv" "$T/err0")" || ok
grep -q "mpirun is stuck" "$T/err0" && bad "node 0 stopped a healthy mpirun: $(tail -5 "$T/err0")" || ok
t0=$(date +%s)
[ -n "$victim" ] && kill -9 "$victim"
wait $job
read -r rc0 rc1 <"$T/rcs"
echo "a rank killed on node 1: both nodes down in $(($(date +%s) - t0)) s"
[ $(($(date +%s) - t0)) -le 30 ] && ok || bad "after a rank's SIGKILL on node 1 the nodes took $(($(date +%s) - t0)) s to stop"
[ $rc0 -ne 0 ] && [ $rc1 -ne 0 ] && ok || bad "a rank killed on node 1: launchers exited $rc0 (node 0) and $rc1 (node 1)"
grep -q "giving up after 0 restarts" "$T/err0" && ok || bad "node 0 should give up: $(tail -3 "$T/err0")"
sleep 1
left=$(for n in a b; do ip netns pids ${NS}$n; done)
[ -z "$left" ] && ok || bad "processes left in the namespaces: $(for p in $left; do tr '\0' ' ' </proc/$p/cmdline; echo; done)"

# an MPI daemon that ends without calling back (mpirun would wait for it forever): node 0 stops mpirun once
# the daemon has been gone for the grace period plus 10 s, and both nodes fail instead of hanging
cat >"$T/mpirun" <<'EOS'
#!/usr/bin/env bash
while [ $# -gt 0 ]; do
  case $1 in
  --host) hosts=$2; shift ;;
  --mca) [ "$2" = plm_rsh_agent ] && agent=$3; shift 2 ;;
  esac
  shift
done
h1=${hosts#*,}
$agent "${h1%%:*}" true
exec sleep 1000
EOS
chmod +x "$T/mpirun"
KILN_LAUNCH_MPIRUN=$T/mpirun two_nodes --rdzv-timeout=60 --max-restarts=0 --grace=1 -- "${args[@]}" --max-steps=8 \
  --out="$T/orphan"
[ $rc0 -ne 0 ] && [ $rc1 -ne 0 ] && [ $s -le 40 ] && ok || bad "a daemon gone without calling back: exits $rc0 $rc1 after $s s"
grep -q "the MPI daemon on node 1 (ranks 2-3) ended (status 0) 1[01] s ago and mpirun still waits for it: stopping mpirun" "$T/err0" &&
  ok || bad "node 0 should say that node 1's daemon is gone: $(tail -5 "$T/err0")"

# node 1 never arrives: node 0 names it and its ranks within --rdzv-timeout
PORT=$((PORT + 1))
t0=$(date +%s)
on_node 0 "$KILN" launch --nnodes=2 --node-rank=0 --nproc-per-node=2 --master-addr=$A --master-port=$PORT \
  --rdzv-timeout=3 -- "${args[@]}" --max-steps=8 --out="$T/lonely" 2>"$T/err"
rc=$?
[ $rc -eq 1 ] && [ $(($(date +%s) - t0)) -le 15 ] && ok || bad "node 1 missing: exit $rc after $(($(date +%s) - t0)) s"
[ "$(wc -l <"$T/err")" -eq 1 ] && grep -q "^error: node 1 (ranks 2-3) never arrived (kiln launch --nnodes=2 --node-rank=0, store at $A:$PORT): 1 of 2 nodes joined in 3 s; start kiln launch --node-rank=1 " "$T/err" &&
  ok || bad "node 1 missing: $(cat "$T/err")"
[ ! -e "$T/lonely/metrics.jsonl" ] && ok || bad "node 0 trained without node 1"
finish
