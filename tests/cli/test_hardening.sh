#!/usr/bin/env bash
# Issue 18, as a hostile user meets kiln: non-finite weights are refused wherever weights are loaded (import,
# resume, sample, logits, export) naming the file, tensor and element; logits never print invalid JSON; a run's
# model.safetensors carries a checksum that sample, logits and export verify; messages say what is wrong
# (kiln help help, kiln --version, kiln help info, tokenize worded as train, an HF directory without kiln.json).
source "$(dirname "$0")/lib.sh" hardening "$@"

# st.py: edits a safetensors file in place, keeping its layout.
#   strip FILE              drop the data_sha256 checksum from the metadata (a hand-made file)
#   set FILE TENSOR I VALUE element I of an F32 tensor := VALUE (I = all: every element; TENSOR = all: every
#                           tensor); the checksum, if any, is left as it was
cat >"$T/st.py" <<'PY'
import json, struct, sys
op, path = sys.argv[1], sys.argv[2]
raw = open(path, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n])
data = bytearray(raw[8 + n:])
if op == "strip":
    hdr.get("__metadata__", {}).pop("data_sha256")
elif op == "set":
    name, idx, value = sys.argv[3], sys.argv[4], float(sys.argv[5])
    for k, t in hdr.items():
        if k == "__metadata__" or (name != "all" and k != name):
            continue
        b, e = t["data_offsets"]
        assert t["dtype"] == "F32"
        for i in (range((e - b) // 4) if idx == "all" else [int(idx)]):
            data[b + 4 * i:b + 4 * i + 4] = struct.pack("<f", value)
h = json.dumps(hdr).encode()
h += b" " * (-len(h) % 8)
open(path, "wb").write(struct.pack("<Q", len(h)) + h + bytes(data))
PY
st() { python3 "$T/st.py" "$@" || bad "st.py $*"; }

# ---- defect 6 and the rough edges: messages --------------------------------------------------------------
"$KILN" help help >"$T/out" 2>&1 && grep -q "^kiln help \[COMMAND\]" "$T/out" && ok || bad "kiln help help: $(cat "$T/out")"
for v in --version -V; do
  "$KILN" $v >"$T/out" 2>&1 || bad "kiln $v exited $?"
  grep -q "^kiln [0-9]" "$T/out" && grep -q "^commit: ." "$T/out" && grep -q "^build type: " "$T/out" &&
    grep -q "^backends: cpu" "$T/out" && grep -q "^cuda archs: " "$T/out" && grep -q "^transports: single" "$T/out" &&
    ok || bad "kiln $v: $(cat "$T/out")"
done
# help info: the options that change what info computes, not the optimizer's
"$KILN" help info >"$T/out" 2>&1
grep -q "^  layers " "$T/out" && grep -q "^  recompute " "$T/out" && grep -q "^  zero " "$T/out" && grep -q "^  sp " "$T/out" &&
  grep -q -- "--world=N" "$T/out" && ! grep -q "^  lr \|^  warmup \|^  resume " "$T/out" &&
  ok || bad "kiln help info: $(cat "$T/out")"
# train and tokenize word the same errors the same way
printf 'some text\n' >"$T/doc.txt"
expect_error 2 "bad value '0' for threads (--threads): allowed range is 1 to 1024" -- tokenize --threads=0 --out="$T/tok" "$T/doc.txt"
expect_error 2 "bad value '0' for threads (--threads): allowed range is 0 to 4096\|bad value '-1' for threads" -- train --threads=-1
expect_error 2 "no input files match ($T/nope\*.txt): expected .txt or .jsonl files" -- tokenize --out="$T/tok" "$T/nope*.txt"
expect_error 2 "no data files match ($T/nope\*.bin): expected .bin shards" -- train --tokenizer=gpt2 --data="$T/nope*.bin"
expect_error 2 "unknown option 'bogus' (kiln tokenize)" -- tokenize --bogus=1 --out="$T/tok" "$T/doc.txt"
expect_error 2 "bad value 'bpe' for tokenizer (--tokenizer): allowed values are gpt2,char" -- tokenize --tokenizer=bpe --out="$T/tok" "$T/doc.txt"
expect_error 2 "allowed range is 1 to 1048576" -- train --batch=0

# ---- defect 2: non-finite weights and the run's checksum ---------------------------------------------------
tiny=(--layers=2 --heads=2 --dim=32 --seq=16 --batch=4 --warmup=1 --eval-every=0 --eval-steps=1 --device=cpu
      --threads=2 --quiet)
RUN="$T/run"
"$KILN" train "${tiny[@]}" --max-steps=3 --ckpt-every=2 --out="$RUN" >"$T/train.log" 2>&1 || bad "train: $(tail -3 "$T/train.log")"
python3 - "$RUN/model.safetensors" <<'PY' && ok || bad "model.safetensors has no valid data_sha256"
import hashlib, json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
meta = json.loads(raw[8:8 + n])["__metadata__"]
assert meta["data_sha256"] == hashlib.sha256(raw[8 + n:]).hexdigest(), meta
PY
"$KILN" logits --run="$RUN" --tokens=1,2,3 >"$T/good.json" 2>"$T/err" || bad "logits of a good run: $(cat "$T/err")"

# a damaged byte in the data: every reader refuses it, naming the file
cp -r "$RUN" "$T/dmg"
size=$(stat -c %s "$T/dmg/model.safetensors")
flip_byte "$T/dmg/model.safetensors" $((size - 2))
expect_error 1 "checksum mismatch ($T/dmg/model.safetensors)" -- sample --run="$T/dmg" --max-tokens=5 --device=cpu
expect_error 1 "checksum mismatch ($T/dmg/model.safetensors)" -- logits --run="$T/dmg" --tokens=1,2,3
expect_error 1 "checksum mismatch ($T/dmg/model.safetensors)" -- export --run="$T/dmg" --format=hf --out="$T/dmg.hf"
[ ! -s "$T/out" ] && ok || bad "a refused logits printed: $(head -c 200 "$T/out")"

# a file without the checksum (an older run, a hand-made file) loads, unchecked, to the same logits
cp -r "$RUN" "$T/old"
st strip "$T/old/model.safetensors"
"$KILN" logits --run="$T/old" --tokens=1,2,3 >"$T/old.json" 2>"$T/err" || bad "logits without a checksum: $(cat "$T/err")"
cmp -s "$T/good.json" "$T/old.json" && ok || bad "logits differ once the checksum is stripped"

# NaN weights in a file without a checksum: sample, logits and export name the first bad element
cp -r "$T/old" "$T/nan"
st set "$T/nan/model.safetensors" transformer.h.1.mlp.c_fc.weight 5 nan
where="($T/nan/model.safetensors: tensor transformer.h.1.mlp.c_fc.weight, element 5)"
expect_error 1 "non-finite weight nan $where" -- sample --run="$T/nan" --max-tokens=5 --device=cpu
[ ! -s "$T/out" ] && ok || bad "a refused sample printed: $(cat "$T/out")"
expect_error 1 "non-finite weight nan $where" -- logits --run="$T/nan" --tokens=1,2,3
expect_error 1 "non-finite weight nan $where" -- export --run="$T/nan" --format=hf --out="$T/nan.hf"

# logits that overflow (finite weights, ln_f scaled to the float maximum): valid JSON with null, exit 1
cp -r "$T/old" "$T/big"
st set "$T/big/model.safetensors" transformer.ln_f.weight all 3.4e38
st set "$T/big/model.safetensors" transformer.ln_f.bias all 3.4e38
expect_error 1 "non-finite logit .* (kiln logits: position 0, token [0-9]*): printed as null" -- logits --run="$T/big" --tokens=1,2,3
python3 - "$T/out" <<'PY' && ok || bad "logits of an overflowing model are not strict JSON: $(head -c 300 "$T/out")"
import json, sys
def refuse(c):
    raise ValueError("non-JSON constant " + c)
j = json.loads(open(sys.argv[1]).read(), parse_constant=refuse)
assert len(j["logits"]) == 3 and any(x is None for row in j["logits"] for x in row)
PY

# import of an HF file full of NaN fails, naming the first tensor; nothing is written
"$KILN" export --run="$RUN" --format=hf --out="$T/hf" >/dev/null 2>&1 || bad "export of the good run"
cp -r "$T/hf" "$T/hfnan"
st set "$T/hfnan/model.safetensors" all all nan
expect_error 1 "non-finite weight nan ($T/hfnan/model.safetensors: tensor transformer.wte.weight, element 0)" -- import --from="$T/hfnan" --out="$T/imp"
[ ! -e "$T/imp/model.safetensors" ] && ok || bad "a refused import wrote a model"

# an HF directory without kiln's kiln.json: says so, and what it needs instead
rm "$T/hf/kiln.json"
expect_error 2 "no kiln.json in $T/hf (kiln import): .*config.json has vocab_size 65, not 50257; for a char model add $T/hf/kiln.json" -- import --from="$T/hf" --out="$T/imp2"

# resume from a checkpoint whose weights hold a NaN (its file hash updated, as a writer that saved NaNs would)
CK="$RUN/ckpt/step_00000003"
old=$(sha256sum "$CK/model.safetensors" | cut -d' ' -f1)
st set "$CK/model.safetensors" transformer.h.0.attn.c_proj.weight 17 inf
new=$(sha256sum "$CK/model.safetensors" | cut -d' ' -f1)
sed -i "s/$old/$new/" "$CK/state.json"
bad_ck="non-finite weight inf ($CK/model.safetensors: tensor transformer.h.0.attn.c_proj.weight, element 17)"
# named as the checkpoint to resume from: an error
expect_error 1 "$bad_ck" -- train "${tiny[@]}" --max-steps=5 --out="$T/res" --resume="$CK"
# found by --resume=auto: named, and the resume falls back to the checkpoint before it
"$KILN" train "${tiny[@]}" --max-steps=5 --ckpt-every=2 --out="$RUN" >"$T/res.log" 2>&1 || bad "auto resume: $(cat "$T/res.log")"
grep -qF "checkpoint $CK is unusable ($bad_ck" "$T/res.log" && grep -q "resuming from .*step_00000002 (step 2)" "$T/res.log" &&
  ok || bad "auto resume past a NaN checkpoint: $(cat "$T/res.log")"

finish
