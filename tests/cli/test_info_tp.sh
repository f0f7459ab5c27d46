#!/usr/bin/env bash
# kiln info plans tensor-parallel layouts for worlds larger than this machine: the presets of the largest
# models at 64 and 256 ranks, the per-rank memory falling as the data-parallel ranks grow, Megatron's sequence
# parallelism holding fewer activations than every rank holding every row, and layouts that cannot be made
# refused in one line.
source "$(dirname "$0")/lib.sh" info_tp "$@"

# plan PRESET WORLD FLAGS...: the per-rank GiB kiln info plans on the GPU (and the TP line), into $gib
plan() {
  local preset=$1 world=$2
  shift 2
  "$KILN" info --preset="$preset" --world="$world" "$@" >"$T/out" 2>"$T/err" ||
    { bad "kiln info --preset=$preset --world=$world $*: $(head -2 "$T/err")"; gib=; return; }
  gib=$(grep -A8 '^per rank (cuda' "$T/out" | grep -o 'per rank: [0-9]* bytes ([0-9.]* GiB) on the gpu' |
    grep -o '([0-9.]*' | tr -d '(')
  [ -n "$gib" ] || bad "kiln info --preset=$preset --world=$world $*: no per-rank GPU plan"
}
gt() { python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) > float(sys.argv[2]) else 1)" "$1" "$2"; }

for p in llama-70b gpt-25b gpt-33b; do
  plan "$p" 64 --tp=8 --zero=3 --recompute=selective
  g64=$gib
  grep -q "tensor parallelism: tp 8 x 8 " "$T/out" && ok || bad "$p at 64 ranks: no tensor-parallel line"
  plan "$p" 256 --tp=8 --zero=3 --recompute=selective
  g256=$gib
  [ -n "$g64" ] && [ -n "$g256" ] && gt "$g64" "$g256" && ok ||
    bad "$p: the per-rank plan at 256 ranks ($g256 GiB) is not below 64's ($g64 GiB)"
done
# llama-70b at 64 ranks fits an 80 GB GPU under tp 8 x ZeRO-3
plan llama-70b 64 --tp=8 --zero=3 --recompute=selective
[ -n "$gib" ] && gt 70 "$gib" && ok || bad "llama-70b, tp 8 x ZeRO-3 over 64 ranks: $gib GiB a rank"
# the sequence split holds fewer activations than every rank holding every row
acts() { grep -A8 '^per rank (cuda' "$T/out" | grep -o 'activations [0-9.]* GiB' | grep -o '[0-9.]*'; }
plan llama-8b 4 --tp=4 --recompute=none
a_sp=$(acts)
plan llama-8b 4 --tp=4 --tp-sp=0 --recompute=none
a_all=$(acts)
[ -n "$a_sp" ] && [ -n "$a_all" ] && gt "$a_all" "$a_sp" && ok ||
  bad "llama-8b at tp 4: activations with the sequence split ($a_sp GiB) not below without it ($a_all GiB)"
# layouts that cannot be made
expect_error 2 "heads 64 split 3 ways" -- info --preset=llama-70b --tp=3 --world=3
expect_error 2 "world of 12 ranks is not a multiple" -- info --preset=llama-70b --tp=8 --world=12
expect_error 2 "mlp-hidden 66 split 4 ways" -- info --preset=shakespeare-char --mlp-hidden=66 --tp=4 --world=4
expect_error 2 "padded vocabulary 66 split 4 ways" -- info --preset=shakespeare-char --vocab-multiple=66 --tp=4 --world=4
expect_error 2 "qk-norm with heads split" -- info --preset=shakespeare-char --qk-norm=1 --tp=2 --world=2
finish
