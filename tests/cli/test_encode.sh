#!/usr/bin/env bash
# kiln encode / decode: every golden line's ids exactly, decode(encode(x)) round trips, errors.
set -euo pipefail
KILN=${1:-${KILN:?usage: test_encode.sh path/to/kiln}}
SRC=${KILN_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
tmp=$(mktemp -d /tmp/kiln_enc_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
# one "[ids]" per line from golden lines {"text": ..., "ids": [...]} or kiln's {"ids":[...]}
golden_ids() { sed 's/.*"ids": *\[/[/; s/\].*$/]/; s/ //g' "$1"; }
kiln_ids() { sed 's/^{"ids":\[/[/; s/\]}$/]/'; }

check_golden() {
    local g=$1
    "$KILN" encode "$g" | kiln_ids >"$tmp/got"
    golden_ids "$g" >"$tmp/want"
    [ "$(wc -l <"$tmp/want")" -ge 100 ] || fail "$g: too few lines"
    if ! cmp -s "$tmp/got" "$tmp/want"; then
        diff "$tmp/got" "$tmp/want" | head -5 >&2
        fail "$g: ids differ"
    fi
    # decode, then encode again: the same ids (text round trip through JSON)
    "$KILN" encode <"$g" | "$KILN" decode | "$KILN" encode | kiln_ids >"$tmp/again"
    cmp -s "$tmp/again" "$tmp/want" || fail "$g: encode(decode(ids)) != ids"
    echo "$g: $(wc -l <"$tmp/want") lines match"
}
public=$SRC/../shared/data/gpt2/golden_public.jsonl
if [ -f "$public" ]; then
    check_golden "$public"
else
    echo "SKIPPED golden_public: $public not found (CI's test data beside the clone; a plain clone has none)"
fi
check_golden "$SRC/tests/data/golden_extra.jsonl"

# the special token only when asked
[ "$(echo '{"text": "a<|endoftext|>b"}' | "$KILN" encode)" != '{"ids":[64,50256,65]}' ] || fail "eot produced"
[ "$(echo '{"text": "a<|endoftext|>b"}' | "$KILN" encode --allow-special)" = '{"ids":[64,50256,65]}' ] ||
    fail "--allow-special"
# the char tokenizer with a vocab file
printf 'hello world' >"$tmp/v.txt"
[ "$(echo '{"text": "hello"}' | "$KILN" encode --tokenizer=char --vocab="$tmp/v.txt")" = '{"ids":[3,2,4,4,5]}' ] ||
    fail "char encode"
[ "$(echo '{"ids":[3,2,4,4,5]}' | "$KILN" decode --tokenizer=char --vocab="$tmp/v.txt")" = '{"text":"hello"}' ] ||
    fail "char decode"

# errors: one line, naming the input line; exit 2
expect_err() { # expect_err PATTERN cmd...
    local pat=$1 rc=0
    shift
    "$@" >/dev/null 2>"$tmp/err" || rc=$?
    [ "$rc" = 2 ] || fail "$*: exit $rc, expected 2"
    [ "$(wc -l <"$tmp/err")" = 1 ] && grep -q "^error: .*$pat" "$tmp/err" || fail "$*: $(cat "$tmp/err")"
}
printf '{"text": "ok"}\n{"txt": "x"}\n' >"$tmp/bad.jsonl"
expect_err 'bad.jsonl:2' "$KILN" encode "$tmp/bad.jsonl"
printf '{"ids": [15496, 50257]}\n' >"$tmp/bad_ids.jsonl"
expect_err 'token id 50257 (index 1) out of range' "$KILN" decode "$tmp/bad_ids.jsonl"
expect_err 'offset 0' sh -c "echo '{\"text\": \"z\"}' | '$KILN' encode --tokenizer=char --vocab='$tmp/v.txt'"
expect_err '--tokenizer' "$KILN" encode --tokenizer=wordpiece
expect_err 'gpt2, char' "$KILN" decode --tokenizer=wordpiece
expect_err "unknown option 'frob'" "$KILN" encode --frob=1
echo "ok"
