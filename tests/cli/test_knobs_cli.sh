#!/usr/bin/env bash
# The KILN_* knobs as a user meets them: `kiln info --knobs` lists every one with its value, where the value
# came from and what it does; a bad value is refused at start-up in one line naming the variable (exit 2),
# before anything runs; an empty value is the default; and a knob read once at start-up reaches the layer
# that uses it.
source "$(dirname "$0")/lib.sh" knobs_cli "$@"
SRC=${KILN_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}

# a clean environment: no knob set (ctest sets KILN_SOURCE_DIR)
clean() { env -i PATH="$PATH" ${LD_LIBRARY_PATH:+LD_LIBRARY_PATH="$LD_LIBRARY_PATH"} "$@"; }

# every row of the table (src/run/knobs.c) is listed, once, at its default
names=$(grep -o '\.name = "KILN_[A-Z0-9_]*"' "$SRC/src/run/knobs.c" | grep -o 'KILN_[A-Z0-9_]*' | sort)
n=$(echo "$names" | wc -l)
[ "$n" -ge 20 ] && ok || bad "only $n knobs found in src/run/knobs.c's table"
clean "$KILN" info --knobs >"$T/knobs" 2>"$T/err" && ok || bad "kiln info --knobs: exit $?: $(cat "$T/err")"
[ ! -s "$T/err" ] && ok || bad "kiln info --knobs wrote to stderr: $(cat "$T/err")"
head -1 "$T/knobs" | grep -q '^knob  *value  *source  *read by  *what it does$' && ok ||
  bad "no header line: $(head -1 "$T/knobs")"
[ "$(tail -n +2 "$T/knobs" | awk '{print $1}' | sort)" = "$names" ] && ok ||
  bad "listed knobs differ from the table: $(diff <(tail -n +2 "$T/knobs" | awk '{print $1}' | sort) <(echo "$names"))"
[ "$(tail -n +2 "$T/knobs" | awk '$3 != "default"' | wc -l)" -eq 0 ] && ok ||
  bad "knobs not at their default in a clean environment: $(tail -n +2 "$T/knobs" | awk '$3 != "default" {print $1}')"
# each line: name, value, source, the layer that reads it, then its help and its values in brackets
awk 'NR > 1 && !($4 ~ /^(model|parallel\/dp|parallel\/tp|parallel\/comm|run\/[a-z_]+|backend\/cuda|data)$/ && NF > 6 && /\[.*\]$/)' \
  "$T/knobs" >"$T/odd"
[ ! -s "$T/odd" ] && ok || bad "lines without a layer, help or values: $(cat "$T/odd")"
grep -q '^KILN_ATTN  *wgmma  *default  *backend/cuda .*\[one of wgmma (the default), fa2, ref\]$' "$T/knobs" && ok ||
  bad "KILN_ATTN's line: $(grep '^KILN_ATTN ' "$T/knobs")"
grep -q '^KILN_MEM_BUDGET_MB  *unset  *default  *run/plan ' "$T/knobs" && ok ||
  bad "KILN_MEM_BUDGET_MB's line: $(grep '^KILN_MEM_BUDGET_MB ' "$T/knobs")"
# the documentation's table names every knob
for k in $names; do
  grep -q "^| \`$k\` |" "$SRC/docs/operations.md" || bad "$k is not in docs/operations.md's knob table"
done
ok

# values from the environment, and where they came from; an empty value is the default
clean KILN_ATTN=ref KILN_MEM_BUDGET_MB=512 KILN_ZERO_GATHER= "$KILN" info --knobs >"$T/set" 2>"$T/err" ||
  bad "kiln info --knobs with knobs set: $(cat "$T/err")"
grep -q '^KILN_ATTN  *ref  *environment ' "$T/set" && ok || bad "KILN_ATTN=ref: $(grep '^KILN_ATTN ' "$T/set")"
grep -q '^KILN_MEM_BUDGET_MB  *512  *environment ' "$T/set" && ok ||
  bad "KILN_MEM_BUDGET_MB=512: $(grep '^KILN_MEM_BUDGET_MB ' "$T/set")"
grep -q '^KILN_ZERO_GATHER  *overlap  *default ' "$T/set" && ok ||
  bad "KILN_ZERO_GATHER= (empty): $(grep '^KILN_ZERO_GATHER ' "$T/set")"
[ "$(tail -n +2 "$T/set" | awk '$3 == "environment"' | wc -l)" -eq 2 ] && ok ||
  bad "other knobs than the two set say environment: $(awk '$3 == "environment" {print $1}' "$T/set")"

# a bad value: refused by kiln train in one line naming the variable, exit 2, before anything runs
KILN_CLASSIFIER_ROWS=lots expect_error 2 \
  "^error: KILN_CLASSIFIER_ROWS=lots (environment): a whole number 0 to 1073741824; unset it for the default (0)" \
  -- train --max-steps=2 --out="$T/run"
[ ! -e "$T/run" ] && ok || bad "kiln train with a bad knob made its run directory"
KILN_ATTN=fast expect_error 2 "^error: KILN_ATTN=fast (environment): one of wgmma (the default), fa2, ref; " \
  -- train --max-steps=2 --device=cpu
KILN_PARALLEL_FUSED=yes expect_error 2 "^error: KILN_PARALLEL_FUSED=yes (environment): 0 or 1; " -- info
KILN_MEM_BUDGET_MB=lots expect_error 2 "^error: KILN_MEM_BUDGET_MB=lots (environment): a number above 0; " -- info --knobs
expect_error 2 "kiln info --knobs takes no other option" -- info --knobs --preset=gpt2-124m
# help works whatever the environment holds, and names --knobs
KILN_ATTN=fast "$KILN" help info >"$T/help" 2>"$T/err" && grep -q -- "--knobs" "$T/help" && [ ! -s "$T/err" ] && ok ||
  bad "kiln help info with a bad knob: $(cat "$T/err")"

# a knob reaches the layer that reads it: the LM head's chunk rows in kiln info's plan (run/tuning.c -> model)
rows() { "$@" info --preset=shakespeare-char | grep -m1 -o 'at most [0-9]* rows'; }
[ "$(rows clean "$KILN")" = "at most 2048 rows" ] && ok || bad "default chunk rows: $(rows clean "$KILN")"
[ "$(rows clean KILN_CLASSIFIER_ROWS=100 "$KILN")" = "at most 100 rows" ] && ok ||
  bad "KILN_CLASSIFIER_ROWS=100: $(rows clean KILN_CLASSIFIER_ROWS=100 "$KILN")"

finish
