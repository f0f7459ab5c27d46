#!/usr/bin/env bash
# The Hopper attention kernels' variants on one GPU, in one command: build, test_cuda_ops' wgmma and
# attention-block tests under a timeout each (a variant written without a GPU can hang on a barrier or a
# phase), attn_bench at long shapes, then a verdict: each variant's forward and backward time against the
# defaults' (the `wgmma` line) at every shape. A variant wins where it passed attn_bench's checks and is more
# than 1% faster at every shape; the fastest winner of the forward and of the backward go to
# $OUT/attn_choice.env (KILN_WGMMA_FWD, KILN_WGMMA_DQ), which a later command of the same machine sources
# (bench/long_context.sh then times them beside PyTorch). Logs in $OUT.
#   bash bench/attn_variants.sh ["B T NH HS"]...     (default: "1 32768 16 128" "1 65536 16 128")
#   bash bench/attn_variants.sh --verdict LOG        (the verdict alone, from attn_bench's output in LOG)
# KILN_SANITIZE="racecheck synccheck" also runs the wgmma tests under compute-sanitizer (KILN_SANITIZE_DQ=MODE:
# that KILN_WGMMA_DQ mode's tests alone, as test_cuda_ops' KILN_TEST_DQ).
# attn_bench's lines and what each variant sets (bench/cuda/attn_bench.cu): wgmma-ov KILN_WGMMA_FWD=overlap,
# wgmma-red KILN_WGMMA_DQ=red, wgmma-tma KILN_WGMMA_DQ=tma, wgmma-early KILN_WGMMA_DQ=tma-early,
# wgmma-early2 KILN_WGMMA_DQ=tma-early2, wgmma-dqf KILN_WGMMA_DQ=tma-dqfirst, wgmma-split
# KILN_WGMMA_DQ=tma-split (the `wgmma` line's KILN_WGMMA_DQ is the default, tma-dqpw).
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/kiln-attn}
mkdir -p "$OUT"

verdict() { # LOG: prints the table and the choice; writes $OUT/attn_choice.env
  python3 - "$1" "$OUT/attn_choice.env" <<'PY'
import re, sys
VARIANTS = {"wgmma-ov": ("fwd", "KILN_WGMMA_FWD=overlap"), "wgmma-red": ("bwd", "KILN_WGMMA_DQ=red"),
            "wgmma-tma": ("bwd", "KILN_WGMMA_DQ=tma"), "wgmma-early": ("bwd", "KILN_WGMMA_DQ=tma-early"),
            "wgmma-early2": ("bwd", "KILN_WGMMA_DQ=tma-early2"),
            "wgmma-dqf": ("bwd", "KILN_WGMMA_DQ=tma-dqfirst"),
            "wgmma-split": ("bwd", "KILN_WGMMA_DQ=tma-split")}
line = re.compile(r"B=(\d+) T=(\d+) NH=(\d+) NKV=\d+ HS=(\d+) \S+\s+(\S+)\s+fwd\s+([\d.]+) ms.*?bwd\s+([\d.]+) ms")
rows, failed = {}, set()
for l in open(sys.argv[1]):
    m = line.match(l)
    if not m:
        continue
    shape, name = "B=%s T=%s NH=%s HS=%s" % m.group(1, 2, 3, 4), m.group(5)
    rows[(shape, name)] = (float(m.group(6)), float(m.group(7)))
    if "CHECK-FAIL" in l:
        failed.add(name)
shapes = sorted({s for s, n in rows if n == "wgmma"}, key=lambda s: [int(x.split("=")[1]) for x in s.split()])
if not shapes:
    sys.exit(f"{sys.argv[1]}: no `wgmma` line (a build without 90a, or not an sm_90 GPU?)")
best = {}
for name, (part, env) in VARIANTS.items():
    i = 0 if part == "fwd" else 1
    speedups = [rows[(s, "wgmma")][i] / rows[(s, name)][i] for s in shapes if (s, name) in rows]
    if not speedups:
        continue
    wins = len(speedups) == len(shapes) and name not in failed and min(speedups) > 1.01
    print(f"{name:10s} {part}: x{min(speedups):.3f} to x{max(speedups):.3f} the default over {len(speedups)} "
          f"shape(s){', CHECK-FAIL' if name in failed else ''}{' -> wins' if wins else ''}")
    if wins and (part not in best or min(speedups) > best[part][0]):
        best[part] = (min(speedups), env)
with open(sys.argv[2], "w") as f:
    for part in ("fwd", "bwd"):
        if part in best:
            f.write(f"export {best[part][1]}\n")
print("choice:", " ".join(env for _, env in best.values()) or "the defaults")
PY
}

if [ "${1:-}" = --verdict ]; then
  [ $# -eq 2 ] && [ -r "$2" ] || { echo "bench/attn_variants.sh: --verdict needs a readable attn_bench log" >&2; exit 2; }
  verdict "$2"
  exit $?
fi
SHAPES=("$@")
[ ${#SHAPES[@]} -eq 0 ] && SHAPES=("1 32768 16 128" "1 65536 16 128")
for s in "${SHAPES[@]}"; do
  [[ $s =~ ^[1-9][0-9]*\ [1-9][0-9]*\ [1-9][0-9]*\ [1-9][0-9]*$ ]] ||
    { echo "bench/attn_variants.sh: shape '$s' is not \"B T NH HS\" (four whole numbers)" >&2; exit 2; }
done
export NCCL_NVLS_ENABLE=0
# shellcheck source=bench/gpu_lib.sh
. bench/gpu_lib.sh
gpu_deps
BUILD=${BUILD:-build-gpu}
t0=$(date +%s)
gpu_build kiln test_cuda_ops attn_bench
echo "build: ok in $(($(date +%s) - t0)) s"
for f in wgmma attention_block; do
  KILN_TEST_SKIP= KILN_SOURCE_DIR=$PWD KILN_TEST_FILTER="*$f*" timeout "${KILN_TEST_TIMEOUT:-170}" \
    "$BUILD/test_cuda_ops" >"$OUT/test_$f.log" 2>&1
  echo "test_cuda_ops *$f*: exit $? (124: timed out), $(grep -c PASS "$OUT/test_$f.log") PASS," \
    "$(grep -c FAIL "$OUT/test_$f.log") FAIL lines"
  grep -E "FAIL" "$OUT/test_$f.log" | head -6
done
# KILN_SANITIZE="racecheck synccheck": the wgmma tests again under compute-sanitizer (shared-memory hazards and
# barrier misuse a wrong answer may not show), each tool under its own timeout
for tool in ${KILN_SANITIZE:-}; do
  KILN_TEST_SKIP= KILN_SOURCE_DIR=$PWD KILN_TEST_FILTER="*wgmma*" KILN_TEST_DQ=${KILN_SANITIZE_DQ:-} \
    timeout "${KILN_SANITIZE_TIMEOUT:-240}" \
    compute-sanitizer --tool "$tool" "$BUILD/test_cuda_ops" >"$OUT/sanitize_$tool.log" 2>&1
  echo "compute-sanitizer --tool $tool, *wgmma*: exit $? (124: timed out);" \
    "$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/sanitize_$tool.log" | tail -1)"
done
: >"$OUT/attn.log"
for s in "${SHAPES[@]}"; do
  # shellcheck disable=SC2086 # (B T NH HS: four words)
  timeout 200 "$BUILD/attn_bench" $s >>"$OUT/attn.log" 2>&1
  echo "attn_bench $s: exit $?"
done
grep -E " wgmma" "$OUT/attn.log" | sed 's/  vs ref.*\(ok\|CHECK-FAIL\)$/ \1/'
verdict "$OUT/attn.log"
