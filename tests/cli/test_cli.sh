#!/usr/bin/env bash
# The command line as a user meets it: bad flags and config files (exit 2, one line naming the option),
# kiln info, and a short real training run whose run directory is checked file by file.
source "$(dirname "$0")/lib.sh" cli "$@"

"$KILN" >/dev/null 2>&1; [ $? -eq 2 ] && ok || bad "no command should exit 2"
expect_error 2 "unknown command 'fly'" -- fly
expect_error 2 "unknown option 'bogus'" -- train --bogus=1
expect_error 2 "did you mean 'layers'" -- train --layer=3
expect_error 2 "bad value 'abc' for lr (--lr)" -- train --lr=abc
expect_error 2 "allowed range is 1 to 1024" -- train --layers=0
expect_error 2 "expected an integer" -- train --batch=2.5
expect_error 2 "not divisible by heads 3" -- train --heads=3 --dim=128
expect_error 2 "seq 4096 is longer than block-size 128" -- train --seq=4096
expect_error 2 "allowed values are learned,rope,alibi,none" -- train --pos=sinusoidal
expect_error 2 "allowed values are cpu,cuda,auto\|allowed values are auto,cpu,cuda" -- train --device=tpu
expect_error 2 "unknown preset 'gpt5'" -- train --preset=gpt5
expect_error 2 "unexpected argument 'extra'" -- train extra
expect_error 2 "cannot open config file '$T/nope.cfg'" -- train --config="$T/nope.cfg"
printf 'layers = 2\nthis line is wrong\n' >"$T/bad1.cfg"
expect_error 2 "syntax error in config file ($T/bad1.cfg:2)" -- train --config="$T/bad1.cfg"
printf '# comment\nlayers = 2\nwarmpu = 10\n' >"$T/bad2.cfg"
expect_error 2 "unknown option 'warmpu' ($T/bad2.cfg:3)" -- train --config="$T/bad2.cfg"
printf 'dim = -5\n' >"$T/bad3.cfg"
expect_error 2 "bad value '-5' for dim ($T/bad3.cfg:1)" -- train --config="$T/bad3.cfg"
# a UTF-8 byte order mark (some editors write one) is not part of the first option's name
printf '\xef\xbb\xbflayers = 3\ndim = -5\n' >"$T/bom.cfg"
expect_error 2 "bad value '-5' for dim ($T/bom.cfg:2)" -- train --config="$T/bom.cfg"
printf 'layers = 2\nconfig = other.cfg\n' >"$T/nest.cfg"
expect_error 2 "config files do not nest ($T/nest.cfg:2)" -- train --config="$T/nest.cfg"
expect_error 2 "missing --run=DIR" -- sample
expect_error 2 "no kiln run in '$T/none' (--run)" -- sample --run="$T/none"

# kiln info: GPT-2 124M has 124.4M parameters with the vocab padded to 50304 (nanoGPT counts the same)
"$KILN" info --preset=gpt2-124m >"$T/info" 2>&1 || bad "kiln info failed: $(cat "$T/info")"
grep -q "^parameters: 1244" "$T/info" && ok || bad "gpt2-124m parameter count: $(grep parameters "$T/info")"
grep -q "vocab 50257 (padded 50304)" "$T/info" && ok || bad "padded vocab not reported"
grep -q "backends compiled: cpu" "$T/info" && ok || bad "kiln info does not list backends"
grep -q "activations" "$T/info" && ok || bad "kiln info has no memory estimate"
# GPT-2 1.5B at B=8: with the scratch shared, the CUDA plan stays under PyTorch's peak (42.84 GiB,
# docs/benchmarks.md) with room for the backend's own scratch (~0.1 GiB), the LM head in 2 chunks
"$KILN" info --preset=gpt2-1.5b --batch=8 --seq=1024 >"$T/info" 2>&1 || bad "kiln info: $(cat "$T/info")"
total=$(awk '/^memory \(cuda/ {m = 1} m && /^  total/ {print $2; exit}' "$T/info")
python3 -c "import sys; assert 0 < float(sys.argv[1]) < 42.7" "$total" && ok || bad "1.5B plans $total GiB"
scratch=$(awk '/^memory \(cuda/ {m = 1} m && /shared scratch/ {print; exit}' "$T/info")
[[ "$scratch" == *"(the LM head in 2 chunks of at most 4096 rows)" ]] && ok || bad "1.5B scratch: $scratch"

# the progress line carries the peak memory, the metrics' peak_mem_bytes to two decimals of a GiB
"$KILN" train --layers=2 --heads=2 --dim=32 --seq=32 --batch=8 --max-steps=3 --eval-every=0 --checkpoint=0 \
  --threads=2 --out="$T/prog" 2>"$T/prog.err" || bad "train failed: $(cat "$T/prog.err")"
python3 - "$T/prog" "$T/prog.err" <<'PY' && ok || bad "progress line memory: $(grep step "$T/prog.err" | tail -1)"
import json, re, sys
peak = json.loads(open(sys.argv[1] + "/metrics.jsonl").readlines()[-1])["peak_mem_bytes"]
line = [l for l in open(sys.argv[2]) if l.startswith("step 3/3")][-1]
assert peak > 0 and re.search(r"\| mem %.2f GiB \|" % (peak / 2**30), line), (peak, line)
PY

# a short real run: tiny model, 40 steps, eval at 20 and at the end
RUN="$T/run"
args=(--layers=2 --heads=2 --dim=32 --seq=32 --batch=8 --max-steps=40 --warmup=5 --eval-every=20 --eval-steps=4
      --lr=3e-3 --threads=2 --quiet)
"$KILN" train "${args[@]}" --out="$RUN" 2>"$T/train.err" || bad "train failed: $(cat "$T/train.err")"
for f in config metrics.jsonl model.safetensors vocab.char; do
  [ -s "$RUN/$f" ] && ok || bad "run dir lacks $f"
done
[ "$(wc -l <"$RUN/metrics.jsonl")" -eq 40 ] && ok || bad "metrics.jsonl should have 40 lines"
python3 - "$RUN" <<'PY' && ok || bad "metrics/safetensors check failed"
import json, struct, sys, os
run = sys.argv[1]
rows = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
for r in rows:
    for k in ("step", "loss", "lr", "grad_norm", "tokens_per_s", "ms"):
        assert k in r, (k, r)
assert [r["step"] for r in rows] == list(range(1, 41))
vals = [r for r in rows if "val_loss" in r]
assert [r["step"] for r in vals] == [20, 40], vals
# loss falls within a few dozen steps: from ~ln(65)=4.17 to well below
assert rows[0]["loss"] > 4.0 and rows[-1]["loss"] < 3.3, (rows[0]["loss"], rows[-1]["loss"])
# safetensors: u64 header length, JSON header, offsets contiguous and covering the buffer
data = open(os.path.join(run, "model.safetensors"), "rb").read()
n = struct.unpack("<Q", data[:8])[0]
hdr = json.loads(data[8:8 + n])
meta = hdr.pop("__metadata__", {})
end = 0
for name, t in sorted(hdr.items(), key=lambda kv: kv[1]["data_offsets"][0]):
    b, e = t["data_offsets"]
    assert t["dtype"] == "F32" and b == end, (name, t)
    numel = 1
    for d in t["shape"]:
        numel *= d
    assert e - b == 4 * numel, (name, t)
    end = e
assert 8 + n + end == len(data)
assert hdr["transformer.wte.weight"]["shape"] == [128, 32]
assert hdr["transformer.h.1.attn.c_attn.weight"]["shape"] == [96, 32]
assert "transformer.ln_f.bias" in hdr and meta.get("producer") == "kiln"
PY

# the resolved config reproduces the run bit for bit; another seed does not
"$KILN" train --config="$RUN/config" --out="$T/run2" --quiet 2>"$T/train2.err" || bad "rerun from config failed: $(cat "$T/train2.err")"
"$KILN" train "${args[@]}" --seed=7 --out="$T/run3" 2>/dev/null || bad "seed 7 run failed"
losses() { python3 -c 'import json,sys; print([json.loads(l)["loss"] for l in open(sys.argv[1])])' "$1"; }
[ "$(losses "$RUN/metrics.jsonl")" = "$(losses "$T/run2/metrics.jsonl")" ] && ok || bad "same seed gave other losses"
[ "$(losses "$RUN/metrics.jsonl")" != "$(losses "$T/run3/metrics.jsonl")" ] && ok || bad "other seed gave same losses"
cmp -s "$RUN/model.safetensors" "$T/run2/model.safetensors" && ok || bad "same seed gave other weights"

# sampling from the run
# 300 tokens: more than the model's 128-token context, so the KV cache is rebuilt on the way
"$KILN" sample --run="$RUN" --max-tokens=300 --prompt="ROMEO:" --device=cpu >"$T/sample" 2>"$T/sample.err" || bad "sample failed: $(cat "$T/sample.err")"
[ "$(head -c 6 "$T/sample")" = "ROMEO:" ] && [ "$(wc -c <"$T/sample")" -ge 306 ] && ok || bad "sample output: $(cat "$T/sample")"
expect_error 2 "bad value 'hot' for temperature" -- sample --run="$RUN" --temperature=hot

# --sample-every prints a sample from the training model as a one-line note, on its cadence only
"$KILN" train --layers=1 --dim=32 --heads=2 --seq=32 --batch=2 --max-steps=6 --eval-every=0 --threads=1 \
  --sample-every=3 2>"$T/err" >/dev/null
[ "$(grep -ac '^step [36] sample: ' "$T/err")" -eq 2 ] && ! grep -aq '^step [1245] sample' "$T/err" && ok ||
  bad "--sample-every=3 did not print samples at steps 3 and 6 only: $(grep -a sample "$T/err")"
expect_error 2 "sample-every" -- train --layers=1 --dim=32 --heads=2 --seq=32 --sample-every=3 --zero=3
# kiln info --world=N (info only) is checked like an option; --save-model=0 leaves the run without its model
expect_error 2 "world" -- info --world=0
expect_error 2 "world" -- info --world=two
"$KILN" info --zero=3 --world=4 | grep -q "per rank: [0-9]* bytes" && ok || bad "kiln info --zero=3 --world=4 printed no per-rank plan"
"$KILN" train --layers=1 --dim=32 --heads=2 --seq=32 --batch=2 --max-steps=2 --eval-every=0 --threads=1 --quiet \
  --save-model=0 --out="$T/nosave" 2>/dev/null
[ -f "$T/nosave/metrics.jsonl" ] && [ ! -e "$T/nosave/model.safetensors" ] && ok ||
  bad "--save-model=0 wrote model.safetensors, or no metrics"
finish
