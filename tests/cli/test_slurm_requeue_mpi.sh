#!/usr/bin/env bash
# examples/slurm/ on the CPU without Slurm (label mpi): each sbatch script runs as the batch shell would, in a
# faked Slurm environment (the job's SLURM_* variables; SLURM_PROCID=0 but no SLURM_STEP_ID, as in the batch
# shell), with stand-ins for srun (mpirun under the tasks' SLURM_* variables) and scontrol (records its
# arguments). Slurm's warning signal (SIGUSR1 to every task for train.sbatch; to the batch shell, which
# forwards it, for train_cpu.sbatch) mid-run makes every rank checkpoint and exit 75; the script then requeues
# its job; the "requeued" run of the same script resumes from that checkpoint and ends with the uninterrupted
# run's weights, byte for byte.
source "$(dirname "$0")/lib.sh" slurm_requeue_mpi "$@"
need_mpirun
EX=$(cd "$(dirname "$0")/../../examples/slurm" && pwd)
# --ckpt-every=0: the only checkpoint before the end is the signal's. The signal comes at about step 20 (50 ms
# of polling after it), so STEPS leaves a margin of 480 steps (a step here takes 1-2 ms on an idle machine,
# tens on a busy one); the three runs of 1,500 steps this took before spent minutes on a busy machine.
STEPS=500
args=(--layers=2 --heads=2 --dim=32 --seq=32 --batch=2 --total-batch=128 --eval-every=0 --threads=1 --quiet
  --log-every=1 --ckpt-every=0 --schedule=constant --warmup=0 --lr=1e-3 --device=cpu --seed=$((RANDOM + 1))
  --max-steps=$STEPS)

# the stand-ins
cat >"$T/srun" <<'EOS'
#!/usr/bin/env bash
# srun as seen by the tasks: srun's options dropped, SLURM_NTASKS tasks under mpirun, each with its step's
# SLURM_STEP_ID, SLURM_PROCID and SLURM_LOCALID (mpirun's own variables take precedence in kiln, env.c)
while [[ $1 == -* ]]; do shift; done
exec mpirun --bind-to none -np "$SLURM_NTASKS" sh -c \
  'SLURM_STEP_ID=0 SLURM_PROCID=$OMPI_COMM_WORLD_RANK SLURM_LOCALID=$OMPI_COMM_WORLD_LOCAL_RANK exec "$@"' sh "$@"
EOS
cat >"$T/scontrol" <<'EOS'
#!/usr/bin/env bash
echo "$*" >>"$REC_SCONTROL"
EOS
chmod +x "$T/srun" "$T/scontrol"
export KILN SRUN=$T/srun SCONTROL=$T/scontrol MPIRUN="mpirun"
# the batch shell's Slurm variables: job 4242 on one node, 2 tasks
slurm_env=(SLURM_JOB_ID=4242 SLURM_JOBID=4242 SLURM_JOB_NAME=kiln SLURM_NNODES=1 SLURM_NTASKS=2 SLURM_NPROCS=2
  SLURM_TASKS_PER_NODE=2 SLURM_JOB_NODELIST=localhost SLURM_NODELIST=localhost SLURM_NODEID=0 SLURM_PROCID=0
  SLURM_LOCALID=0)

# the uninterrupted run, 2 ranks
mpirun --bind-to none -np 2 "$KILN" train "${args[@]}" --out="$T/ref" >/dev/null 2>"$T/err" || bad "uninterrupted run failed: $(tail -3 "$T/err")"

# requeue_case NAME SCRIPT SIGNAL-TO: the first start, a signal mid-run, the requeue, the second start
requeue_case() {
  local name=$1 script=$2 to=$3 out=$T/run_$1
  export REC_SCONTROL=$T/$name.scontrol
  env "${slurm_env[@]}" "$script" "${args[@]}" --out="$out" >"$T/$name.log1" 2>&1 &
  local job=$!
  for _ in $(seq 600); do [ "$(cat "$out/metrics.jsonl" 2>/dev/null | wc -l)" -ge 20 ] && break; sleep 0.05; done
  local ranks
  ranks=$(pgrep -f -- "--out=$out" | while read -r p; do [ "$(cat /proc/$p/comm 2>/dev/null)" = kiln ] && echo $p; done)
  [ "$(echo $ranks | wc -w)" -eq 2 ] && ok || bad "$name: 2 kiln ranks expected mid-run, found: $ranks"
  if [ "$to" = tasks ]; then kill -USR1 $ranks; else kill -USR1 $job; fi # as Slurm's --signal does
  wait $job
  local rc=$?
  [ $rc -eq 0 ] && ok || bad "$name: the first start should exit 0 after requeueing, got $rc: $(tail -5 "$T/$name.log1")"
  [ "$(cat "$REC_SCONTROL" 2>/dev/null)" = "requeue 4242" ] && ok || bad "$name: scontrol was called with: $(cat "$REC_SCONTROL" 2>/dev/null)"
  grep -q "checkpoint saved on a signal; requeueing job 4242" "$T/$name.log1" && ok || bad "$name: no requeue message: $(cat "$T/$name.log1")"
  local ck
  ck=$(ls "$out/ckpt" 2>/dev/null | tail -1)
  [ -n "$ck" ] && [ "${ck#step_}" -lt $STEPS ] && [ ! -e "$out/model.safetensors" ] && ok ||
    bad "$name: a mid-run checkpoint expected, found '$ck'"
  # the requeued job: the same script, started again by Slurm
  rm -f "$REC_SCONTROL"
  env "${slurm_env[@]}" SLURM_RESTART_COUNT=1 "$script" "${args[@]}" --out="$out" >"$T/$name.log2" 2>&1
  rc=$?
  [ $rc -eq 0 ] && [ ! -e "$REC_SCONTROL" ] && ok || bad "$name: the requeued start exited $rc: $(tail -5 "$T/$name.log2")"
  grep -q "start 2" "$T/$name.log2" && grep -q "resuming from .*$ck" "$T/$name.log2" && ok ||
    bad "$name: the requeued start did not resume from $ck: $(head -5 "$T/$name.log2")"
  cmp -s "$T/ref/model.safetensors" "$out/model.safetensors" && ok ||
    bad "$name: the requeued run's weights differ from the uninterrupted run's"
}
requeue_case srun "$EX/train.sbatch" tasks
requeue_case cpu "$EX/train_cpu.sbatch" shell

# a failure is not requeued: the script exits with kiln's status
export REC_SCONTROL=$T/fail.scontrol
env "${slurm_env[@]}" "$EX/train.sbatch" "${args[@]}" --out="$T/fail" --zero=7 >"$T/fail.log" 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 75 ] && [ ! -e "$REC_SCONTROL" ] && ok || bad "a failed run: exit $rc, scontrol: $(cat "$REC_SCONTROL" 2>/dev/null)"
finish
