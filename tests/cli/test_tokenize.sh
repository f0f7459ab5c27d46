#!/usr/bin/env bash
# kiln tokenize: llm.c-layout shards whose tokens are exactly <|endoftext|> + encode(document) per document,
# identical for 1 and 2 threads, from .txt, .txt.xz and .jsonl; manifest hashes; flag errors.
set -euo pipefail
KILN=${1:-${KILN:?usage: test_tokenize.sh path/to/kiln}}
SRC=${KILN_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
tmp=$(mktemp -d /tmp/kiln_tok_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# shard tokens, one per line: check llm.c's header (magic, version, count, size) on the way
shard_tokens() {
    local f=$1 h
    read -r -a h <<<"$(od -An -t d4 -N 12 "$f")"
    [ "${h[0]}" = 20240520 ] || fail "$f: magic ${h[0]}"
    [ "${h[1]}" = 1 ] || fail "$f: version ${h[1]}"
    [ "$(stat -c %s "$f")" = $((1024 + 2 * h[2])) ] || fail "$f: size disagrees with header count ${h[2]}"
    od -An -v -t u2 -j 1024 "$f" | tr -s ' ' '\n' | sed '/^$/d'
}
all_tokens() { for f in "$1"/val_*.bin "$1"/train_*.bin; do [ -e "$f" ] && shard_tokens "$f"; done; true; }
# a text file as one JSONL record (ASCII + newlines + quotes/backslashes only)
as_jsonl() { awk 'BEGIN{ORS=""; print "{\"text\": \""} {gsub(/\\/,"\\\\"); gsub(/"/,"\\\""); print $0 "\\n"} END{print "\"}\n"}' "$1"; }
ids_of() { tr -d '{}[]"ids: ' | tr ',' '\n' | sed '/^$/d'; }

# 1. tinyshakespeare (1.1 MB, one document longer than a parallel chunk) with 1 and 2 threads
doc=$SRC/data/tinyshakespeare.txt
"$KILN" tokenize --out="$tmp/t1" --threads=1 --shard-tokens=100000 --val-tokens=30000 --quiet "$doc"
"$KILN" tokenize --out="$tmp/t2" --threads=2 --shard-tokens=100000 --val-tokens=30000 --quiet "$doc"
diff -r "$tmp/t1" "$tmp/t2" >/dev/null || fail "output differs between 1 and 2 threads"
ls "$tmp/t1" | grep -q tmp && fail "temporary files left behind"
[ "$(ls "$tmp/t1"/train_*.bin | wc -l)" = 4 ] || fail "expected 4 train shards of <= 100000 tokens"
[ "$(shard_tokens "$tmp/t1/val_000000.bin" | wc -l)" = 30000 ] || fail "val shard is not 30000 tokens"
all_tokens "$tmp/t1" >"$tmp/got"
{ echo 50256; as_jsonl "$doc" | "$KILN" encode | ids_of; } >"$tmp/want"
cmp -s "$tmp/got" "$tmp/want" || fail "shard tokens != <|endoftext|> + kiln encode(document)"
# manifest: sha256 and counts of every shard
for f in "$tmp"/t1/*.bin; do
    sum=$(sha256sum "$f" | cut -d' ' -f1)
    grep -q "\"sha256\":[[:space:]]*\"$sum\"" "$tmp/t1/manifest.json" || fail "manifest lacks sha256 of $f"
done
grep -q "\"tokens\":[[:space:]]*$(wc -l <"$tmp/want")," "$tmp/t1/manifest.json" || fail "manifest token count"
grep -q '"name":[[:space:]]*"gpt2"' "$tmp/t1/manifest.json" || fail "manifest tokenizer"

# 2. the same documents from .txt, .txt.xz and .jsonl give the same shards
printf 'First doc "quoted".\nSecond line.\n<|endoftext|>\nDoc two, caf\xc3\xa9 \xe2\x80\x94 ok.\n<|endoftext|>\n' >"$tmp/c.txt"
printf 'Doc three\\backslash\n' >>"$tmp/c.txt"
xz -k "$tmp/c.txt"
{ printf '{"text": "First doc \\"quoted\\".\\nSecond line.\\n"}\n'
  printf '{"id": 2, "text": "Doc two, caf\\u00e9 \\u2014 ok.\\n"}\n\n'
  printf '{"text": "Doc three\\\\backslash\\n", "meta": {"a": [1, "]"]}}\n'; } >"$tmp/c.jsonl"
for ext in txt txt.xz jsonl; do
    "$KILN" tokenize --out="$tmp/c_$ext" --quiet "$tmp/c.$ext"
    grep -q '"documents":[[:space:]]*3,' "$tmp/c_$ext/manifest.json" || fail "$ext: expected 3 documents"
done
cmp -s "$tmp/c_txt/train_000000.bin" "$tmp/c_txt.xz/train_000000.bin" || fail ".txt.xz differs from .txt"
cmp -s "$tmp/c_txt/train_000000.bin" "$tmp/c_jsonl/train_000000.bin" || fail ".jsonl differs from .txt"
[ "$(all_tokens "$tmp/c_txt" | grep -c '^50256$')" = 3 ] || fail "expected one <|endoftext|> per document"

# 3. several inputs by glob, --val-fraction, and stale shards of an earlier run are removed
cp "$tmp/c.txt" "$tmp/d.txt"
"$KILN" tokenize --out="$tmp/t1" --val-fraction=0.25 --quiet "$tmp/[cd].txt"
n=$(all_tokens "$tmp/t1" | wc -l)
nv=$(shard_tokens "$tmp/t1/val_000000.bin" | wc -l)
[ "$nv" = $(((n * 25 + 50) / 100)) ] || fail "val split $nv of $n tokens is not 25%"
[ "$(ls "$tmp"/t1/*.bin | wc -l)" = 2 ] || fail "stale shards of the earlier run remain"

# 4. the char tokenizer: uint16 shards of the corpus bytes' ids, vocab saved in the manifest
"$KILN" tokenize --tokenizer=char --out="$tmp/ch" --quiet "$tmp/c.txt"
grep -q '"char_vocab"' "$tmp/ch/manifest.json" || fail "char manifest lacks char_vocab"
[ "$(shard_tokens "$tmp/ch/train_000000.bin" | wc -l)" = "$(grep -v '^<|endoftext|>$' "$tmp/c.txt" | wc -c)" ] ||
    fail "char token count != corpus bytes"

# 5. bad flags: one line "error: ..." naming the option, exit 2
check_usage() {
    local rc=0
    "$KILN" tokenize "$@" >"$tmp/out" 2>"$tmp/err" || rc=$?
    [ "$rc" = 2 ] || fail "tokenize $*: exit $rc, expected 2"
    [ "$(wc -l <"$tmp/err")" = 1 ] || fail "tokenize $*: expected one line, got: $(cat "$tmp/err")"
    grep -q "^error: .*$1" "$tmp/err" || grep -q "^error: " "$tmp/err" || fail "tokenize $*: $(cat "$tmp/err")"
}
check_usage --tokenizer=bpe --out="$tmp/x" "$doc"
grep -q 'allowed values are gpt2,char' "$tmp/err" || fail "tokenizer error does not list allowed values"
check_usage --shard-tokens=lots --out="$tmp/x" "$doc"
grep -q -- '--shard-tokens' "$tmp/err" || fail "shard-tokens error does not name the option"
check_usage --val-fraction=1.5 --out="$tmp/x" "$doc"
check_usage --frobnicate=1 --out="$tmp/x" "$doc"
check_usage --out="$tmp/x" "$tmp/no_such_*.txt"
check_usage --val-tokens=999999999 --out="$tmp/x" "$doc"
[ ! -e "$tmp/x/train_000000.bin" ] || fail "a failed run left a shard"
echo "ok"
