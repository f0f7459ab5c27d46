#!/usr/bin/env python3
"""Sums up a KILN_TRACE_COMM trace (src/parallel/comm/comm_nccl.cu): for each kind of collective, the time the comm
stream spent on it, and the time the compute stream stood still waiting for it (the exposed part). What is
not exposed ran inside the compute's timeline. Operations that begin before SKIP ms (warm-up) are left out;
SKIP may be a share of the trace's length instead, as "25%".
  bench/overlap.py TRACE.csv [SKIP]"""
import collections
import csv
import sys

path = sys.argv[1]
skip_arg = sys.argv[2] if len(sys.argv) > 2 else "0"
if skip_arg.endswith("%"):
    length = max((float(r["comm_end_ms"]) for r in csv.DictReader(open(path))), default=0.0)
    skip = length * float(skip_arg[:-1]) / 100
else:
    skip = float(skip_arg)
busy, exposed, count = collections.Counter(), collections.Counter(), collections.Counter()
end = 0.0
for r in csv.DictReader(open(path)):
    b, e = float(r["comm_begin_ms"]), float(r["comm_end_ms"])
    end = max(end, e)
    if b < skip:
        continue
    busy[r["op"]] += e - b
    count[r["op"]] += 1
    if r["wait_begin_ms"]:
        exposed[r["op"]] += max(0.0, float(r["wait_end_ms"]) - float(r["wait_begin_ms"]))
for op in sorted(busy):
    hidden = 100 * (1 - exposed[op] / busy[op]) if busy[op] else 0
    print(f"trace {op}: {count[op]} ops, {busy[op]:.1f} ms on the comm stream, the compute stream waited "
          f"{exposed[op]:.1f} ms: {hidden:.1f}% hidden (of {end - skip:.0f} ms traced)")
