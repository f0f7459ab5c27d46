#!/usr/bin/env bash
# Per-kernel time of one training step under Nsight Compute (H100 machine; needs ncu and the Firecracker runtime).
#   bash bench/profile_gpu.sh NAME kiln-train-args...
# Writes $OUT/prof_NAME.csv (raw) and prints the kernels of the last complete step, grouped, largest first,
# with the DRAM bandwidth each group reached (read + write bytes over its time, TB/s).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kiln-bench}
BUILD=${BUILD:-build-gpu}
name=$1
shift
timeout 500 ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv --page raw \
  --log-file "$OUT/prof_$name.csv" "$BUILD/kiln" train "$@" --data=random --max-steps=2 --warmup=1 --device=cuda \
  --eval-every=0 --checkpoint=0 --quiet --out="/tmp/prof_$name" >"$OUT/prof_$name.log" 2>&1 ||
  { echo "profile $name failed: $(tail -3 "$OUT/prof_$name.log")"; exit 1; }
python3 - "$OUT/prof_$name.csv" "$name" <<'PY'
import csv, sys, re, collections
rows = list(csv.reader(l for l in open(sys.argv[1]) if not l.startswith("==")))
hdr = rows[0]
ki, ti = hdr.index("Kernel Name"), hdr.index("gpu__time_duration.sum")
bi = [hdr.index(m) for m in ("dram__bytes_read.sum", "dram__bytes_write.sum") if m in hdr]
bunit = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}
ks = []
for r in rows[2:]:
    try:
        nb = sum(float(r[i].replace(",", "")) * bunit.get(rows[1][i], 1) for i in bi)
        ks.append((r[ki], float(r[ti].replace(",", "")), nb))
    except (ValueError, IndexError):
        pass
unit = rows[1][ti]
scale = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0}.get(unit, 1e-6)
# one step: the kernels after the second-to-last AdamW launch, through the last one
ad = [i for i, (n, _, _) in enumerate(ks) if "adamw" in n.lower()]
lo = ad[-2] + 1 if len(ad) >= 2 else 0
step = ks[lo:]
def short(n):
    n = re.sub(r"^void ", "", n)
    n = re.sub(r"\(.*", "", n)
    return n[:70]
g = collections.defaultdict(lambda: [0, 0.0, 0.0])
for n, t, nb in step:
    g[short(n)][0] += 1
    g[short(n)][1] += t * scale
    g[short(n)][2] += nb
tot = sum(v[1] for v in g.values())
print(f"## {sys.argv[2]}: {len(step)} kernels, {tot:.2f} ms of kernel time in one step (DRAM TB/s per group)")
for n, (c, t, nb) in sorted(g.items(), key=lambda kv: -kv[1][1])[:28]:
    print(f"{t:8.3f} ms {100*t/tot:5.1f}% x{c:<4d} {nb/(t*1e9) if t else 0:5.2f} {n}")
PY
