#!/usr/bin/env bash
# Char shards train (issue 18, defect 5): kiln tokenize --tokenizer=char writes shards and a manifest with the
# vocabulary; kiln train --tokenizer=char --data=... takes the vocabulary from that manifest, and the run samples.
# A --data pattern that matches nothing says so (not "embedded text only"); shards without their manifest say
# what is missing.
source "$(dirname "$0")/lib.sh" char_shards "$@"
head -c 200000 "${KILN_SOURCE_DIR:-$(dirname "$0")/../..}/data/tinyshakespeare.txt" >"$T/t.txt" 2>/dev/null ||
  printf 'First Citizen:\nBefore we proceed any further, hear me speak.\n%.0s' $(seq 3000) >"$T/t.txt"
"$KILN" tokenize --tokenizer=char --out="$T/sh" --val-tokens=20000 "$T/t.txt" >/dev/null 2>"$T/err" ||
  bad "tokenize failed: $(cat "$T/err")"
run=(train --tokenizer=char --data="$T/sh/train_*.bin" --val-data="$T/sh/val_*.bin" --layers=1 --heads=2 --dim=32
  --seq=32 --batch=4 --max-steps=6 --eval-every=3 --eval-steps=2 --threads=1 --quiet)
"$KILN" "${run[@]}" --out="$T/run" 2>"$T/err" && ok || bad "training on char shards failed: $(cat "$T/err")"
grep -q '"val_loss":' "$T/run/metrics.jsonl" && ok || bad "no validation loss on the char val shards"
n=$(python3 -c "import json;print(len(json.load(open('$T/sh/manifest.json'))['tokenizer']['char_vocab']))")
[ "$(stat -c %s "$T/run/vocab.char")" -eq "$n" ] && ok || bad "vocab.char is not the manifest's $n characters"
"$KILN" sample --run="$T/run" --max-tokens=20 --device=cpu >/dev/null 2>"$T/err" && ok || bad "sample failed: $(cat "$T/err")"
expect_error 2 "no files match" -- train --data="$T/nope/*.bin" --max-steps=2 --quiet
mkdir -p "$T/bare" && cp "$T/sh/train_000000.bin" "$T/bare/"
expect_error 2 "manifest.json is missing" -- train --tokenizer=char --data="$T/bare/*.bin" --max-steps=2 --quiet
finish
