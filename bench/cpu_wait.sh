#!/usr/bin/env bash
# How kiln's OpenMP threads should wait between parallel regions, quiet and beside busy programs
# (docs/cpu_threads.md). Each variant trains the default model (shakespeare-char) for a few steps, start-up
# included, timed; the variants run in turn, ROUNDS rounds, first on the machine as it is, then beside BUSY
# processes (`yes >/dev/null`, stopped afterwards). Prints one line a run: phase, load average, variant, seconds, tok/s over the steps after the fifth.
#   bash bench/cpu_wait.sh [KILN] [STEPS] [ROUNDS] [BUSY]      defaults: build/kiln 60 3 2
set -u
cd "$(dirname "$0")/.." || exit 1
KILN=${1:-build/kiln} STEPS=${2:-60} ROUNDS=${3:-3} BUSY=${4:-2}
[ -x "$KILN" ] || {
  echo "bench/cpu_wait.sh: no kiln at $KILN (make build first, or give its path)" >&2
  exit 2
}
dir=$(mktemp -d)
busy=()
trap 'kill "${busy[@]}" 2>/dev/null; rm -rf "$dir"' EXIT

# name, then what it changes: an environment variable or a flag
variants=("spin GOMP_SPINCOUNT=300000" "passive OMP_WAIT_POLICY=passive" "kiln -" "threads1 --threads=1")

# tokens a second over the steps after the fifth (the steps' own times, evaluation excluded)
steady() {
  grep -o '"step":[0-9]*\|"ms":[0-9.]*\|"tokens":[0-9]*' "$1" | tr '\n' ' ' | sed 's/"step"/\n&/g' |
    awk -F'[: ]+' 'NF >= 6 && $2 > 5 { ms += $4; if (prev) tok += $6 - prev } NF >= 6 { prev = $6 }
                   END { if (ms > 0) printf "%.0f", tok / ms * 1000; else printf "?" }'
}

one() { # $1 label, $2 setting
  local envs=() flags=()
  case $2 in -) ;; --*) flags=("$2") ;; *) envs=("$2") ;; esac
  rm -rf "$dir/run"
  local s e
  s=$(date +%s.%N)
  env -u GOMP_SPINCOUNT -u OMP_WAIT_POLICY "${envs[@]}" "$KILN" train --out="$dir/run" --max-steps="$STEPS" \
    --checkpoint=0 --save-model=0 --quiet "${flags[@]}" >"$dir/out" 2>&1
  e=$(date +%s.%N)
  printf '%-6s load %-5s %-8s %6.1f s  %s\n' "$3" "$(cut -d' ' -f1 /proc/loadavg)" "$1" \
    "$(echo "$e - $s" | bc)" "$(steady "$dir/run/metrics.jsonl") tok/s"
}

for phase in quiet busy; do
  if [ "$phase" = busy ]; then
    for _ in $(seq "$BUSY"); do
      yes >/dev/null &
      busy+=($!)
    done
    sleep 1
  fi
  for _ in $(seq "$ROUNDS"); do
    for v in "${variants[@]}"; do
      one "${v%% *}" "${v#* }" "$phase"
    done
  done
done
