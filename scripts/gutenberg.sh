#!/usr/bin/env bash
# Makes GPT-2 token shards (data/gutenberg/train_*.bin, val_*.bin: what configs/gpt2-*.cfg, llama-*.cfg and
# the other GPU configs read) from Project Gutenberg books or any English text.
#
#   scripts/gutenberg.sh [--out=DIR] [--kiln=PATH] [--text=FILE] FILE...
#
# FILE: plain-text books as gutenberg.org serves them (pg1342.txt, ...): the licence text outside each book's
# "*** START OF ..." and "*** END OF ..." lines is dropped, and the books are joined with "<|endoftext|>" lines.
# A file without those markers (.txt, .txt.xz or .jsonl, e.g. a corpus already joined that way) is passed to
# kiln tokenize as it is. --out: the shards' directory (data/gutenberg); --kiln: the binary (build/kiln);
# --text=FILE: write the joined text there and stop (no shards).
#
# Where to get books:
# - one book: https://www.gutenberg.org/ebooks/ID lists its files; the plain text is
#   https://www.gutenberg.org/cache/epub/ID/pgID.txt, e.g.
#     curl -fLO https://www.gutenberg.org/cache/epub/1342/pg1342.txt      # Pride and Prejudice
# - many books: gutenberg.org asks that bulk downloads use a mirror (https://www.gutenberg.org/help/mirroring.html)
#   rather than its web pages.
# - the corpus kiln's Gutenberg figures were measured on (docs/benchmarks.md): 362 English books (128 MB) of
#   authors and translators who died before 1955, from the GitHub repository rcdm-uga/Gutenberg_Text (commit
#   a0b16d35a9851168ce9ac649851c17b7ab08d48e), the licence text removed, non-English books, books under 5 kB and
#   duplicates dropped, about 2% of books held out for validation; this script makes shards of the same kind
#   from any such set of books.
set -euo pipefail
out=data/gutenberg
kiln=build/kiln
text=
files=()
for a in "$@"; do
  case $a in
    --out=*) out=${a#--out=} ;;
    --kiln=*) kiln=${a#--kiln=} ;;
    --text=*) text=${a#--text=} ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "error: unknown option '$a' (scripts/gutenberg.sh): see scripts/gutenberg.sh --help" >&2; exit 2 ;;
    *) files+=("$a") ;;
  esac
done
if [ ${#files[@]} -eq 0 ]; then
  echo "error: no input files (scripts/gutenberg.sh): give Gutenberg books (pgID.txt) or a text corpus; see --help" >&2
  exit 2
fi
for f in "${files[@]}"; do
  [ -r "$f" ] || { echo "error: cannot read '$f' (scripts/gutenberg.sh): no such file" >&2; exit 2; }
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
books=() rest=()
for f in "${files[@]}"; do
  if [[ $f == *.txt ]] && grep -q '^\*\*\* *START OF' "$f"; then books+=("$f"); else rest+=("$f"); fi
done
if [ ${#books[@]} -gt 0 ]; then
  # each book's text between its START and END lines (CRLF made LF), then a line "<|endoftext|>"
  for b in "${books[@]}"; do
    tr -d '\r' <"$b" | awk '/^\*\*\* *END OF/ {exit} on {print} /^\*\*\* *START OF/ {on = 1}'
    echo '<|endoftext|>'
  done >"$tmp/books.txt"
  rest+=("$tmp/books.txt")
  echo "gutenberg.sh: ${#books[@]} book(s), $(wc -c <"$tmp/books.txt") bytes of text"
fi
if [ -n "$text" ]; then
  cat "${rest[@]}" >"$text"
  echo "gutenberg.sh: wrote $text"
  exit 0
fi
[ -x "$kiln" ] || { echo "error: no kiln binary at '$kiln' (scripts/gutenberg.sh): build it (make) or give --kiln=PATH" >&2; exit 2; }
# about 2% of the tokens held out for validation
"$kiln" tokenize --out="$out" --val-fraction=0.02 "${rest[@]}"
echo "gutenberg.sh: shards in $out (train_*.bin, val_*.bin); e.g. build/kiln train --config=configs/gpt2-124m-cpu.cfg"
