#!/usr/bin/env bash
# Messages say what is really wrong: a directory given where files are expected (--data, kiln tokenize's
# inputs) and a --resume path that is no checkpoint (missing, a file, a run directory, any other directory)
# each give one line naming it, exit 2, and no word of a failing device or disk or of a checkpoint written
# incompletely; a checkpoint torn for real still says so.
source "$(dirname "$0")/lib.sh" messages "$@"
tiny=(--layers=2 --heads=2 --dim=32 --block-size=32 --seq=32 --batch=4 --threads=1 --eval-every=0 --quiet)
mkdir -p "$T/empty"
for i in $(seq 300); do echo "a line of text to tokenize, number $i"; done >"$T/t.txt"
"$KILN" tokenize --out="$T/tok" --tokenizer=char --val-tokens=500 --quiet "$T/t.txt" 2>"$T/err" || bad "tokenize: $(cat "$T/err")"

# misled: the line must not blame a device, the disk or a torn checkpoint
misled() { grep -qiE 'no such device|I/O error|check the disk|not written completely|corrupt' "$T/err"; }
# dir ARGS...: exit 2, one line naming the path as a directory, and nothing misleading
dir_error() {
  local what=$1
  shift
  expect_error 2 "$what" -- "$@"
  ! misled && ok || bad "kiln $*: misleading: $(cat "$T/err")"
}
# --data names the shards' directory: with char shards (their manifest is inside it), gpt2 ones, a trailing /
dir_error "token file is a directory ($T/tok): .*'$T/tok/train_\*.bin'" train "${tiny[@]}" --max-steps=1 --data="$T/tok"
dir_error "token file is a directory ($T/tok/): .*'$T/tok/train_\*.bin'" train "${tiny[@]}" --max-steps=1 --data="$T/tok/"
dir_error "token file is a directory ($T/empty)" train "${tiny[@]}" --max-steps=1 --tokenizer=gpt2 --data="$T/empty"
dir_error "token file is a directory ($T/tok)" train "${tiny[@]}" --max-steps=1 --data="$T/tok/train_*.bin" --val-data="$T/tok"
# kiln tokenize DIR
dir_error "input is a directory ($T/empty): .*'$T/empty/\*.txt'" tokenize --out="$T/o" "$T/empty"
dir_error "input is a directory ($T/empty)" tokenize --out="$T/o" "$T/t.txt" "$T/empty"
[ ! -e "$T/o/manifest.json" ] && ok || bad "tokenize wrote a manifest after a directory input"

# --resume=PATH that is no checkpoint
"$KILN" train "${tiny[@]}" --max-steps=2 --ckpt-every=2 --out="$T/run" 2>"$T/err" || bad "train: $(cat "$T/err")"
ck="$T/run/ckpt/step_00000002"
[ -f "$ck/state.json" ] && ok || bad "no checkpoint at $ck"
dir_error "no checkpoint ($T/nonexistent): the path does not exist" train "${tiny[@]}" --max-steps=4 --out="$T/r" --resume="$T/nonexistent"
dir_error "not a checkpoint ($ck/state.json): a file" train "${tiny[@]}" --max-steps=4 --out="$T/r" --resume="$ck/state.json"
dir_error "not a checkpoint ($T/run): a run directory" train "${tiny[@]}" --max-steps=4 --out="$T/r" --resume="$T/run"
dir_error "not a checkpoint ($T/empty): it holds no state.json" train "${tiny[@]}" --max-steps=4 --out="$T/r" --resume="$T/empty"
# a checkpoint directory whose state.json is gone is torn, and says so
cp -r "$ck" "$T/step_00000002"
rm "$T/step_00000002/state.json"
"$KILN" train "${tiny[@]}" --max-steps=4 --out="$T/r" --resume="$T/step_00000002" 2>"$T/err"
[ $? -eq 1 ] && grep -q "not written completely" "$T/err" && ok || bad "a torn checkpoint: $(cat "$T/err")"
# and the real one resumes
"$KILN" train "${tiny[@]}" --max-steps=4 --out="$T/r" --resume="$ck" 2>"$T/err" && ok || bad "resume: $(cat "$T/err")"
finish
