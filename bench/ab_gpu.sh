#!/usr/bin/env bash
# A/B speed of two kiln trees on one GPU, in one call: the working tree (B) against another (A: a folder
# holding `git archive REF` of an earlier commit), built side by side, then timed in alternating order
# (A B A B ...) at the shapes the benchmarks track, so that the card's drift falls on both alike.
#   git archive 72bc6a2 | (mkdir -p .ab/ref && tar -x -C .ab/ref)    # on the machine that has the history
#   bash bench/ab_gpu.sh .ab/ref [ROUNDS]
# Prints one table: per shape, each tree's median ms/step over its rounds and B's change against A.
set -u
cd "$(dirname "$0")/.."
REF=${1:?usage: bench/ab_gpu.sh REF_TREE [ROUNDS]}
ROUNDS=${2:-2}
OUT=${OUT:-/tmp/kiln-ab}
LOGS=/tmp/kiln-ab-logs # one log a run: kept off $OUT, which takes few files; a failed run's tail goes to ab.txt
mkdir -p "$OUT" "$LOGS"
export NCCL_NVLS_ENABLE=0
# shellcheck source=bench/gpu_lib.sh
. bench/gpu_lib.sh
gpu_deps
build() { # tree, build dir, log
  (cd "$1" && cmake -S . -B "$2" -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA_ARCHS="${CUDA_ARCH:-90a}" >"$3" 2>&1 &&
    cmake --build "$2" -j "$(($(nproc) / 2))" -t kiln >>"$3" 2>&1)
}
t0=$(date +%s)
build "$REF" "$PWD/build-ab-a" "$OUT/build_a.log" &
pa=$!
build . "$PWD/build-ab-b" "$OUT/build_b.log" &
pb=$!
wait $pa || { tail -20 "$OUT/build_a.log"; exit 1; }
wait $pb || { tail -20 "$OUT/build_b.log"; exit 1; }
echo "builds: $(($(date +%s) - t0)) s"
SHAPES=("124m --preset=gpt2-124m --batch=32 --seq=1024"
  "1.3b --preset=gpt2-124m --layers=24 --dim=2048 --heads=16 --batch=8 --seq=1024"
  "llama-1b --preset=llama-1b --batch=4 --seq=2048")
median() { # metrics.jsonl -> median ms of steps 10 and on
  python3 -c "
import json, statistics, sys
ms = [json.loads(l)['ms'] for l in open(sys.argv[1])][10:]
print(f'{statistics.median(ms):.2f}')" "$1"
}
for s in "${SHAPES[@]}"; do
  set -- $s
  name=$1
  shift
  for r in $(seq "$ROUNDS"); do
    for t in a b; do
      dir=/tmp/ab_${t}_${name}_$r
      timeout 200 "build-ab-$t/kiln" train "$@" --data=random --max-steps=30 --warmup=10 --device=cuda \
        --eval-every=0 --checkpoint=0 --save-model=0 --quiet --out="$dir" >"$LOGS/${t}_${name}_$r.log" 2>&1 &&
        echo "$name $t $r $(median "$dir/metrics.jsonl")" >>"$OUT/ab.txt" ||
        echo "$name $t $r failed: $(tail -1 "$LOGS/${t}_${name}_$r.log")" >>"$OUT/ab.txt"
    done
  done
done
python3 - "$OUT/ab.txt" <<'PY'
import collections, statistics, sys
ms = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 4 and f[3] != "failed:":
        ms[(f[0], f[1])].append(float(f[3]))
    else:
        print("failed:", line.strip())
print("| shape | A ms/step (each round) | B ms/step (each round) | B vs A |")
print("| --- | --- | --- | --- |")
for name in dict.fromkeys(k[0] for k in ms):
    a, b = ms[(name, "a")], ms[(name, "b")]
    if a and b:
        d = statistics.median(b) / statistics.median(a) - 1
        print(f"| {name} | {statistics.median(a):.2f} ({', '.join(map(str, a))}) | "
              f"{statistics.median(b):.2f} ({', '.join(map(str, b))}) | {100 * d:+.2f}% |")
PY
