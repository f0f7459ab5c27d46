#!/usr/bin/env bash
# kiln export writes the tokenizer a run was trained with, in the files transformers' AutoTokenizer reads:
# gpt2: vocab.json and merges.txt (kiln's own encoder.json and vocab.bpe, byte for byte) and tokenizer.json in
# the `tokenizers` library's format (byte-level BPE: the same vocab and merges, GPT-2's pre-tokenizer and
# decoder, <|endoftext|> special); char: tokenizer.json with one token per character of the run's vocabulary.
# The JSON's structure is checked with python's json module everywhere; where python has `tokenizers` (and
# `transformers`), the files are loaded and encode the golden texts to kiln's ids, and decode them back.
source "$(dirname "$0")/lib.sh" hftok "$@"
SRC=${KILN_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}

tiny=(--layers=1 --heads=2 --dim=32 --seq=32 --batch=2 --max-steps=1 --eval-every=0 --eval-steps=1 --quiet)
"$KILN" train --preset=gpt2-124m "${tiny[@]}" --block-size=64 --data=random --out="$T/g" >"$T/out" 2>&1 || bad "train gpt2: $(cat "$T/out")"
"$KILN" export --run="$T/g" --out="$T/hf_g" >"$T/out" 2>&1 || bad "export gpt2: $(cat "$T/out")"
"$KILN" train "${tiny[@]}" --out="$T/c" >"$T/out" 2>&1 || bad "train char: $(cat "$T/out")"
"$KILN" export --run="$T/c" --out="$T/hf_c" >"$T/out" 2>&1 || bad "export char: $(cat "$T/out")"
grep -q "and its char tokenizer to" "$T/out" && ok || bad "export does not say it wrote the tokenizer: $(cat "$T/out")"

for f in vocab.json merges.txt tokenizer.json tokenizer_config.json special_tokens_map.json; do
  [ -s "$T/hf_g/$f" ] && ok || bad "gpt2 export has no $f"
done
cmp -s "$T/hf_g/vocab.json" "$SRC/data/gpt2/encoder.json" && ok || bad "vocab.json is not kiln's encoder.json"
cmp -s "$T/hf_g/merges.txt" "$SRC/data/gpt2/vocab.bpe" && ok || bad "merges.txt is not kiln's vocab.bpe"

python3 - "$T/hf_g" "$T/hf_c" "$SRC/data/gpt2" "$T/c/vocab.char" <<'PY' && ok || bad "tokenizer JSON structure (above)"
import json, sys
g, c, gpt2, vocab_char = sys.argv[1:]
def load(p): return json.load(open(p, encoding="utf-8"))
def check(cond, what):
    if not cond: print("FAIL:", what); sys.exit(1)
# gpt2
t = load(g + "/tokenizer.json")
enc = load(gpt2 + "/encoder.json")
merges = [l for l in open(gpt2 + "/vocab.bpe", encoding="utf-8").read().split("\n")[1:] if l]
check(t["version"] == "1.0", "version")
m = t["model"]
check(m["type"] == "BPE" and m["vocab"] == enc, "model: BPE over encoder.json's vocab")
check(m["merges"] == merges and len(merges) == 50000, "model.merges: vocab.bpe's 50000 merges in order")
check(all(len(x.split(" ")) == 2 for x in m["merges"]), "each merge is two symbols")
check(m["continuing_subword_prefix"] == "" and m["end_of_word_suffix"] == "" and m["byte_fallback"] is False, "BPE flags")
pre = t["pre_tokenizer"]
check(pre["type"] == "ByteLevel" and pre["add_prefix_space"] is False and pre["use_regex"] is True, "GPT-2's pre-tokenizer")
check(t["decoder"]["type"] == "ByteLevel", "byte-level decoder")
check(t["normalizer"] is None, "no normalizer")
check(t["added_tokens"] == [{"id": 50256, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                             "rstrip": False, "normalized": True, "special": True}], "<|endoftext|> special")
cfg = load(g + "/tokenizer_config.json")
check(cfg["tokenizer_class"] == "GPT2Tokenizer" and cfg["model_max_length"] == 64, "tokenizer_config: class, block size")
check(cfg["eos_token"] == "<|endoftext|>", "eos token")
check(load(g + "/special_tokens_map.json")["eos_token"] == "<|endoftext|>", "special_tokens_map")
# char: ids are the run's vocab.char, in order
t = load(c + "/tokenizer.json")
chars = open(vocab_char, "rb").read().decode("ascii")
check(t["model"]["type"] == "BPE" and t["model"]["merges"] == [], "char: BPE without merges")
check(t["model"]["vocab"] == {ch: i for i, ch in enumerate(chars)}, "char: vocab is vocab.char in id order")
check(t["pre_tokenizer"] is None and t["decoder"] == {"type": "Fuse"}, "char: no pre-tokenizer, Fuse decoder")
check(load(c + "/tokenizer_config.json")["tokenizer_class"] == "PreTrainedTokenizerFast", "char: fast class")
PY

# the real load, where the libraries are
texts=$'Hello world\nFirst Citizen:\nBefore we proceed any further, hear me speak.\n  tabs\tand  spaces, caf\u00e9 \u00fcber 1234567 \U0001F600!\n'
if python3 -c "import tokenizers" 2>/dev/null; then
  while IFS= read -r line; do
    python3 -c 'import json,sys; print(json.dumps({"text": sys.argv[1]}))' "$line"
  done <<<"$texts" >"$T/in.jsonl"
  "$KILN" encode "$T/in.jsonl" >"$T/kiln_ids.jsonl" || bad "kiln encode failed"
  python3 - "$T/hf_g" "$T/hf_c" "$T/in.jsonl" "$T/kiln_ids.jsonl" "$T/c/vocab.char" <<'PY' && ok || bad "tokenizers load (above)"
import json, sys
from tokenizers import Tokenizer
g, c, inp, ids, vocab_char = sys.argv[1:]
tok = Tokenizer.from_file(g + "/tokenizer.json")
for a, b in zip(open(inp), open(ids)):
    text, want = json.loads(a)["text"], json.loads(b)["ids"]
    got = tok.encode(text).ids
    if got != want: print("FAIL: %r: tokenizers %s, kiln %s" % (text, got, want)); sys.exit(1)
    if tok.decode(got) != text: print("FAIL: decode %r" % text); sys.exit(1)
if tok.encode("a<|endoftext|>b").ids != [64, 50256, 65]: print("FAIL: special token"); sys.exit(1)
chars = open(vocab_char).read()
ct = Tokenizer.from_file(c + "/tokenizer.json")
s = "First Citizen:\nBefore we proceed"
if ct.encode(s).ids != [chars.index(ch) for ch in s] or ct.decode(ct.encode(s).ids) != s:
    print("FAIL: char tokenizer", ct.encode(s).ids); sys.exit(1)
try:
    from transformers import AutoTokenizer
except ImportError:
    print("[test] transformers absent: AutoTokenizer not tried"); sys.exit(0)
for d in (g, c):
    at = AutoTokenizer.from_pretrained(d)
    s = "First Citizen:\nBefore we proceed"
    if at.decode(at(s)["input_ids"]) != s: print("FAIL: AutoTokenizer round trip in", d); sys.exit(1)
at = AutoTokenizer.from_pretrained(g)
if at("Hello world")["input_ids"] != [15496, 995]: print("FAIL: AutoTokenizer ids"); sys.exit(1)
print("[test] tokenizers and AutoTokenizer load both exports and match kiln's ids")
PY
else
  echo "[test] SKIPPED the real load: python3 has no 'tokenizers' here (the JSON structure was checked above)"
fi
finish
