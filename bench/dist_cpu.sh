#!/usr/bin/env bash
# The comm layer on the CPU (docs/benchmarks.md): one process against two MPI ranks at the same global batch,
# one thread per rank, and the overlap: buckets reduced while the backward goes on (--bucket-mb small) against
# one bucket reduced after it (--bucket-mb large). Prints ms/step and the host's wait on reductions per step.
set -u
cd "$(dirname "$0")/.."
K=${KILN:-build/kiln}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
a=(--layers=6 --heads=6 --dim=384 --seq=128 --block-size=128 --batch=8 --total-batch=2048 --max-steps=25 --warmup=5
  --eval-every=0 --checkpoint=0 --quiet --log-every=1 --threads=1)
stat() { python3 - "$1" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][5:]
ms = statistics.median(r["ms"] for r in rows)
cw = rows[-1].get("comm_wait_ms")
per = (cw - rows[0].get("comm_wait_ms", 0)) / (len(rows) - 1) if cw is not None else float("nan")
print(f"{ms:.1f} ms/step, {2048 / ms * 1e3:.0f} tok/s, host waits on reductions {per:.2f} ms/step")
PY
}
"$K" train "${a[@]}" --out=/tmp/dc1 && echo "1 process:                 $(stat /tmp/dc1/metrics.jsonl)"
mpirun --oversubscribe --bind-to none -np 2 "$K" train "${a[@]}" --bucket-mb=1 --out=/tmp/dc2 &&
  echo "2 ranks, 1 MiB buckets:    $(stat /tmp/dc2/metrics.jsonl)"
mpirun --oversubscribe --bind-to none -np 2 "$K" train "${a[@]}" --bucket-mb=1000 --out=/tmp/dc3 &&
  echo "2 ranks, one bucket:       $(stat /tmp/dc3/metrics.jsonl)"
mpirun --oversubscribe --bind-to none -np 2 "$K" train "${a[@]}" --bucket-mb=1 --zero=2 --out=/tmp/dc4 &&
  echo "2 ranks, ZeRO-2, 1 MiB:    $(stat /tmp/dc4/metrics.jsonl)"
