#!/usr/bin/env bash
# kiln export / import / logits as a user meets them: a trained run goes to a Hugging Face directory and back
# with bitwise-identical logits (GPT-2 and Llama layouts), OLMo imports and samples, unsupported options are
# refused with one line naming the option, and kiln info prices the family presets.
source "$(dirname "$0")/lib.sh" export "$@"


tiny=(--layers=2 --heads=4 --dim=32 --seq=16 --batch=4 --max-steps=3 --warmup=1 --eval-every=0 --eval-steps=1
      --device=cpu --quiet)
train() { # NAME ARGS...
  local name=$1
  shift
  "$KILN" train "${tiny[@]}" "$@" --out="$T/$name" >"$T/$name.log" 2>&1 || bad "train $name: $(tail -3 "$T/$name.log")"
}
TOKENS=0,5,9,17,3,3,40,21,8,1,12,30

roundtrip() { # NAME ARCH: export, check the architecture, import, compare logits bit for bit
  local name=$1 arch=$2
  "$KILN" export --run="$T/$name" --format=hf --out="$T/$name.hf" >"$T/$name.exp" 2>&1 || { bad "export $name: $(cat "$T/$name.exp")"; return; }
  grep -q "\"$arch\"" "$T/$name.hf/config.json" && ok || bad "$name: config.json does not name $arch"
  [ -s "$T/$name.hf/model.safetensors" ] && ok || bad "$name: no model.safetensors"
  "$KILN" import --from="$T/$name.hf" --out="$T/$name.back" >"$T/$name.imp" 2>&1 || { bad "import $name: $(cat "$T/$name.imp")"; return; }
  "$KILN" logits --run="$T/$name" --tokens=$TOKENS >"$T/$name.a.json" 2>&1 || bad "logits $name"
  "$KILN" logits --run="$T/$name.back" --tokens=$TOKENS >"$T/$name.b.json" 2>&1 || bad "logits $name.back"
  cmp -s "$T/$name.a.json" "$T/$name.b.json" && ok || bad "$name: logits differ after export -> import"
}

train gpt2 --tokenizer=char
roundtrip gpt2 GPT2LMHeadModel
train llama --pos=rope --norm=rmsnorm --mlp=swiglu --kv-heads=2 --bias=0 --tie-embeddings=0 --rope-theta=5e5
roundtrip llama LlamaForCausalLM
# OLMo: trained norm weights fold into the linear layers, so the weights (not the function) change
train olmo --pos=rope --norm=layernorm --norm-bias=0 --bias=0 --mlp=swiglu
"$KILN" export --run="$T/olmo" --format=hf --out="$T/olmo.hf" >/dev/null 2>&1 || bad "export olmo"
grep -q '"OlmoForCausalLM"' "$T/olmo.hf/config.json" && ok || bad "olmo: config.json does not name OlmoForCausalLM"
"$KILN" import --from="$T/olmo.hf" --out="$T/olmo.back" >/dev/null 2>&1 || bad "import olmo"
"$KILN" sample --run="$T/olmo.back" --max-tokens=20 --device=cpu >"$T/olmo.sample" 2>&1 && ok || bad "sample of an imported run: $(cat "$T/olmo.sample")"
# the gpt2 tokenizer: the export has V = 50257 rows, kiln's run 50304
train gpt2bpe --tokenizer=gpt2 --layers=1 --dim=16 --heads=2
"$KILN" export --run="$T/gpt2bpe" --format=hf --out="$T/gpt2bpe.hf" --dtype=bf16 >/dev/null 2>&1 || bad "export gpt2bpe"
grep -q '"vocab_size":	50257' "$T/gpt2bpe.hf/config.json" && ok || bad "gpt2bpe: vocab_size is not 50257"
grep -q '"dtype":	"bfloat16"' "$T/gpt2bpe.hf/config.json" && ok || bad "gpt2bpe: --dtype=bf16 not recorded"
"$KILN" import --from="$T/gpt2bpe.hf" --out="$T/gpt2bpe.back" >/dev/null 2>&1 || bad "import gpt2bpe"
grep -q "^tokenizer = gpt2" "$T/gpt2bpe.back/config" && ok || bad "imported gpt2 run lost its tokenizer"

# refusals: one line, exit 2, naming the option
train alibi --pos=alibi
expect_error 2 "--pos=alibi has no equivalent" -- export --run="$T/alibi" --format=hf --out="$T/alibi.hf"
[ ! -e "$T/alibi.hf" ] && ok || bad "a refused export left $T/alibi.hf"
train par --block=parallel --pos=rope --norm=rmsnorm --mlp=swiglu
expect_error 2 "--block=parallel has no equivalent" -- export --run="$T/par" --format=hf --out="$T/par.hf"
expect_error 2 "missing --out=HF_DIR" -- export --run="$T/gpt2"
expect_error 2 "allowed values are hf" -- export --run="$T/gpt2" --format=onnx --out="$T/x"
expect_error 2 "no kiln run in '$T/none'" -- export --run="$T/none" --format=hf --out="$T/x"
expect_error 2 "already holds a kiln run" -- import --from="$T/gpt2.hf" --out="$T/gpt2"
expect_error 2 "missing --from=HF_DIR" -- import --out="$T/y"
# a directory into itself (also spelled otherwise) would overwrite the weights being read: refused, untouched
sum_hf=$(sha256sum "$T/gpt2.hf/model.safetensors")
expect_error 2 "is the Hugging Face model being imported (--out)" -- import --from="$T/gpt2.hf" --out="$T/gpt2.hf"
expect_error 2 "is the Hugging Face model being imported (--out)" -- import --from="$T/gpt2.hf" --out="$T/gpt2.hf/."
[ "$(sha256sum "$T/gpt2.hf/model.safetensors")" = "$sum_hf" ] && [ ! -e "$T/gpt2.hf/config" ] && ok ||
  bad "a refused import into its source changed it"
sum_run=$(sha256sum "$T/gpt2/model.safetensors")
expect_error 2 "is the run being exported (--out)" -- export --run="$T/gpt2" --format=hf --out="$T/gpt2"
[ "$(sha256sum "$T/gpt2/model.safetensors")" = "$sum_run" ] && ok || bad "a refused export into its run changed it"
expect_error 2 "bad token list" -- logits --run="$T/gpt2" --tokens=1,x
expect_error 2 "exactly one of --tokens" -- logits --run="$T/gpt2"

# kiln info prices the presets (counts derived in docs/models.md and tests/unit/run/test_presets.c)
for pc in olmo-1b:1176832000 olmo-7b:6888361984 llama-1b:1179191296 llama-8b:7391678464; do
  p=${pc%%:*} n=${pc##*:}
  "$KILN" info --preset="$p" >"$T/info" 2>&1 || bad "kiln info --preset=$p failed"
  grep -q "^parameters: $n " "$T/info" && ok || bad "$p: $(grep '^parameters' "$T/info"), expected $n"
  grep -q "^FLOPs per token" "$T/info" && grep -q "total" "$T/info" && ok || bad "$p: no FLOPs or memory"
done

finish
