#!/usr/bin/env bash
# Single-thread GPT-2 encode speed, kiln vs tiktoken, on the same text and CPU.
# usage: bench/bpe_vs_tiktoken.sh BUILD_DIR TEXT_FILE [REPEATS]
#   TEXT_FILE may be .xz (decompressed to a temp file first). tiktoken's encoding is built from kiln's
#   data/gpt2 files (the same ranks as tiktoken's "gpt2", which it would otherwise download), and its
#   encode_ordinary runs in one thread. Prints both MB/s, the ratio kiln/tiktoken, and whether the token
#   counts agree.
set -euo pipefail
BUILD=${1:?usage: bpe_vs_tiktoken.sh BUILD_DIR TEXT_FILE [REPEATS]}
TEXT=${2:?usage: bpe_vs_tiktoken.sh BUILD_DIR TEXT_FILE [REPEATS]}
REPEATS=${3:-3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [[ $TEXT == *.xz ]]; then
    xz -dc "$TEXT" >"$tmp/text.txt"
    TEXT=$tmp/text.txt
fi
[ -x "$BUILD/bpe_bench" ] || { echo "error: $BUILD/bpe_bench not found; build the bpe_bench target" >&2; exit 2; }
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
kiln_line=$(taskset -c 0 "$BUILD/bpe_bench" "$TEXT" "$REPEATS" "$ROOT/data/gpt2" 2>/dev/null ||
    "$BUILD/bpe_bench" "$TEXT" "$REPEATS" "$ROOT/data/gpt2")
echo "$kiln_line"
tik_line=$(RAYON_NUM_THREADS=1 python3 - "$TEXT" "$REPEATS" "$ROOT/data/gpt2" <<'PY'
import json, sys, time
import tiktoken
path, repeats, vocab = sys.argv[1], int(sys.argv[2]), sys.argv[3]
byte_enc = {}
bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
dec = {chr(c): b for b, c in zip(bs, cs)}
with open(vocab + "/encoder.json", encoding="utf-8") as f:
    encoder = json.load(f)
ranks = {bytes(dec[ch] for ch in tok): i for tok, i in encoder.items() if tok != "<|endoftext|>"}
enc = tiktoken.Encoding(name="gpt2_local", explicit_n_vocab=50257,
    pat_str=r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
    mergeable_ranks=ranks, special_tokens={"<|endoftext|>": 50256})
text = open(path, "rb").read().decode("utf-8")
nbytes = len(text.encode("utf-8"))
best, ntok = 1e30, 0
for _ in range(repeats):
    t0 = time.perf_counter()
    ids = enc.encode_ordinary(text)
    best = min(best, time.perf_counter() - t0)
    ntok = len(ids)
print(f"tiktoken {tiktoken.__version__} gpt2 encode_ordinary: {nbytes} bytes -> {ntok} tokens, best of {repeats}: "
      f"{best:.3f} s, {nbytes / best / 1e6:.2f} MB/s")
PY
)
echo "$tik_line"
k=$(sed -E 's/.* ([0-9.]+) MB\/s$/\1/' <<<"$kiln_line")
t=$(sed -E 's/.* ([0-9.]+) MB\/s$/\1/' <<<"$tik_line")
kt=$(sed -E 's/.*-> ([0-9]+) tokens.*/\1/' <<<"$kiln_line")
tt=$(sed -E 's/.*-> ([0-9]+) tokens.*/\1/' <<<"$tik_line")
awk -v k="$k" -v t="$t" 'BEGIN { printf "ratio kiln/tiktoken: %.2fx\n", k / t }'
[ "$kt" = "$tt" ] && echo "token counts agree ($kt)" || echo "WARNING: token counts differ (kiln $kt, tiktoken $tt)"
