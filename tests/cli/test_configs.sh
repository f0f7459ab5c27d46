#!/usr/bin/env bash
# configs/: every shipped config parses, validates and plans (kiln info --config=F, at the world size its
# header runs it with), names how to run it, what data it needs and on what in its comment header, and the
# char demo trains from it. kiln info leads with the model, and shows the fault-injection options only with
# --all.
source "$(dirname "$0")/lib.sh" configs "$@"
SRC=${KILN_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}

n=0
for f in "$SRC"/configs/*.cfg; do
  [ -e "$f" ] || { bad "no configs in $SRC/configs"; break; }
  n=$((n + 1))
  rel=configs/$(basename "$f")
  for key in run data needs; do
    grep -q "^# $key: " "$f" && ok || bad "$rel: its header has no '# $key:' line"
  done
  grep -q -- "--config=$rel" "$f" && ok || bad "$rel: its run line does not name --config=$rel"
  # the world its run line starts: kiln launch --nproc-per-node=N plans N ranks
  world=$(grep -o -- '--nproc-per-node=[0-9]*' "$f" | head -1 | cut -d= -f2)
  for w in 1 ${world:-}; do
    if "$KILN" info --config="$f" --world="$w" >"$T/info" 2>"$T/err"; then ok; else
      bad "kiln info --config=$rel --world=$w: exit $?: $(cat "$T/err")"; continue; fi
    head -1 "$T/info" | grep -q '^model: ' && ok || bad "$rel: kiln info's first line is not the model: $(head -1 "$T/info")"
  done
  # what the header says about the vocabulary matches what kiln info computes
  if grep -q "Llama 3" "$f"; then
    grep -q "note: this preset copies a shape, not its vocabulary" "$T/info" && ok ||
      bad "$rel: kiln info does not say the preset trains with GPT-2's vocabulary"
  fi
done
[ "$n" -ge 7 ] && ok || bad "expected at least 7 configs, found $n"

# the char demo trains from its file (a config's values are overridden by flags)
"$KILN" train --config="$SRC/configs/shakespeare-char.cfg" --max-steps=2 --eval-every=0 --eval-steps=1 \
  --out="$T/char" --quiet >"$T/out" 2>"$T/err" && ok || bad "char demo from its config: $(tail -3 "$T/err")"
grep -q '^layers = 4$' "$T/char/config" && ok || bad "char demo: the run's config is not the file's"

# kiln info hides the fault injection unless asked
"$KILN" info >"$T/info" || bad "kiln info failed"
grep -q '^inject-' "$T/info" && bad "kiln info lists the fault-injection options" || ok
grep -q 'kiln info --all' "$T/info" && ok || bad "kiln info does not say how to see every option"
"$KILN" info --all | grep -q '^inject-nan = ' && ok || bad "kiln info --all does not list inject-nan"
finish
