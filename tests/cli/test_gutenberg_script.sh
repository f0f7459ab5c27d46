#!/usr/bin/env bash
# scripts/gutenberg.sh: Project Gutenberg books as gutenberg.org serves them become one text of books joined by
# "<|endoftext|>" lines, without the licence text around each book, and then GPT-2 shards kiln trains on.
source "$(dirname "$0")/lib.sh" gutenberg "$@"
SRC=${KILN_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
S=$SRC/scripts/gutenberg.sh

book() { # book FILE TITLE: a book with the licence header and footer, CRLF line ends as served
  {
    echo "The Project Gutenberg eBook of $2"
    echo "This eBook is for the use of anyone anywhere. LICENCE-HEADER"
    echo "*** START OF THE PROJECT GUTENBERG EBOOK $2 ***"
    for i in $(seq 200); do echo "It is a truth universally acknowledged, line $i of $2, that a story needs words."; done
    echo "*** END OF THE PROJECT GUTENBERG EBOOK $2 ***"
    echo "LICENCE-FOOTER: Section 1. General Terms of Use"
  } | sed 's/$/\r/' >"$1"
}
book "$T/pg1.txt" ONE
book "$T/pg2.txt" TWO
bash "$S" --text="$T/joined.txt" "$T/pg1.txt" "$T/pg2.txt" >"$T/out" 2>&1 || bad "gutenberg.sh --text: $(cat "$T/out")"
grep -q LICENCE "$T/joined.txt" && bad "the licence text was kept" || ok
grep -q 'START OF\|END OF' "$T/joined.txt" && bad "the START/END lines were kept" || ok
[ "$(grep -c '^<|endoftext|>$' "$T/joined.txt")" -eq 2 ] && ok || bad "expected 2 <|endoftext|> lines: $(grep -c endoftext "$T/joined.txt")"
[ "$(grep -c 'line 200 of' "$T/joined.txt")" -eq 2 ] && ok || bad "a book's text is missing"
grep -q $'\r' "$T/joined.txt" && bad "CR left in the text" || ok

bash "$S" --kiln="$KILN" --out="$T/shards" "$T/pg1.txt" "$T/pg2.txt" >"$T/out" 2>&1 || bad "gutenberg.sh: $(cat "$T/out")"
ls "$T"/shards/train_*.bin >/dev/null 2>&1 && ls "$T"/shards/val_*.bin >/dev/null 2>&1 && ok ||
  bad "no train and val shards: $(ls "$T/shards" 2>&1) $(cat "$T/out")"
"$KILN" train --preset=gpt2-124m --layers=1 --heads=2 --dim=32 --batch=2 --seq=32 --max-steps=1 --eval-every=0 \
  --eval-steps=1 --data="$T/shards/train_*.bin" --val-data="$T/shards/val_*.bin" --checkpoint=0 --save-model=0 \
  --quiet >"$T/out" 2>&1 && ok || bad "training on the script's shards: $(tail -3 "$T/out")"

bash "$S" "$T/none.txt" >"$T/out" 2>&1
[ $? -eq 2 ] && grep -q "^error: cannot read" "$T/out" && ok || bad "a missing file: $(cat "$T/out")"
finish
