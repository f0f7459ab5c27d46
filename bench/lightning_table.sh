#!/usr/bin/env bash
# The minGPT/Lightning benchmark table, kiln beside PyTorch Lightning: the GPT-2 124M shape at character level
# (12 layers, 12 heads, 768 wide, block size 128, vocabulary 65 padded to 128) on Tiny Shakespeare, per GPU
# count and data-parallel strategy, at several micro-batch sizes a GPU. Writes DIR/lightning.csv and
# DIR/lightning.md (printed at the end); each run's log is in DIR/logs/.
#
#   bash bench/lightning_table.sh [--gpus=1,2,4] [--strategies=ddp,fsdp,fsdp-offload,fsdp-ac]
#                                 [--batch-sizes=64,256,1024] [--steps=10] [--warmup=3] [--out=DIR]
#                                 [--kiln=PATH] [--device=cuda|cpu] [--deadline=SECONDS]
#                                 [--torch-timeout=SECONDS] [--kiln-timeout=SECONDS] [--recompute=none]
#
# Rows: one per (GPUs, strategy, batch): GPU counts from --gpus (a count above the machine's `nvidia-smi -L`
# is skipped, and says so); strategies DDP, FSDP (ZeRO-3: parameters, gradients and optimizer state sharded),
# FSDP+offload and FSDP+AC (activation checkpointing, a block at a time); batch = sequences a GPU a step.
# Columns: for kiln, then for Lightning, the time per epoch, tokens/s (the whole job's) and peak GPU memory
# (rank 0's); then kiln ÷ Lightning tokens/s and kiln ÷ Lightning memory. A cell says "oom", "failed (its first
# error line)" or "skipped (why)" where a run did not give numbers.
#   kiln:      kiln train --preset=gpt2-124m --tokenizer=char --seq=128 --block-size=128 on its embedded Tiny
#              Shakespeare, --batch=B --total-batch=B*128*N (one micro-step), warmup + steps optimizer steps;
#              N > 1: kiln launch --nproc-per-node=N. DDP --zero=0 (one plain process at N=1), FSDP --zero=3,
#              FSDP+offload --zero=3 --offload=optimizer, FSDP+AC --zero=3 --recompute=block; the rows
#              without AC take --recompute=none (--recompute=MODE changes that), as Lightning keeps every
#              activation; at N=1 the ZeRO rows name --comm=nccl, which runs the data-parallel code at world
#              size 1. tokens/s: the median of metrics.jsonl's per-step rates after the warm-up steps.
#   Lightning: bench/lightning_gpt.py, one process (it starts the other ranks itself) per GPU count, every
#              strategy and batch size in turn in it (one that runs out of GPU memory ends it: the strategies
#              after it start again in another), capped at --torch-timeout seconds (default 240) each.
# --deadline: a run that would start later than this many seconds after the script's start is skipped (and
# says so in the table); the runs started before it are cut at it, so a time limit still leaves the table.
# --device=cpu: a smoke test of the kiln half (one process, N=1 only; no Lightning rows): e.g.
#   bash bench/lightning_table.sh --device=cpu --gpus=1 --batch-sizes=4 --steps=2 --warmup=1 --kiln=build-cpu/kiln
# Without --kiln: build-gpu/kiln, else build/kiln; on a GPU machine with neither, build-gpu is built here
# (bench/gpu_lib.sh, the kiln target only, for Hopper; its time counts against --deadline, and its log is
# DIR/build.log). On the GPU the libraries kiln links come from .debs (bench/gpu_lib.sh's gpu_deps) where the
# machine lacks them.
set -u
cd "$(dirname "$0")/.." || exit 2
SELF=bench/lightning_table.sh

die() { echo "error: $* " >&2; exit 2; }
GPUS=1,2,4 STRATS=ddp,fsdp,fsdp-offload,fsdp-ac BATCHES=64,256,1024 STEPS=10 WARMUP=3 OUT=/tmp/kiln-lightning KILN=""
DEVICE=cuda DEADLINE="" TORCH_TIMEOUT=240 KILN_TIMEOUT=180 RECOMPUTE=none
for a in "$@"; do
  case $a in
  --gpus=*) GPUS=${a#*=} ;;
  --strategies=*) STRATS=${a#*=} ;;
  --batch-sizes=*) BATCHES=${a#*=} ;;
  --steps=*) STEPS=${a#*=} ;;
  --warmup=*) WARMUP=${a#*=} ;;
  --out=*) OUT=${a#*=} ;;
  --kiln=*) KILN=${a#*=} ;;
  --device=*) DEVICE=${a#*=} ;;
  --deadline=*) DEADLINE=${a#*=} ;;
  --torch-timeout=*) TORCH_TIMEOUT=${a#*=} ;;
  --kiln-timeout=*) KILN_TIMEOUT=${a#*=} ;;
  --recompute=*) RECOMPUTE=${a#*=} ;;
  *) die "unknown option '$a' ($SELF): see the usage at the top of the script" ;;
  esac
done
case $DEVICE in cpu | cuda) ;; *) die "bad --device=$DEVICE ($SELF): cuda or cpu" ;; esac
[[ $GPUS =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || die "bad --gpus=$GPUS ($SELF): GPU counts, comma-separated, e.g. 1,2,4"
[[ $BATCHES =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || die "bad --batch-sizes=$BATCHES ($SELF): sequences a GPU, comma-separated, e.g. 64,256,1024"
[[ $STEPS =~ ^[1-9][0-9]*$ ]] || die "bad --steps=$STEPS ($SELF): a whole number >= 1"
[[ $WARMUP =~ ^[1-9][0-9]*$ ]] || die "bad --warmup=$WARMUP ($SELF): a whole number >= 1 (the steps before the timed ones)"
[ -z "$DEADLINE" ] || [[ $DEADLINE =~ ^[1-9][0-9]*$ ]] || die "bad --deadline=$DEADLINE ($SELF): seconds, a whole number >= 1"
[[ $TORCH_TIMEOUT =~ ^[1-9][0-9]*$ ]] || die "bad --torch-timeout=$TORCH_TIMEOUT ($SELF): seconds, a whole number >= 1"
[[ $KILN_TIMEOUT =~ ^[1-9][0-9]*$ ]] || die "bad --kiln-timeout=$KILN_TIMEOUT ($SELF): seconds, a whole number >= 1"
case $RECOMPUTE in none | act | mlp | selective | block) ;;
*) die "bad --recompute=$RECOMPUTE ($SELF): kiln's mode for the rows without AC: none, act, mlp, selective or block" ;;
esac
IFS=, read -ra gpu_list <<<"$GPUS"
IFS=, read -ra strat_list <<<"$STRATS"
# ascending and without repeats, as bench/lightning_gpt.py runs them
read -ra batch_list < <(tr , '\n' <<<"$BATCHES" | sort -n -u | tr '\n' ' ')
BATCHES=$(IFS=,; echo "${batch_list[*]}")
for s in "${strat_list[@]}"; do
  case $s in ddp | fsdp | fsdp-offload | fsdp-ac) ;;
  *) die "bad strategy '$s' in --strategies ($SELF): ddp, fsdp, fsdp-offload or fsdp-ac" ;;
  esac
done
mkdir -p "$OUT/logs" "$OUT/runs" || die "cannot create --out=$OUT ($SELF)"
OUT=$(cd "$OUT" && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0

PY_LD=${LD_LIBRARY_PATH:-} # Python runs with the machine's own library path
if [ "$DEVICE" = cuda ]; then
  # the libraries kiln links, unpacked from .debs where the GPU machine lacks them (their LD_LIBRARY_PATH too)
  # shellcheck source=bench/gpu_lib.sh
  . bench/gpu_lib.sh
  gpu_deps
fi
if [ -z "$KILN" ]; then
  for k in build-gpu/kiln build/kiln; do [ -x "$k" ] && KILN=$k && break; done
  if [ -z "$KILN" ] && [ "$DEVICE" = cuda ]; then
    BUILD=build-gpu
    t0=$SECONDS
    gpu_build kiln
    echo "built $BUILD/kiln in $((SECONDS - t0)) s"
    KILN=$BUILD/kiln
  fi
fi
{ [ -n "$KILN" ] && [ -x "$KILN" ]; } ||
  die "no kiln binary (${KILN:-build-gpu/kiln or build/kiln}): build it first (cmake -S . -B build && cmake --build build -t kiln), or pass --kiln=PATH"

T=128
TEXT_CHARS=$(wc -c <data/tinyshakespeare.txt)
EPOCH_TOKENS=$(((TEXT_CHARS - T) * T)) # minGPT CharDataset: every start position once
NOTES=()
n_gpus=0
if [ "$DEVICE" = cuda ]; then
  n_gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
else
  GPU_NAME="the CPU"
fi
PREC="bf16 mixed precision"
[ "$DEVICE" = cpu ] && PREC="fp32 (kiln on the CPU)"

# Lightning: python3 with a CUDA torch and lightning (or pytorch_lightning); DeepSpeed only for the note
LIGHTNING_OK=0 LIGHTNING_WHY=""
if [ "$DEVICE" = cpu ]; then
  LIGHTNING_WHY="--device=cpu, a smoke test of the kiln half"
elif ! command -v python3 >/dev/null; then
  LIGHTNING_WHY="no python3"
else
  LIGHTNING_WHY=$(LD_LIBRARY_PATH=$PY_LD python3 - <<'PY' 2>&1
import importlib.util as u
try:
    import torch
except ImportError as e:
    raise SystemExit(f"no PyTorch ({e})")
if not torch.cuda.is_available():
    raise SystemExit("torch sees no CUDA device")
if not (u.find_spec("lightning") or u.find_spec("pytorch_lightning")):
    raise SystemExit("PyTorch Lightning is not installed (pip install lightning)")
PY
  ) && LIGHTNING_OK=1
  LIGHTNING_WHY=$(tail -1 <<<"$LIGHTNING_WHY")
fi
if [ "$LIGHTNING_OK" = 1 ] && ! LD_LIBRARY_PATH=$PY_LD python3 -c 'import importlib.util as u, sys; sys.exit(0 if u.find_spec("deepspeed") else 1)' 2>/dev/null; then
  NOTES+=("DeepSpeed is not installed on this machine: its rows (ZeRO stage 3, stage 3 offload) are not run.")
elif [ "$LIGHTNING_OK" = 1 ]; then
  NOTES+=("DeepSpeed is installed, but this table does not run its rows (ZeRO stage 3, stage 3 offload).")
else
  NOTES+=("No Lightning rows: $LIGHTNING_WHY. DeepSpeed's rows (ZeRO stage 3, stage 3 offload) are not run either.")
fi

label() {
  case $1 in ddp) echo DDP ;; fsdp) echo FSDP ;; fsdp-offload) echo FSDP+offload ;; fsdp-ac) echo FSDP+AC ;; esac
}
# kiln_flags STRATEGY N: kiln's options for the strategy. At N=1 a ZeRO row names the transport, so that the
# data-parallel code runs at world size 1 (NCCL on the GPU as Lightning's process group; on the CPU the
# in-process one); DDP at N=1 is one plain process.
kiln_flags() {
  local comm=nccl rc=$RECOMPUTE
  [ "$DEVICE" = cpu ] && comm=single
  [ "$1" = fsdp-ac ] && rc=block
  case $1 in
  ddp) if [ "$2" -gt 1 ]; then echo "--comm=$comm --zero=0 --recompute=$rc"; else echo "--recompute=$rc"; fi ;;
  fsdp | fsdp-ac) echo "--comm=$comm --zero=3 --recompute=$rc" ;;
  fsdp-offload) echo "--comm=$comm --zero=3 --offload=optimizer --recompute=$rc" ;;
  esac
}

# the seconds a run may take: LIMIT capped by what is left before --deadline (0: none left)
limit_for() {
  local limit=$1
  if [ -n "$DEADLINE" ]; then
    local left=$((DEADLINE - SECONDS))
    [ "$left" -lt "$limit" ] && limit=$left
    [ "$limit" -lt 0 ] && limit=0
  fi
  echo "$limit"
}

# one line of a cell: no commas (the CSV) nor pipes (the markdown)
clean() { tr ',|\n' ';/ ' <<<"$1" | sed 's/  */ /g; s/ *$//' | cut -c1-160; }

# first_error LOG: the first line that names the failure
first_error() {
  local l
  l=$(grep -m1 -E '(^|[^A-Za-z_])error: |[A-Za-z_.]+(Error|Exception): ' "$1" 2>/dev/null)
  [ -z "$l" ] && l=$(grep -v '^\s*$' "$1" 2>/dev/null | tail -1)
  clean "${l:-no output}"
}

# kiln_stats METRICS: "tokens/s peak_bytes" — the median tokens/s of the steps after --warmup, the largest peak
kiln_stats() {
  awk -v warm="$WARMUP" '
    function num(k,   m) { if (match($0, "\"" k "\":[-0-9.eE+]+")) { m = substr($0, RSTART, RLENGTH); sub(/^[^:]*:/, "", m); return m } return "" }
    { st = num("step"); t = num("tokens_per_s"); p = num("peak_mem_bytes")
      if (p != "" && p + 0 > peak) peak = p + 0
      if (st != "" && st + 0 > warm && t != "") s[++m] = t + 0 }
    END {
      if (!m) exit 1
      for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (s[j] < s[i]) { x = s[i]; s[i] = s[j]; s[j] = x }
      printf "%.1f %.0f\n", m % 2 ? s[(m + 1) / 2] : (s[m / 2] + s[m / 2 + 1]) / 2, peak
    }' "$1"
}

declare -A K_ST K_TOK K_PEAK L_ST L_TOK L_PEAK
LVERS=""

# run_kiln N STRATEGY B: one kiln run; sets K_ST (ok, oom, failed (...), skipped (...)), K_TOK, K_PEAK
run_kiln() {
  local n=$1 s=$2 b=$3 key="$1,$2,$3"
  local tag="kiln_${n}gpu_${s}_b${b}"
  local dir="$OUT/runs/$tag" log="$OUT/logs/$tag.log"
  rm -rf "$dir"
  local limit
  limit=$(limit_for "$KILN_TIMEOUT")
  if [ "$limit" -lt 5 ]; then
    K_ST[$key]="skipped (past --deadline=$DEADLINE s)"
    echo "  kiln $(label "$s") batch $b: ${K_ST[$key]}"
    return
  fi
  local flags args
  read -ra flags < <(kiln_flags "$s" "$n")
  args=(--preset=gpt2-124m --tokenizer=char --seq="$T" --block-size="$T" --batch="$b" --total-batch="$((b * T * n))"
    --max-steps="$((WARMUP + STEPS))" --eval-every=0 --eval-steps=1 --checkpoint=0 --save-model=0 --log-every=1
    --quiet --out="$dir" --device="$DEVICE" "${flags[@]}")
  local t0=$SECONDS rc
  if [ "$n" -gt 1 ]; then
    timeout -k 10 "$limit" "$KILN" launch --nproc-per-node="$n" --max-restarts=0 -- "${args[@]}" >"$log" 2>&1
  else
    timeout -k 10 "$limit" "$KILN" train "${args[@]}" >"$log" 2>&1
  fi
  rc=$?
  local tok peak
  if grep -qi 'out of memory' "$log"; then
    K_ST[$key]=oom
  elif { [ "$rc" = 124 ] || [ "$rc" = 137 ]; } && [ "$limit" -lt "$KILN_TIMEOUT" ]; then
    K_ST[$key]="skipped (cut at --deadline=$DEADLINE s)"
  elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    K_ST[$key]="failed (timed out after $limit s)"
  elif [ "$rc" != 0 ] || [ ! -s "$dir/metrics.jsonl" ] || ! read -r tok peak < <(kiln_stats "$dir/metrics.jsonl"); then
    K_ST[$key]="failed (exit $rc: $(first_error "$log"))"
  else
    K_ST[$key]=ok K_TOK[$key]=$tok K_PEAK[$key]=$peak
  fi
  if [ "${K_ST[$key]}" = ok ]; then
    echo "  kiln $(label "$s") batch $b: $tok tok/s, peak $(awk -v p="$peak" 'BEGIN { printf "%.2f", p / 2^30 }') GiB ($((SECONDS - t0)) s)"
  else
    echo "  kiln $(label "$s") batch $b: ${K_ST[$key]} ($((SECONDS - t0)) s)"
  fi
}

# run_lightning N STRATEGY...: bench/lightning_gpt.py over the strategies and every batch size in one process
# (one start-up for all); sets L_ST, L_TOK, L_PEAK for each. A run out of GPU memory ends that process: the
# strategies after the one that ran out start again in a new one.
run_lightning() {
  local n=$1 s b key
  shift
  local todo=("$@")
  if [ "$LIGHTNING_OK" != 1 ]; then
    local why="no Lightning here"
    [ "$DEVICE" = cpu ] && why="--device=cpu"
    for s in "${todo[@]}"; do for b in "${batch_list[@]}"; do L_ST[$n,$s,$b]="skipped ($why)"; done; done
    return
  fi
  local part=0
  while [ ${#todo[@]} -gt 0 ]; do
    part=$((part + 1))
    local log="$OUT/logs/lightning_${n}gpu_$part.log" limit
    limit=$(limit_for "$TORCH_TIMEOUT")
    if [ "$limit" -lt 30 ]; then
      for s in "${todo[@]}"; do
        for b in "${batch_list[@]}"; do L_ST[$n,$s,$b]="skipped (past --deadline=$DEADLINE s)"; done
        echo "  Lightning $(label "$s"): skipped: past --deadline=$DEADLINE s"
      done
      return
    fi
    local t0=$SECONDS rc launch=() list
    list=$(IFS=,; echo "${todo[*]}")
    # its own process group (setsid), so that nothing it started outlives it: the ranks Lightning started and
    # their data-loader workers are killed with the group once the main process has gone
    command -v setsid >/dev/null && launch=(setsid -w)
    LD_LIBRARY_PATH=$PY_LD "${launch[@]}" timeout -k 10 "$limit" python3 bench/lightning_gpt.py --strategy="$list" \
      --devices="$n" --batch-sizes="$BATCHES" --steps="$STEPS" --warmup="$WARMUP" --seq=$T >"$log" 2>&1 &
    local pid=$!
    wait "$pid"
    rc=$?
    [ ${#launch[@]} -gt 0 ] && kill -KILL -- "-$pid" 2>/dev/null
    local line oom_at why next=()
    why=$(first_error "$log")
    for s in "${todo[@]}"; do
      oom_at=""
      # the process ran out of memory at an earlier strategy: this one never started, and goes again
      if [ "$rc" = 3 ] && ! grep -q "^{\"strategy\":\"$s\"," "$log"; then
        next+=("$s")
        continue
      fi
      for b in "${batch_list[@]}"; do
        key="$n,$s,$b"
        line=$(grep -m1 "^{\"strategy\":\"$s\",\"devices\":$n,\"batch\":${b}[,}]" "$log")
        if [[ $line == *'"error":"oom"'* ]]; then
          L_ST[$key]=oom
          oom_at=$b
        elif [[ $line == *'"tokens_per_s":'* ]]; then
          L_ST[$key]=ok
          L_TOK[$key]=$(sed -E 's/.*"tokens_per_s":([-0-9.eE+]+).*/\1/' <<<"$line")
          L_PEAK[$key]=$(sed -E 's/.*"peak_mem_bytes":([0-9]+).*/\1/' <<<"$line")
          [ -z "$LVERS" ] && LVERS=$(sed -E 's/.*"torch":"([^"]*)".*"lightning":"([^"]*)".*/torch \1, Lightning \2/' <<<"$line")
        elif [ -n "$oom_at" ]; then
          L_ST[$key]="skipped (oom at batch $oom_at)"
        elif { [ "$rc" = 124 ] || [ "$rc" = 137 ]; } && [ "$limit" -lt "$TORCH_TIMEOUT" ]; then
          L_ST[$key]="skipped (cut at --deadline=$DEADLINE s)"
        elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
          L_ST[$key]="failed (timed out after $limit s)"
        else
          L_ST[$key]="failed (exit $rc: $why)"
        fi
        if [ "${L_ST[$key]}" = ok ]; then
          echo "  Lightning $(label "$s") batch $b: ${L_TOK[$key]} tok/s, peak $(awk -v p="${L_PEAK[$key]}" 'BEGIN { printf "%.2f", p / 2^30 }') GiB"
        else
          echo "  Lightning $(label "$s") batch $b: ${L_ST[$key]}"
        fi
      done
    done
    echo "  (Lightning on $n GPU(s), ${todo[*]}: $((SECONDS - t0)) s, exit $rc)"
    todo=("${next[@]}")
  done
}

echo "kiln $KILN on $GPU_NAME$([ "$DEVICE" = cuda ] && echo " ($n_gpus GPUs)"), batches ${batch_list[*]} a GPU, $WARMUP + $STEPS steps, epoch $EPOCH_TOKENS tokens, out $OUT"
ROWS=()
for n in "${gpu_list[@]}"; do
  why=""
  if [ "$DEVICE" = cpu ] && [ "$n" -gt 1 ]; then
    why="--device=cpu runs one process only"
  elif [ "$DEVICE" = cuda ] && [ "$n" -gt "$n_gpus" ]; then
    why="the machine has $n_gpus GPU(s)"
  fi
  if [ -n "$why" ]; then
    echo "$n GPU(s): skipped: $why"
    NOTES+=("$n GPU(s) skipped: $why.")
    continue
  fi
  for s in "${strat_list[@]}"; do
    echo "$n GPU(s), kiln, $(label "$s"):"
    for b in "${batch_list[@]}"; do
      run_kiln "$n" "$s" "$b"
      ROWS+=("$n,$s,$b")
    done
  done
  echo "$n GPU(s), Lightning:"
  run_lightning "$n" "${strat_list[@]}"
done

# ---- the table ----------------------------------------------------------------------------------------------
CSV="$OUT/lightning.csv"
echo "gpus,strategy,batch_per_gpu,seq,epoch_tokens,kiln_status,kiln_epoch_s,kiln_tokens_per_s,kiln_peak_bytes,lightning_status,lightning_epoch_s,lightning_tokens_per_s,lightning_peak_bytes,kiln_over_lightning_tokens_per_s,kiln_over_lightning_memory" >"$CSV"
for key in "${ROWS[@]}"; do
  IFS=, read -r n s b <<<"$key"
  ks=$(clean "${K_ST[$key]:-failed (no result)}") ls=$(clean "${L_ST[$key]:-failed (no result)}")
  awk -v OFS=, -v n="$n" -v s="$(label "$s")" -v b="$b" -v t=$T -v e="$EPOCH_TOKENS" -v ks="$ks" -v kt="${K_TOK[$key]:-}" \
    -v kp="${K_PEAK[$key]:-}" -v ls="$ls" -v lt="${L_TOK[$key]:-}" -v lp="${L_PEAK[$key]:-}" 'BEGIN {
      ke = ks == "ok" && kt > 0 ? sprintf("%.1f", e / kt) : ""
      le = ls == "ok" && lt > 0 ? sprintf("%.1f", e / lt) : ""
      rt = ks == "ok" && ls == "ok" && lt > 0 ? sprintf("%.2f", kt / lt) : ""
      rm = ks == "ok" && ls == "ok" && lp > 0 ? sprintf("%.2f", kp / lp) : ""
      if (ks != "ok") kt = kp = ""
      if (ls != "ok") lt = lp = ""
      print n, s, b, t, e, ks, ke, kt, kp, ls, le, lt, lp, rt, rm
    }' >>"$CSV"
done

MD="$OUT/lightning.md"
{
  echo "GPT-2 124M shape at character level on Tiny Shakespeare (block size 128), kiln against PyTorch Lightning;"
  echo "$GPU_NAME, $(date -u +%Y-%m-%d), kiln $KILN${LVERS:+, $LVERS}, $PREC, $WARMUP warm-up + $STEPS timed steps."
  echo
  awk -F, '
    function hms(s) { return s == "" ? "" : (s >= 3600 ? sprintf("%.1f h", s / 3600) : (s >= 60 ? sprintf("%.1f min", s / 60) : sprintf("%.1f s", s))) }
    function gib(b) { return b == "" ? "" : sprintf("%.2f", b / 2^30) }
    function tok(t) { return t == "" ? "" : sprintf("%.0f", t) }
    NR == 1 { print "| GPUs | strategy | batch a GPU | kiln time per epoch | kiln tok/s | kiln peak GiB | Lightning time per epoch | Lightning tok/s | Lightning peak GiB | kiln ÷ Lightning tok/s | kiln ÷ Lightning memory |"
              print "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"; next }
    { printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3,
        $6 == "ok" ? hms($7) : $6, tok($8), gib($9), $10 == "ok" ? hms($11) : $10, tok($12), gib($13), $14, $15 }' "$CSV"
  echo
  echo "- An epoch, for both: minGPT CharDataset's over the whole text, (len(text) - 128) samples of 128 tokens ="
  echo "  ($TEXT_CHARS - 128) x 128 = $EPOCH_TOKENS tokens; time per epoch = epoch tokens / tokens/s (the whole job's, all GPUs)."
  echo "  kiln trains on its embedded copy of the same text and holds out the last 10% for validation, but the"
  echo "  epoch is defined the same way for both columns."
  echo "- kiln tokens/s: the median of metrics.jsonl's per-step tokens_per_s over the steps after the first $WARMUP."
  echo "  Lightning: $STEPS timed steps x batch x 128 x GPUs / their wall time, after $WARMUP untimed ones (the GPU"
  echo "  synchronized at each batch's end: data loading and Lightning's hooks included)."
  echo "- Peak memory: rank 0's; kiln's peak_mem_bytes, Lightning's torch.cuda.max_memory_allocated (neither counts"
  echo "  the CUDA context nor, for PyTorch, the caching allocator's unused reserve)."
  echo "- Strategies: DDP = kiln --zero=0 (one plain process at 1 GPU) / Lightning DDPStrategy; FSDP = kiln --zero=3 /"
  echo "  FSDPStrategy(sharding_strategy=\"FULL_SHARD\", auto_wrap_policy={Block}); FSDP+offload = kiln --zero=3"
  echo "  --offload=optimizer / the same with cpu_offload=True; FSDP+AC = kiln --zero=3 --recompute=block / the same"
  echo "  with activation_checkpointing_policy={Block}. kiln's rows without AC run --recompute=$RECOMPUTE, and at 1 GPU"
  echo "  its ZeRO rows run the data-parallel code at world size 1 (--comm=nccl on the GPU)."
  echo "- Offload differs: Lightning's FSDP with cpu_offload=True moves the parameters and the gradients to the"
  echo "  host too (the optimizer steps on the CPU, the weights are copied in for each use); kiln's --offload=optimizer"
  echo "  keeps the bf16 weights on the GPU and runs AdamW (fp32 master weights and moments) on the host."
  echo "- Lightning's bf16-mixed keeps fp32 parameters and computes under autocast (under FSDP the parameters are"
  echo "  all-gathered in fp32 and the gradients reduced in bf16); AdamW (betas 0.9, 0.95, weight decay 0.1), the"
  echo "  gradient norm clipped at 1.0 (through FSDP's clip_grad_norm_ under FSDP), no torch.compile."
  [ -n "$DEADLINE" ] && echo "- --deadline=$DEADLINE s: a run that would have started later says \"skipped\"."
  for note in "${NOTES[@]}"; do echo "- $note"; done
  echo "- Logs: $OUT/logs/; the CSV: $CSV."
} >"$MD"
echo
cat "$MD"
echo "wrote $MD and $CSV"
