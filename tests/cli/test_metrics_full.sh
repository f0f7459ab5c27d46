#!/usr/bin/env bash
# metrics.jsonl on a full disk: a run whose metrics stop fitting (the file size limit, `ulimit -f`, stands in
# for a full disk or a quota: the writes fail the same way) warns once on stderr, trains to its end and exits
# 0, and leaves no torn line behind: every line of metrics.jsonl parses and the file ends on a line boundary.
source "$(dirname "$0")/lib.sh" metrics_full "$@"
tiny=(--layers=1 --heads=2 --dim=16 --seq=16 --batch=2 --threads=1 --eval-every=0 --quiet --log-every=1
  --checkpoint=0 --save-model=0)
# SIGXFSZ ignored (an ignored signal stays ignored across exec): the write fails with EFBIG instead
(trap '' XFSZ; ulimit -f 16; exec "$KILN" train "${tiny[@]}" --max-steps=300 --out="$T/run") 2>"$T/err"
rc=$?
[ "$rc" -eq 0 ] && ok || bad "the run exited $rc: $(tail -3 "$T/err")"
n=$(grep -c "warning: cannot write $T/run/metrics.jsonl" "$T/err")
[ "$n" -eq 1 ] && ok || bad "$n warnings about metrics.jsonl, expected 1: $(cat "$T/err")"
lines=$(wc -l <"$T/run/metrics.jsonl")
[ "$lines" -gt 10 ] && [ "$lines" -lt 300 ] && ok || bad "metrics.jsonl has $lines lines: the limit did not bite"
python3 -c "import json, sys; [json.loads(l) for l in open(sys.argv[1])]" "$T/run/metrics.jsonl" 2>/dev/null && ok ||
  bad "a line of metrics.jsonl does not parse"
[ "$(tail -c 1 "$T/run/metrics.jsonl" | od -An -c | tr -d ' ')" = '\n' ] && ok ||
  bad "metrics.jsonl does not end on a line boundary: $(tail -c 80 "$T/run/metrics.jsonl")"
finish
