"""Summary of an Nsight Compute raw CSV (ncu --csv --page raw, bench/profile_attn.sh): per profiled kernel,
its time, throughputs, tensor-pipe use, issue activity, and the warp stall reasons that cost the most
(cycles a warp spends stalled per issued instruction, by reason). Metrics a section did not collect are
left out, so that the summary does not depend on ncu's version.

    python3 bench/profile_attn_summary.py FILE.csv [TOP (10)]
"""
import csv
import re
import sys


def rows_of(path):
    # the profiled program's own output comes first, and ncu's notes start with "=="; the CSV begins at "ID"
    lines = [l for l in open(path, errors="replace") if not l.startswith("==")]
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), len(lines))
    rows = list(csv.reader(lines[start:]))
    if len(rows) < 3:
        sys.exit(f"{path}: no profiled kernel (is the kernel regex right?)")
    return rows[0], rows[1], rows[2:]


def number(s):
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return None


# what to show, by metric name (a prefix match), in order
HEADLINE = [
    ("gpu__time_duration.sum", "time"),
    ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "SM throughput %"),
    ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed", "memory throughput %"),
    ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "DRAM throughput %"),
    ("lts__throughput.avg.pct_of_peak_sustained_elapsed", "L2 throughput %"),
    ("sm__inst_executed_pipe_tensor_op_gmma", "tensor (gmma) pipe"),
    ("sm__pipe_tensor_op_gmma_cycles_active", "tensor (gmma) pipe cycles"),
    ("smsp__issue_active.avg.pct_of_peak_sustained_active", "issue slots busy %"),
    ("smsp__warps_eligible.avg.per_cycle_active", "eligible warps a cycle"),
    ("sm__warps_active.avg.pct_of_peak_sustained_active", "achieved occupancy %"),
    ("launch__registers_per_thread", "registers a thread"),
]
STALL = re.compile(r"smsp__average_warp(s|_latency)_issue_stalled_(\w+?)(_per_issue_active)?\.ratio$")


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    hdr, units, data = rows_of(path)
    col = {h: i for i, h in enumerate(hdr)}
    name_i = col.get("Kernel Name")
    for r in data:
        if name_i is None or len(r) < len(hdr):
            continue
        kname = r[name_i]
        print(f"== {re.sub(r'[(].*', '', kname)}")  # the name and template arguments, not the parameters
        for prefix, label in HEADLINE:
            for h, i in col.items():
                # one figure a metric: the average's (not the max, min or sum over units, nor the _elapsed twin)
                if h.startswith(prefix) and not re.search(r"\.(max|min|sum)\.|_elapsed$", h[len(prefix):]):
                    v = number(r[i])
                    if v is not None:
                        print(f"  {label:28s} {v:12.3f} {units[i]:>8s}   ({h})")
        stalls = []
        for h, i in col.items():
            m = STALL.match(h)
            v = number(r[i])
            if m and v is not None and v > 0:
                stalls.append((v, m.group(2)))
        if stalls:
            total = sum(v for v, _ in stalls)
            print(f"  stalls (cycles a warp waits per issued instruction, {total:.2f} in all):")
            for v, reason in sorted(stalls, reverse=True)[:top]:
                print(f"    {reason:28s} {v:8.3f}  {100 * v / total:5.1f}%")


if __name__ == "__main__":
    main()
