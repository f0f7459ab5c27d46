#!/usr/bin/env bash
# kiln info --strategies: each data-parallel strategy's per-rank GPU memory under each recompute mode. The
# table must agree with the per-rank plan kiln info prints for the same flags (which test_plan holds to
# measured runs), shrink as ZeRO shards more and as recompute keeps less, mark exactly the cells within the
# budget, and leave out what --offload=activations rules out.
source "$(dirname "$0")/lib.sh" info_strategies "$@"
m=(--preset=llama-1b --seq=2048 --block-size=2048 --batch=2)
KILN_MEM_BUDGET_MB=20000 "$KILN" info "${m[@]}" --world=4 --strategies >"$T/s4" 2>"$T/err" || bad "info --strategies: $(cat "$T/err")"
# ZeRO-3 without recompute, as the per-rank plan has it (GiB to 2 places there, 3 here)
"$KILN" info "${m[@]}" --world=4 --zero=3 --recompute=none >"$T/z3" 2>&1
python3 - "$T/s4" "$T/z3" <<'PY' >"$T/py" 2>&1 && ok || bad "the table: $(cat "$T/py")"
import re, sys
lines = open(sys.argv[1]).read().split("\nstrategies (cuda", 1)[1].splitlines()
m = re.search(r"KILN_MEM_BUDGET_MB's ([0-9.]+) GiB", lines[0])
assert m, "no budget in: " + lines[0]
budget = float(m.group(1))
names = ["DDP (--zero=0)", "ZeRO-1", "ZeRO-2", "ZeRO-3", "ZeRO-3 + optimizer offload"]
rows = {}
for l in lines[2:7]:
    name = next(n for n in names if l.strip().startswith(n) and not l.strip()[len(n):].startswith(" +"))
    cells = re.findall(r"([0-9.]+)(\*?)", l.strip()[len(name):])
    assert len(cells) == 6, l
    rows[name] = [(float(v), s == "*") for v, s in cells]
assert list(rows) == names, list(rows)
for n in names:
    gib = [v for v, _ in rows[n][:5]]
    assert all(a >= b for a, b in zip(gib, gib[1:])), f"{n}: recompute should keep less left to right: {gib}"
    for v, star in rows[n][:5]:
        assert star == (v <= budget + 0.005), f"{n}: {v} marked {star} against {budget}"
for k in range(5):
    col = [rows[n][k][0] for n in names]
    assert all(a >= b for a, b in zip(col, col[1:])), f"column {k}: ZeRO should hold less down the table: {col}"
    assert col[0] > col[3], f"column {k}: ZeRO-3 at 4 ranks holds no less than DDP"
host = [rows[n][5][0] for n in names]
assert host[4] > 0 and not any(host[:4]), f"optimizer host memory: {host}"
plan = re.search(r"per rank \(cuda[^\n]*\n(?:[^\n]*\n)*?\s*per rank: [0-9]+ bytes \(([0-9.]+) GiB\) on the gpu", open(sys.argv[2]).read())
assert plan, "no cuda per-rank plan"
assert abs(float(plan.group(1)) - rows["ZeRO-3"][0][0]) < 0.006, (plan.group(1), rows["ZeRO-3"][0])
PY
# --offload=activations: only selective and block
"$KILN" info "${m[@]}" --offload=activations --recompute=block --strategies >"$T/sa" 2>&1
grep -A7 '^strategies' "$T/sa" | grep '^  ZeRO-3  ' | grep -q -- ' - .* - .* - ' && ok ||
  bad "--offload=activations: none, act and mlp should be dashes: $(grep -A7 '^strategies' "$T/sa")"
# only kiln info takes it
"$KILN" train --strategies --max-steps=1 >"$T/o" 2>"$T/e" && bad "kiln train took --strategies" ||
  { grep -q "unknown option 'strategies'" "$T/e" && ok || bad "kiln train --strategies: $(cat "$T/e")"; }
finish
