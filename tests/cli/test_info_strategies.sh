#!/usr/bin/env bash
# kiln info --strategies: each data-parallel strategy's per-rank GPU memory under each recompute mode. The
# table must agree with the per-rank plan kiln info prints for the same flags (which test_plan holds to
# measured runs), shrink as ZeRO shards more and as recompute keeps less, mark exactly the cells within the
# budget, and leave out what --offload=activations rules out. Then kiln info --lengths, the same for
# sequence lengths (recompute modes and activation offload).
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

# --lengths: each length's plan under each recompute mode and with activation offload, as kiln info plans
# that length alone (--seq=T --block-size=T), growing with T, marked within the budget
l=(--preset=gpt2-124m --layers=4 --dim=256 --heads=4 --pos=rope --batch=1)
KILN_MEM_BUDGET_MB=900 "$KILN" info "${l[@]}" --lengths=2048,8192,32768 >"$T/l" 2>"$T/err" || bad "info --lengths: $(cat "$T/err")"
for t in 2048 32768; do
  for rc in none block; do
    "$KILN" info "${l[@]}" --seq=$t --block-size=$t --recompute=$rc | grep -o 'total on the GPU *[0-9.]*' |
      grep -o '[0-9.]*$' >"$T/one_${t}_$rc"
  done
  "$KILN" info "${l[@]}" --seq=$t --block-size=$t --recompute=block --offload=activations |
    grep -o 'total on the GPU *[0-9.]*' | grep -o '[0-9.]*$' >"$T/one_${t}_blockoff"
done
python3 - "$T" <<'PY' >"$T/py" 2>&1 && ok || bad "the lengths table: $(cat "$T/py")"
import re, sys
d = sys.argv[1]
text = open(d + "/l").read().split("\nlengths (cuda", 1)[1]
budget = float(re.search(r"KILN_MEM_BUDGET_MB's ([0-9.]+) GiB", text).group(1))
rows = {}
for l in text.splitlines()[2:5]:
    f = l.split()
    rows[int(f[0])] = [(float(v.rstrip("*")), v.endswith("*")) for v in f[1:8]] + [float(f[8]), float(f[9])]
assert sorted(rows) == [2048, 8192, 32768], rows
for t in (2048, 32768):  # none, block and block+offload (columns 0, 4, 6) as the single-length plans
    for col, name in ((0, "none"), (4, "block"), (6, "blockoff")):
        one = float(open(f"{d}/one_{t}_{name}").read())
        assert abs(one - rows[t][col][0]) < 0.006, (t, name, one, rows[t][col])
for col in range(7):
    v = [rows[t][col][0] for t in (2048, 8192, 32768)]
    assert v[0] < v[1] < v[2], f"column {col} should grow with T: {v}"
    for t in rows:
        assert rows[t][col][1] == (rows[t][col][0] <= budget + 0.005), (t, col, rows[t][col], budget)
assert all(rows[t][4][0] <= rows[t][0][0] for t in rows), "block above none"
assert rows[32768][7] > rows[2048][7] >= 0 and rows[32768][8] > 0, "offload's host memory"
PY
# a length the layout cannot split names why, and the others still print; bad lists are one line, exit 2
"$KILN" info "${l[@]}" --world=4 --sp=4 --sp-mode=ring --lengths=1001,1024 >"$T/lr" 2>&1
grep -q "^ *1001  (seq 1001 over sp 4" "$T/lr" && grep -qE "^ *1024 +[0-9]" "$T/lr" && ok ||
  bad "--lengths with a length the ring cannot split: $(grep -A3 '^lengths' "$T/lr")"
for v in "" "abc" "5," "0" "1,,2" "99999999999"; do
  "$KILN" info --preset=gpt2-124m --lengths="$v" >"$T/o" 2>"$T/e"
  rc=$?
  [ $rc -eq 2 ] && [ "$(wc -l <"$T/e")" -eq 1 ] && grep -q "for lengths (--lengths)" "$T/e" && ok ||
    bad "--lengths='$v': exit $rc, $(cat "$T/e")"
done
# --zero=auto (the default) says which level it took over several ranks, and why gradients travel in fp32
"$KILN" info --preset=gpt2-124m --world=4 >"$T/z" 2>&1
grep -q "^data parallelism: zero 1 (auto: ZeRO-1 over 4 data-parallel ranks" "$T/z" && grep -q "^per rank (cuda; zero 1, 4 ranks" "$T/z" &&
  grep -q "^gradients between ranks: fp32 (--reduce-dtype=bf16" "$T/z" && ok || bad "kiln info --world=4: $(grep -i 'zero\|between ranks' "$T/z")"
"$KILN" info --preset=gpt2-124m --world=4 --zero=0 --reduce-dtype=bf16 >"$T/z0" 2>&1
grep -q "^per rank (cuda; zero 0, 4 ranks" "$T/z0" && ! grep -q "^data parallelism:\|^gradients between ranks" "$T/z0" && ok ||
  bad "kiln info --world=4 --zero=0 --reduce-dtype=bf16: $(grep -i 'zero\|between ranks' "$T/z0")"
"$KILN" info --preset=gpt2-124m --world=4 --tp=4 >"$T/z4" 2>&1
grep -q "^per rank (cuda; zero 0, 4 ranks" "$T/z4" && ok || bad "kiln info --world=4 --tp=4: $(grep -i 'zero' "$T/z4")"
finish
