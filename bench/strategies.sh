#!/usr/bin/env bash
# The strategy table (issue 14): each data-parallel strategy trained with the same global batch and seed, with
# and without activation recompute, and what it costs: time per epoch, tokens/s, peak device and host memory,
# and the final validation loss (which must agree across rows). Writes DIR/strategies.md, DIR/strategies.csv
# and DIR/strategies_MODEL.png (kiln plot --bars). docs/strategies.md shows the output and the commands.
#
#   bash bench/strategies.sh [--device=cpu|cuda] [--ranks=N] [--steps=N] [--out=DIR] [--models=a,b,c]
#                            [--recompute=none,block] [--torch=0|1] [--tol=LOSS] [--kiln=PATH]
#                            [--seq=T] [--global=TOKENS] [--deadline=SECONDS] [--torch-timeout=SECONDS]
# --deadline: a row that would start later than this many seconds after the script's start is skipped (and
# says so in the table), so that a run's time limit still leaves the table written; --torch-timeout caps
# each PyTorch row (600 s; compiling FSDP2 on 4 ranks takes a minute or more a row).
# models: a = shakespeare-char, b = gpt2-124m shape at char level (both on the embedded Tiny Shakespeare),
#         c = gpt2-350m on Gutenberg shards: KILN_GUTENBERG='DIR/train_*.bin' (kiln tokenize's output;
#             KILN_GUTENBERG_VAL defaults to the same glob with train_ -> val_), or KILN_GUTENBERG_TEXT=FILE
#             (the corpus as text or .txt.xz, ../shared/data/gutenberg_en_train.txt.xz: 34 MB, which a device
#             call can carry where the shards cannot), tokenized here first; skipped without either.
# Rows: one process (accumulating over the ranks' micro-batches), then DDP, ZeRO-1/2/3 and ZeRO-3 + offload on
# --ranks ranks (mpirun for N > 1; ranks share one GPU over --comm=mpi when the machine has fewer GPUs).
# --torch=1 (cuda, python3 with torch): bench/torch_fsdp.py for the rows that PyTorch has: one process (plain),
# DDP (DistributedDataParallel, several ranks), ZeRO-3 (FSDP2 fully_shard) and ZeRO-3 + offload (FSDP2 +
# CPUOffloadPolicy); several ranks under torchrun, a GPU each (so only where the machine has that many).
set -u
cd "$(dirname "$0")/.."
SELF="$PWD/bench/strategies.sh"

# ---- one rank's peak host memory ----------------------------------------------------------------------------
# Run by mpirun (or directly) as: strategies.sh --rank-wrap FILE CMD...: writes the peak resident KiB of CMD to
# FILE.RANK, from GNU time where installed, else from /proc/PID/status's VmHWM sampled while it runs.
if [ "${1:-}" = "--rank-wrap" ]; then
  file="$2.${OMPI_COMM_WORLD_RANK:-0}"
  shift 2
  if [ -x /usr/bin/time ]; then
    exec /usr/bin/time -f %M -o "$file" "$@"
  fi
  "$@" &
  pid=$! hwm=0
  while kill -0 "$pid" 2>/dev/null; do
    v=$(awk '/^VmHWM/ { print $2 }' "/proc/$pid/status" 2>/dev/null)
    [ -n "$v" ] && [ "$v" -gt "$hwm" ] && hwm=$v
    sleep 0.2
  done
  wait "$pid"
  rc=$?
  echo "$hwm" >"$file"
  exit "$rc"
fi

die() { echo "error: $* " >&2; exit 2; }
DEVICE=cpu RANKS=2 STEPS="" OUT=/tmp/kiln-strategies MODELS=a RECOMPUTE=none,block TORCH=0 TOL="" KILN="" SEQ="" GLOBAL=""
DEADLINE="" TORCH_TIMEOUT=600
for a in "$@"; do
  case $a in
  --device=*) DEVICE=${a#*=} ;;
  --ranks=*) RANKS=${a#*=} ;;
  --steps=*) STEPS=${a#*=} ;;
  --out=*) OUT=${a#*=} ;;
  --models=*) MODELS=${a#*=} ;;
  --recompute=*) RECOMPUTE=${a#*=} ;;
  --torch=*) TORCH=${a#*=} ;;
  --tol=*) TOL=${a#*=} ;;
  --kiln=*) KILN=${a#*=} ;;
  --seq=*) SEQ=${a#*=} ;;
  --global=*) GLOBAL=${a#*=} ;;
  --deadline=*) DEADLINE=${a#*=} ;;
  --torch-timeout=*) TORCH_TIMEOUT=${a#*=} ;;
  *) die "unknown option '$a' (bench/strategies.sh): see the usage at the top of the script" ;;
  esac
done
case $DEVICE in cpu | cuda) ;; *) die "bad --device=$DEVICE (bench/strategies.sh): cpu or cuda" ;; esac
[[ $RANKS =~ ^[1-9][0-9]*$ ]] || die "bad --ranks=$RANKS (bench/strategies.sh): a whole number >= 1"
[ -z "$STEPS" ] && { [ "$DEVICE" = cpu ] && STEPS=20 || STEPS=100; }
[[ $STEPS =~ ^[1-9][0-9]*$ ]] || die "bad --steps=$STEPS (bench/strategies.sh): a whole number >= 1"
[ -z "$DEADLINE" ] || [[ $DEADLINE =~ ^[1-9][0-9]*$ ]] || die "bad --deadline=$DEADLINE (bench/strategies.sh): seconds, a whole number >= 1"
[[ $TORCH_TIMEOUT =~ ^[1-9][0-9]*$ ]] || die "bad --torch-timeout=$TORCH_TIMEOUT (bench/strategies.sh): seconds, a whole number >= 1"
# Tolerance on the final validation loss. The CPU computes in fp32 and the strategies differ only in the order
# of the gradient sums (docs/distributed.md: 2e-6 after 12 steps), so 1e-3 is a wide margin that still catches
# a wrong gradient or a skipped shard. On the GPU the compute copy is bf16 (8 significant bits): a row
# with one micro-step keeps bf16 gradients and one that accumulates keeps fp32 ones (--grad-dtype=auto), so
# the rows round differently each step; 0.02 (about 1% of a char model's loss after a short run) allows that
# drift and still flags a strategy that trains a different model.
[ -z "$TOL" ] && { [ "$DEVICE" = cpu ] && TOL=0.001 || TOL=0.02; }
if [ -z "$KILN" ]; then
  for k in build/kiln build-gpu/kiln; do [ -x "$k" ] && KILN=$k && break; done
fi
[ -n "$KILN" ] && [ -x "$KILN" ] ||
  die "no kiln binary (${KILN:-build/kiln}): build it first (cmake -S . -B build && cmake --build build), or pass --kiln=PATH"
mkdir -p "$OUT" || die "cannot create --out=$OUT"
OUT=$(cd "$OUT" && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
[ "$RANKS" -gt 1 ] && ! command -v mpirun >/dev/null && die "--ranks=$RANKS needs mpirun (OpenMPI), which is not installed"

# How the ranks talk: MPI on the CPU; on GPUs NCCL with a GPU a rank, else MPI with the ranks sharing the GPUs
# (staged through host memory). At one rank, naming a transport runs the data-parallel code at world size 1.
n_gpus=0
[ "$DEVICE" = cuda ] && n_gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "$DEVICE" = cpu ]; then COMM=mpi; elif [ "$RANKS" -le "$n_gpus" ]; then COMM=nccl; else COMM=mpi; fi
THREADS=()
[ "$DEVICE" = cpu ] && THREADS=(--threads=1)

# Model c from text: kiln tokenize's GPT-2 BPE into shards under OUT (the last KILN_GUTENBERG_VAL_TOKENS,
# default 1M, held out).
if [[ ,$MODELS, == *,c,* ]] && [ -z "${KILN_GUTENBERG:-}" ] && [ -n "${KILN_GUTENBERG_TEXT:-}" ]; then
  t0=$(date +%s)
  "$KILN" tokenize --out="$OUT/gutenberg" --val-tokens="${KILN_GUTENBERG_VAL_TOKENS:-1000000}" --quiet "$KILN_GUTENBERG_TEXT" ||
    die "kiln tokenize $KILN_GUTENBERG_TEXT failed (bench/strategies.sh)"
  echo "model c: tokenized $KILN_GUTENBERG_TEXT in $(($(date +%s) - t0)) s"
  export KILN_GUTENBERG="$OUT/gutenberg/train_*.bin" KILN_GUTENBERG_VAL="$OUT/gutenberg/val_*.bin"
fi

# ---- the models ---------------------------------------------------------------------------------------------
# model_args MODEL: sets ARGS (kiln options), T, G (global batch in tokens), TRAIN_TOKENS (the epoch),
# VOCAB (padded, for PyTorch) and NAME; returns 1 with WHY set when the model cannot run here.
shakespeare_train_tokens() { # the embedded text's training split: one token a byte, the tail 10% held out
  awk -v n="$(wc -c <data/tinyshakespeare.txt)" 'BEGIN { printf "%d", n - int(n * 0.1) }'
}
model_args() {
  WHY=""
  case $1 in
  a)
    NAME=shakespeare-char ARGS=(--preset=shakespeare-char) VOCAB=128 TRAIN_TOKENS=$(shakespeare_train_tokens)
    if [ "$DEVICE" = cpu ]; then T=128 G=2048; else T=128 G=16384; fi ;; # (its block size is 128)
  b)
    NAME=gpt2-124m-char ARGS=(--preset=gpt2-124m --tokenizer=char) VOCAB=128 TRAIN_TOKENS=$(shakespeare_train_tokens)
    if [ "$DEVICE" = cpu ]; then T=64 G=256; else T=256 G=16384; fi ;;
  c)
    NAME=gpt2-350m-gutenberg
    [ -n "${KILN_GUTENBERG:-}" ] || { WHY="KILN_GUTENBERG (tokenized train shards) is not set"; return 1; }
    local val=${KILN_GUTENBERG_VAL:-${KILN_GUTENBERG//train_/val_}}
    ARGS=(--preset=gpt2-350m "--data=$KILN_GUTENBERG")
    [ "$val" != "$KILN_GUTENBERG" ] && ARGS+=("--val-data=$val")
    VOCAB=50304
    # an llm.c shard's header is 256 int32; the third is its token count
    TRAIN_TOKENS=0
    for f in $KILN_GUTENBERG; do
      [ -f "$f" ] || { WHY="no shard matches KILN_GUTENBERG=$KILN_GUTENBERG"; return 1; }
      TRAIN_TOKENS=$((TRAIN_TOKENS + $(od -An -tu4 -j8 -N4 "$f" | tr -d ' ')))
    done
    if [ "$DEVICE" = cpu ]; then T=128 G=256; else T=1024 G=16384; fi ;;
  *) die "bad model '$1' in --models (bench/strategies.sh): a, b or c" ;;
  esac
  [ -n "$SEQ" ] && T=$SEQ
  [ -n "$GLOBAL" ] && G=$GLOBAL
  if [ $((G % (T * RANKS))) -ne 0 ]; then
    WHY="the global batch $G is not a whole number of sequences of $T on each of $RANKS ranks"
    return 1
  fi
  B=$((G / (T * RANKS))) # each rank's micro-batch; the one-process row accumulates RANKS of them
  return 0
}

# ---- one row ------------------------------------------------------------------------------------------------
# stats METRICS: "tokens/s peak_bytes val_loss" — the median tokens/s after the first quarter of the steps (at
# most 5: start-up, compilation, allocator warm-up), the largest peak, the last validation loss.
stats() {
  awk '
    function num(k,   m) { if (match($0, "\"" k "\":[-0-9.eE+]+")) { m = substr($0, RSTART, RLENGTH); sub(/^[^:]*:/, "", m); return m } return "" }
    { n++; t[n] = num("tokens_per_s"); p = num("peak_mem_bytes"); if (p != "" && p + 0 > peak) peak = p + 0
      v = num("val_loss"); if (v != "") val = v }
    END {
      skip = int(n / 4); if (skip > 5) skip = 5
      m = 0; for (i = skip + 1; i <= n; i++) if (t[i] != "") s[++m] = t[i] + 0
      for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (s[j] < s[i]) { x = s[i]; s[i] = s[j]; s[j] = x }
      med = m ? (m % 2 ? s[(m + 1) / 2] : (s[m / 2] + s[m / 2 + 1]) / 2) : 0
      printf "%.1f %.0f %s\n", med, peak, val == "" ? "n/a" : val # (%d stops at 2^31 - 1 in mawk)
    }' "$1"
}

CSV="$OUT/strategies.csv"
echo "model,strategy,ranks,recompute,epoch_tokens,time_per_epoch_s,tokens_per_s,peak_device_bytes,peak_host_bytes,val_loss,torch_tokens_per_s,torch_peak_bytes,kiln_over_torch_tokens_per_s,kiln_over_torch_memory,status" >"$CSV"

# run_row MODEL STRATEGY RANKS RECOMPUTE kiln-options...: trains one row and appends it to the CSV
run_row() {
  local model=$1 strategy=$2 ranks=$3 rc_mode=$4
  shift 4
  local tag="${model}_${strategy}_${rc_mode}" dir="$OUT/runs/${model}_${strategy}_${rc_mode}"
  tag=${tag//+/_}
  dir=${dir//+/_}
  rm -rf "$dir" "$OUT/rss.$tag".*
  if [ -n "$DEADLINE" ] && [ "$SECONDS" -ge "$DEADLINE" ]; then
    echo "  $strategy ($rc_mode): skipped: past --deadline=$DEADLINE"
    echo "$model,$strategy,$ranks,$rc_mode,$TRAIN_TOKENS,,,,,,,,,,skipped" >>"$CSV"
    return
  fi
  local launch=()
  [ "$ranks" -gt 1 ] && launch=(mpirun --oversubscribe -np "$ranks")
  local t0=$SECONDS
  "${launch[@]}" bash "$SELF" --rank-wrap "$OUT/rss.$tag" "$KILN" train "${ARGS[@]}" --device="$DEVICE" \
    --seq="$T" --batch="$B" --total-batch="$G" --max-steps="$STEPS" --warmup=$((STEPS / 10)) \
    --recompute="$rc_mode" --eval-every=0 --eval-steps="$EVAL_STEPS" --checkpoint=0 --save-model=0 \
    --log-every=1 --quiet --out="$dir" "$@" >"$OUT/log.$tag" 2>&1
  local status=$?
  local tok peak val host=n/a epoch=n/a
  if [ "$status" -ne 0 ] || [ ! -s "$dir/metrics.jsonl" ]; then
    echo "  $strategy ($rc_mode): failed (exit $status): $(grep -m1 'error' "$OUT/log.$tag" || tail -1 "$OUT/log.$tag")"
    echo "$model,$strategy,$ranks,$rc_mode,$TRAIN_TOKENS,,,,,,,,,,failed" >>"$CSV"
    return
  fi
  read -r tok peak val < <(stats "$dir/metrics.jsonl")
  # the largest rank's peak resident memory, KiB -> bytes
  local kib
  kib=$(cat "$OUT/rss.$tag".* 2>/dev/null | awk '$1 ~ /^[0-9]+$/ && $1 > m { m = $1 } END { if (m) print m }')
  [ -n "$kib" ] && host=$((kib * 1024))
  epoch=$(awk -v n="$TRAIN_TOKENS" -v t="$tok" 'BEGIN { if (t > 0) printf "%.1f", n / t; else print "n/a" }')
  echo "  $strategy ($rc_mode, $ranks rank$([ "$ranks" -gt 1 ] && echo s)): $tok tok/s, val loss $val, $((SECONDS - t0)) s"
  local torch_cols=",,,"
  if [ "$TORCH_OK" = 1 ] && [ -n "${TORCH_ROW[$strategy]:-}" ] && { [ "$ranks" = 1 ] || [ "$ranks" -le "$n_gpus" ]; } &&
    { [ "$strategy" != DDP ] || [ "$ranks" -gt 1 ]; }; then
    torch_cols=$(torch_row "$strategy" "$rc_mode" "$tok" "$peak" "$ranks")
  fi
  echo "$model,$strategy,$ranks,$rc_mode,$TRAIN_TOKENS,$epoch,$tok,$peak,$host,$val,$torch_cols,ok" >>"$CSV"
}

# ---- PyTorch ------------------------------------------------------------------------------------------------
declare -A TORCH_ROW=([one-process]="--fsdp=0" [DDP]="--fsdp=0" [ZeRO-3]="--fsdp=1"
  [ZeRO-3+offload]="--fsdp=1 --offload=1")
TORCH_OK=0
if [ "$TORCH" = 1 ]; then
  if [ "$DEVICE" != cuda ]; then
    echo "note: --torch=1 compares on the GPU only (--device=cuda); no PyTorch rows"
  elif ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "note: python3 with a CUDA torch is not available; no PyTorch rows"
  else
    TORCH_OK=1
  fi
fi
# torch_row STRATEGY RECOMPUTE KILN_TOK KILN_PEAK RANKS: "tok/s,peak,kiln/torch tok/s,kiln/torch memory", tok/s
# over all the ranks (torch_fsdp.py reports one rank's) and the peak of one rank, as kiln's columns are
torch_row() {
  local log="$OUT/torch.${MODEL}_${1//+/_}_$2.log" ckpt=0 n=${5:-1} run=(python3)
  [ "$2" = block ] && ckpt=1
  [ "$n" -gt 1 ] && run=(torchrun --standalone --nproc-per-node="$n")
  local limit=$TORCH_TIMEOUT
  [ -n "$DEADLINE" ] && [ $((DEADLINE - SECONDS)) -lt "$limit" ] && limit=$((DEADLINE - SECONDS))
  if [ "$limit" -lt 30 ]; then
    echo "    PyTorch $1 ($2): skipped: past --deadline=$DEADLINE" >&2
    echo ",,,"
    return
  fi
  # shellcheck disable=SC2086
  timeout -k 10 "$limit" "${run[@]}" bench/torch_fsdp.py --layers="$TL" --heads="$TH" --dim="$TD" --vocab="$VOCAB" --seq="$T" \
    --batch="$B" --accum=$((G / (T * B * n))) --steps="$STEPS" --ckpt="$ckpt" ${TORCH_ROW[$1]} >"$log" 2>&1
  local line
  line=$(grep '^{' "$log" | tail -1)
  if [ -z "$line" ]; then
    # (the first Python error names the cause, "[rank0]: " before it under torchrun, whose own banners and
    # ChildFailedError come after)
    echo "    PyTorch $1 ($2): failed: $(grep -m1 -E '[A-Za-z_.]+(Error|Exception): ' "$log" || tail -1 "$log")" >&2
    echo ",,,"
    return
  fi
  python3 - "$line" "$3" "$4" "$n" <<'PY'
import json, sys
r = json.loads(sys.argv[1]); k_tok, k_peak, n = float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
tok = r["tokens_per_s"] * n
print(f'{tok},{r["peak_mem_bytes"]},{k_tok / tok:.2f},{k_peak / r["peak_mem_bytes"]:.2f}')
print(f'    PyTorch: {tok:.1f} tok/s, kiln {k_tok / tok:.2f}x', file=sys.stderr)
PY
}

# ---- the table ----------------------------------------------------------------------------------------------
IFS=, read -ra model_list <<<"$MODELS"
IFS=, read -ra rc_list <<<"$RECOMPUTE"
STRATEGIES=(one-process DDP ZeRO-1 ZeRO-2 ZeRO-3 ZeRO-3+offload)
strategy_args() { # kiln options of a strategy (the one-process row takes none)
  case $1 in
  one-process) ;;
  DDP) echo "--comm=$COMM --zero=0" ;;
  ZeRO-1) echo "--comm=$COMM --zero=1" ;;
  ZeRO-2) echo "--comm=$COMM --zero=2" ;;
  ZeRO-3) echo "--comm=$COMM --zero=3" ;;
  ZeRO-3+offload) echo "--comm=$COMM --zero=3 --offload=optimizer" ;;
  esac
}
# a single CPU process with --comm=mpi would need mpirun; at one rank the CPU rows use the in-process transport
[ "$DEVICE" = cpu ] && [ "$RANKS" = 1 ] && COMM=single
NOTES=()
echo "kiln $KILN, $DEVICE, $RANKS rank(s) over $COMM, $STEPS steps, out $OUT"
for MODEL in "${model_list[@]}"; do
  if ! model_args "$MODEL"; then
    NOTES+=("model $MODEL ($NAME) skipped: $WHY")
    echo "model $MODEL ($NAME): skipped: $WHY"
    continue
  fi
  EVAL_STEPS=$([ "$DEVICE" = cpu ] && echo 4 || echo 20)
  # the shape, for PyTorch, from what kiln resolved
  cfgtxt=$("$KILN" info "${ARGS[@]}" --seq="$T" 2>/dev/null)
  TL=$(awk '$1 == "layers" { print $3 }' <<<"$cfgtxt") TH=$(awk '$1 == "heads" { print $3 }' <<<"$cfgtxt")
  TD=$(awk '$1 == "dim" { print $3 }' <<<"$cfgtxt")
  echo "model $MODEL ($NAME): seq $T, global batch $G tokens ($B a micro-batch), an epoch $TRAIN_TOKENS tokens"
  for rc_mode in "${rc_list[@]}"; do
    for s in "${STRATEGIES[@]}"; do
      ranks=$RANKS threads=("${THREADS[@]}")
      if [ "$s" = one-process ]; then
        ranks=1
        [ "$DEVICE" = cpu ] && threads=(--threads="$RANKS") # the same cores as the ranks
      fi
      # shellcheck disable=SC2046
      run_row "$MODEL" "$s" "$ranks" "$rc_mode" $(strategy_args "$s") "${threads[@]}"
    done
  done
  awk -F, -v m="$MODEL" 'NR == 1 || $1 == m' "$CSV" >"$OUT/strategies_$MODEL.csv"
  "$KILN" plot --bars="$OUT/strategies_$MODEL.csv" --label=strategy --series=recompute \
    --panels=tokens_per_s,peak_device_bytes,peak_host_bytes --out="$OUT/strategies_$MODEL.png" >/dev/null 2>"$OUT/plot.err" ||
    NOTES+=("no chart for model $MODEL: $(cat "$OUT/plot.err")")
done

# The markdown table, and the validation losses' spread per model against the tolerance (against the median).
awk -F, -v tol="$TOL" -v torch="$TORCH_OK" '
  function gib(b) { return b == "" ? "n/a" : (b >= 2^30 ? sprintf("%.2f GiB", b / 2^30) : sprintf("%.0f MiB", b / 2^20)) }
  function hms(s) { return s == "" || s == "n/a" ? "n/a" : (s >= 3600 ? sprintf("%.1f h", s / 3600) : (s >= 60 ? sprintf("%.1f min", s / 60) : sprintf("%.1f s", s))) }
  NR == 1 { next }
  { row[++n] = $0; if ($15 == "ok" && $10 != "n/a") { k = ++nv[$1]; v[$1, k] = $10 } }
  END {
    for (m in nv) { # the median of the model'"'"'s losses
      c = nv[m]; for (i = 1; i <= c; i++) s[i] = v[m, i]
      for (i = 1; i <= c; i++) for (j = i + 1; j <= c; j++) if (s[j] < s[i]) { x = s[i]; s[i] = s[j]; s[j] = x }
      med[m] = c % 2 ? s[(c + 1) / 2] : (s[c / 2] + s[c / 2 + 1]) / 2
      lo[m] = s[1]; hi[m] = s[c]
    }
    hdr = "| model | strategy | ranks | recompute | time per epoch | tokens/s | peak device memory | peak host memory (per rank) | final val loss |"
    sep = "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    if (torch) { hdr = hdr " PyTorch tokens/s | PyTorch peak | kiln ÷ PyTorch tokens/s | kiln ÷ PyTorch memory |"; sep = sep " --- | --- | --- | --- |" }
    print hdr; print sep
    for (i = 1; i <= n; i++) {
      split(row[i], f, ",")
      if (f[15] != "ok") { printf "| %s | %s | %s | %s | %s | | | | |\n", f[1], f[2], f[3], f[4], f[15]; continue }
      flag = (f[10] != "n/a" && (f[10] - med[f[1]] > tol || med[f[1]] - f[10] > tol)) ? " **(off by more than " tol ")**" : ""
      if (flag != "") flagged++
      line = sprintf("| %s | %s | %s | %s | %s | %.0f | %s | %s | %s%s |", f[1], f[2], f[3], f[4], hms(f[6]), f[7], gib(f[8]), gib(f[9]), f[10], flag)
      if (torch) line = line sprintf(" %s | %s | %s | %s |", f[11] == "" ? "" : sprintf("%.0f", f[11]), f[12] == "" ? "" : gib(f[12]), f[13], f[14])
      print line
    }
    print ""
    for (m in nv) printf "Validation loss, model %s: spread %.6f (max - min over %d rows); tolerance %s against the median.\n", m, hi[m] - lo[m], nv[m], tol
    if (flagged) printf "%d row(s) off by more than the tolerance.\n", flagged
  }' "$CSV" >"$OUT/strategies.md"
{
  echo
  echo "An epoch is the training split: the embedded Tiny Shakespeare less its last 10% (one token a character),"
  echo "or the sum of the Gutenberg train shards' token counts; time per epoch = epoch tokens / tokens/s, and"
  echo "tokens/s is the median over the steps after the first quarter (at most 5). Peak device memory is the"
  echo "largest peak_mem_bytes of metrics.jsonl (rank 0's; on the CPU, kiln's counted allocations); peak host"
  echo "memory the largest rank's maximum resident set ($([ -x /usr/bin/time ] && echo "GNU time" || echo "VmHWM, sampled"))."
  for n in "${NOTES[@]}"; do echo "- $n"; done
} >>"$OUT/strategies.md"
echo
cat "$OUT/strategies.md"
echo "wrote $OUT/strategies.md, $CSV and the charts $OUT/strategies_*.png"
grep -q 'off by more than' "$OUT/strategies.md" && exit 1
exit 0
