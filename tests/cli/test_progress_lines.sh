#!/usr/bin/env bash
# Long phases say what they do, also when stderr is a log file, and --quiet keeps them quiet: kiln tokenize
# names its inputs before the first batch, and a resume from a large checkpoint says what it reads before it
# reads and hashes it, and how long that took after.
source "$(dirname "$0")/lib.sh" progress "$@"
SRC=${KILN_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}

# 9 MB of text: more than one batch (8 MB), seconds of work
for _ in 1 2 3 4 5 6 7 8; do cat "$SRC/data/tinyshakespeare.txt"; done >"$T/big.txt"
"$KILN" tokenize --tokenizer=char --out="$T/tok" "$T/big.txt" >"$T/out" 2>"$T/err" || bad "tokenize: $(cat "$T/err")"
head -1 "$T/err" | grep -q "^tokenize: 1 input file, 8.9 MB, char tokenizer, [0-9]* threads\? -> $T/tok$" && ok ||
  bad "tokenize's first line does not say what it reads: $(head -1 "$T/err")"
"$KILN" tokenize --tokenizer=char --quiet --out="$T/tok" "$T/big.txt" >"$T/out" 2>"$T/err" || bad "tokenize --quiet failed"
[ ! -s "$T/err" ] && ok || bad "tokenize --quiet wrote: $(cat "$T/err")"

# a checkpoint of 74 MB (6.4M parameters: weights and AdamW's two moments in f32)
shape=(--layers=8 --dim=256 --heads=4 --batch=2 --seq=32 --eval-every=0 --eval-steps=1 --threads=2 --out="$T/run")
"$KILN" train "${shape[@]}" --max-steps=1 --quiet >"$T/out" 2>"$T/err" || bad "train: $(cat "$T/err")"
"$KILN" train "${shape[@]}" --max-steps=2 >"$T/out" 2>"$T/err" || bad "resume: $(cat "$T/err")"
read_line=$(grep -n '^kiln: reading checkpoint .*step_00000001 (0.0[78] GB): checking every file' "$T/err" | cut -d: -f1)
resumed=$(grep -n '^kiln: resuming from .*step_00000001 (step 1, read and verified in [0-9.]* s)' "$T/err" | cut -d: -f1)
[ -n "$read_line" ] && [ -n "$resumed" ] && [ "$read_line" -lt "$resumed" ] && ok ||
  bad "a resume does not say what it reads first and how long it took: $(head -3 "$T/err")"
"$KILN" train "${shape[@]}" --max-steps=3 --quiet >"$T/out" 2>"$T/err" || bad "resume --quiet: $(cat "$T/err")"
grep -q 'reading checkpoint' "$T/err" && bad "--quiet printed the reading line" || ok
finish
