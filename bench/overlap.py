#!/usr/bin/env python3
"""How much of the communication stream's GPU time overlaps the compute stream's kernels, from `nsys stats
--report cuda_gpu_trace --format csv`: ZeRO-3's prefetched all-gathers should run inside the compute's
timeline. The compute stream is the one with the most kernels; work on any other stream (NCCL's kernels, or at
world size 1 its device-to-device copies) is communication."""
import bisect
import collections
import csv
import sys

rows = list(csv.DictReader(open(sys.argv[1])))
key = lambda prefix: next(k for k in rows[0] if k.startswith(prefix))
start_key, dur_key, stream_key = key("Start"), key("Duration"), key("Strm")
ops = []
for r in rows:
    try:
        s, d = float(r[start_key]), float(r[dur_key])
    except (ValueError, KeyError):
        continue
    ops.append((s, s + d, r[stream_key], r["Name"]))
kernels = collections.Counter(o[2] for o in ops if not o[3].startswith("[CUDA mem"))
compute_stream = kernels.most_common(1)[0][0]
compute = sorted((s, e) for s, e, st, n in ops if st == compute_stream and not n.startswith("[CUDA mem"))
comm = [(s, e, n) for s, e, st, n in ops if st != compute_stream and "HtoD" not in n and "DtoH" not in n]
merged = []
for s, e in compute:
    if merged and s <= merged[-1][1]:
        merged[-1][1] = max(merged[-1][1], e)
    else:
        merged.append([s, e])
starts = [m[0] for m in merged]
total = covered = 0.0
for s, e, _ in comm:
    total += e - s
    i = max(0, bisect.bisect_right(starts, s) - 1)
    while i < len(merged) and merged[i][0] < e:
        covered += max(0.0, min(e, merged[i][1]) - max(s, merged[i][0]))
        i += 1
kinds = collections.Counter("nccl kernel" if "nccl" in n.lower() else n.split("]")[0].strip("[") for _, _, n in comm)
print(f"trace: {len(comm)} operations off the compute stream ({dict(kinds)}), {total / 1e6:.1f} ms in all; "
      f"{100 * covered / total if total else 0:.1f}% of that time overlaps compute kernels "
      f"({len(compute)} kernels, {sum(e - s for s, e in compute) / 1e6:.1f} ms)")
