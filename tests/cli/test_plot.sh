#!/usr/bin/env bash
# kiln train --tensorboard writes event files; kiln plot draws two runs into a PNG of the asked size, with the
# curves in their panels (decoded with netpbm's pngtopnm) and the x axis in tokens when asked; kiln plot --bars
# draws a CSV's columns as grouped bars, one panel each, with bar areas in proportion to the values; bad input
# is one line.
source "$(dirname "$0")/lib.sh" plot "$@"

small=(--max-steps=20 --layers=1 --dim=32 --heads=2 --seq=32 --batch=4 --eval-every=10)
# run a: 128 tokens a step; run b: 512 (--total-batch, two micro-steps of 8 sequences), with another learning
# rate, more memory and an MFU (from a made-up peak)
no_tb=0
if ! "$KILN" train "${small[@]}" --out="$T/a" --tensorboard="$T/tb" >"$T/a.log" 2>&1; then
  if grep -q 'not in this build' "$T/a.log"; then # kiln was built without protobuf-c
    no_tb=1
    rm -rf "$T/a"
    "$KILN" train "${small[@]}" --out="$T/a" >"$T/a.log" 2>&1 || bad "train a: $(tail -3 "$T/a.log")"
  else
    bad "train a: $(tail -3 "$T/a.log")"
  fi
fi
"$KILN" train "${small[@]}" --batch=8 --total-batch=512 --lr=1e-3 --peak-flops=1e9 --out="$T/b" >"$T/b.log" 2>&1 ||
  bad "train b: $(tail -3 "$T/b.log")"

# ---- TensorBoard event files -------------------------------------------------------------------
if [ "$no_tb" -eq 1 ]; then
  echo "kiln built without protobuf-c: only its one-line error is checked"
  expect_error 2 'protobuf-c' -- train "${small[@]}" --out="$T/c" --tensorboard="$T/tb"
else
  ev=$(ls "$T"/tb/events.out.tfevents.*."$(hostname)".*.kiln 2>/dev/null)
  if [ "$(echo "$ev" | grep -c kiln)" -eq 1 ]; then ok; else bad "expected one event file in $T/tb: $(ls "$T/tb")"; fi
  if grep -qa 'brain.Event:2' "$ev" && grep -qa 'train/loss' "$ev" && grep -qa 'val/loss' "$ev" &&
     grep -qa 'tensorboard = ' "$ev"; then ok; else bad "the event file lacks the version, scalars or config"; fi
  # an unwritable --tensorboard (a directory under a file) stops the run before its first step
  touch "$T/file"
  expect_error 1 '--tensorboard=' -- train "${small[@]}" --out="$T/d" --tensorboard="$T/file/sub"
fi

# ---- kiln plot: errors ----------------------------------------------------------------------------
expect_error 2 'missing --out' -- plot "$T/a"
expect_error 2 'no runs to plot' -- plot --out="$T/x.png"
expect_error 2 'bad value' -- plot "$T/a" --out="$T/x.png" --x=time
expect_error 2 'width' -- plot "$T/a" --out="$T/x.png" --width=5
expect_error 2 'unknown option' -- plot "$T/a" --out="$T/x.png" --colour=red
if "$KILN" plot "$T/a" --out="$T/x.png" >/dev/null 2>"$T/err" || ! grep -q 'not in this build' "$T/err"; then
  expect_error 2 "no run directory ($T/nope)" -- plot "$T/a" "$T/nope" --out="$T/x.png"
  mkdir -p "$T/empty" "$T/bad"
  expect_error 2 "$T/empty/metrics.jsonl" -- plot "$T/empty" --out="$T/x.png"
  : >"$T/empty/metrics.jsonl"
  expect_error 1 "no metrics ($T/empty/metrics.jsonl)" -- plot "$T/empty" --out="$T/x.png"
  { head -1 "$T/a/metrics.jsonl"; echo '{"step":2,"loss":'; } >"$T/bad/metrics.jsonl"
  expect_error 1 "$T/bad/metrics.jsonl:2" -- plot "$T/a" "$T/bad" --out="$T/x.png"
  { head -1 "$T/a/metrics.jsonl"; echo '{"loss":3}'; } >"$T/bad/metrics.jsonl"
  expect_error 1 'no numeric "step"' -- plot "$T/bad" --out="$T/x.png"
  expect_error 1 'cannot write the plot' -- plot "$T/a" --out="$T/no/such/dir/x.png"
  # --bars: a CSV with a header row; a bad row or value names the file and line
  printf 'strategy,recompute,tokens_per_s\none,none,1\n' >"$T/ok.csv"
  expect_error 2 'with --bars' -- plot "$T/a" --bars="$T/ok.csv" --out="$T/x.png"
  expect_error 2 'without --bars' -- plot "$T/a" --series=recompute --out="$T/x.png"
  expect_error 2 "cannot read the CSV ($T/none.csv)" -- plot --bars="$T/none.csv" --out="$T/x.png"
  : >"$T/empty.csv"
  expect_error 1 "no data ($T/empty.csv)" -- plot --bars="$T/empty.csv" --out="$T/x.png"
  printf 'strategy,recompute,tokens_per_s\none,none,1\n\nDDP,none\n' >"$T/short.csv"
  expect_error 1 "$T/short.csv:4" -- plot --bars="$T/short.csv" --out="$T/x.png"
  printf 'strategy,recompute,tokens_per_s\none,none,1\nDDP,none,fast\n' >"$T/word.csv"
  expect_error 1 "$T/word.csv:3" -- plot --bars="$T/word.csv" --series=recompute --panels=tokens_per_s --out="$T/x.png"
  printf 'strategy,recompute,tokens_per_s\none,none,1\none,block,2\n' >"$T/dup.csv"
  expect_error 1 "duplicate bar ($T/dup.csv:3)" -- plot --bars="$T/dup.csv" --out="$T/x.png"
  expect_error 2 "no column 'ms'" -- plot --bars="$T/ok.csv" --panels=tokens_per_s,ms --out="$T/x.png"
  expect_error 2 "no column 'rc'" -- plot --bars="$T/ok.csv" --series=rc --out="$T/x.png"
else
  echo "kiln built without PLplot: only its one-line error is checked"
  expect_error 2 'libplplot-dev' -- plot "$T/a" --out="$T/x.png"
  finish || exit 1
  exit 77 # the pictures were not checked
fi

# ---- kiln plot: the picture -----------------------------------------------------------------------
if ! command -v pngtopnm >/dev/null; then
  echo "pngtopnm (netpbm) not installed: the pixels are not checked"
  finish
  exit 77
fi

# png_size FILE: "W H" from the IHDR chunk (bytes 16..23, big-endian)
png_size() {
  od -An -tu1 -j16 -N8 "$1" | awk '{print $1*16777216+$2*65536+$3*256+$4, $5*16777216+$6*65536+$7*256+$8}'
}

# panels FILE: for each of the 3x2 panels (row-major), "blue orange left blue_right orange_right": counts of
# pixels in the two runs' colours (the first two of the palette, blue and orange, allowing for antialiasing)
# and the leftmost coloured and rightmost blue and orange columns of the panel.
panels() {
  pngtopnm "$1" | pnmtopnm -plain | awk '
    NR == 1 { for (k = 0; k < 6; k++) { blue[k] = 0; orange[k] = 0; left[k] = 1e9; br[k] = -1; or_[k] = -1 }; next }
    {
      for (i = 1; i <= NF; i++) {
        if (nh < 3) { hdr[nh++] = $i; W = hdr[0]; H = hdr[1]; continue }
        c[nc++] = $i
        if (nc < 3) continue
        nc = 0; r = c[0]; g = c[1]; b = c[2]
        x = p % W; y = int(p / W); p++
        k = int(3 * x / W) + 3 * int(2 * y / H)
        isb = (b > r + 80 && b > 120); iso = (r > b + 120 && r > 180)
        if (isb) { blue[k]++; if (x > br[k]) br[k] = x }
        if (iso) { orange[k]++; if (x > or_[k]) or_[k] = x }
        if ((isb || iso) && x < left[k]) left[k] = x
      }
    }
    END { for (k = 0; k < 6; k++) print blue[k], orange[k], left[k], br[k], or_[k] }'
}

"$KILN" plot "$T/a" "$T/b" --out="$T/step.png" --width=900 --height=600 >"$T/out" 2>"$T/err" ||
  bad "plot: $(cat "$T/err")"
"$KILN" plot "$T/a" "$T/b/" --out="$T/tokens.png" --x=tokens --height=600 --width=900 >"$T/out" 2>"$T/err" || bad "plot --x=tokens: $(cat "$T/err")"
if [ "$(png_size "$T/step.png")" = "900 600" ]; then ok; else bad "step.png is $(png_size "$T/step.png"), not 900 600"; fi
if [ "$(png_size "$T/x.png")" = "1500 900" ]; then ok; else bad "the default size is $(png_size "$T/x.png")"; fi

mapfile -t step < <(panels "$T/step.png")
mapfile -t tokens < <(panels "$T/tokens.png")
names=(loss lr grad_norm tokens_per_s mfu memory)
for k in 0 1 2 3 5; do
  read -r blue orange _ <<<"${step[$k]}"
  if [ "$blue" -gt 40 ] && [ "$orange" -gt 40 ]; then ok; else bad "panel ${names[$k]}: blue $blue, orange $orange pixels"; fi
done
# MFU: only run b logged one
read -r blue orange _ <<<"${step[4]}"
if [ "$blue" -eq 0 ] && [ "$orange" -gt 40 ]; then ok; else bad "panel mfu: blue $blue, orange $orange pixels"; fi
# lr panel: against steps both runs end at the right edge; against tokens run a (20 * 128 tokens) ends a quarter
# of the way to run b (20 * 512): (2560 - 128) / (10240 - 128) = 0.24 of the way from the left end
ratio() { awk -v s="$1" 'BEGIN { split(s, a, " "); printf "%.3f", (a[4] - a[3]) / (a[5] - a[3]) }'; }
r=$(ratio "${step[1]}")
if awk -v r="$r" 'BEGIN { exit !(r > 0.95 && r < 1.05) }'; then ok; else bad "against steps, run a ends at $r of run b"; fi
r=$(ratio "${tokens[1]}")
if awk -v r="$r" 'BEGIN { exit !(r > 0.18 && r < 0.30) }'; then ok; else bad "against tokens, run a ends at $r of run b"; fi

# ---- kiln plot --bars: the picture ----------------------------------------------------------------
# Two panels stacked; series "none" is blue and "block" orange. Panel 1: blue bars 1, 2, 4 and orange 2, 2, 2,
# all the same width, so the blue area is 7/6 of the orange (the legend adds the same small box of each);
# panel 2: the orange bars are missing (n/a and empty), so it has blue pixels and no orange ones.
cat >"$T/bars.csv" <<'CSV'
strategy,recompute,tokens_per_s,peak_device_bytes
one,none,1,1048576
one,block,2,n/a
DDP,none,2,2097152
DDP,block,2,
ZeRO-3,none,4,3145728
ZeRO-3,block,2,n/a
CSV
"$KILN" plot --bars="$T/bars.csv" --series=recompute --out="$T/bars.png" --width=800 --height=600 >"$T/out" 2>"$T/err" ||
  bad "plot --bars: $(cat "$T/err")"
if [ "$(png_size "$T/bars.png")" = "800 600" ]; then ok; else bad "bars.png is $(png_size "$T/bars.png"), not 800 600"; fi
if grep -q '2 panels of 3 bar groups' "$T/out"; then ok; else bad "plot --bars said: $(cat "$T/out")"; fi
# rows: the two stacked panels' "blue orange" pixel counts
mapfile -t bars < <(pngtopnm "$T/bars.png" | pnmtopnm -plain | awk '
  NR == 1 { next }
  { for (i = 1; i <= NF; i++) {
      if (nh < 3) { hdr[nh++] = $i; W = hdr[0]; H = hdr[1]; continue }
      c[nc++] = $i
      if (nc < 3) continue
      nc = 0; r = c[0]; g = c[1]; b = c[2]; y = int(p / W); p++; k = int(2 * y / H)
      if (b > r + 80 && b > 120) blue[k]++
      if (r > b + 120 && r > 180) orange[k]++
  } }
  END { for (k = 0; k < 2; k++) print blue[k] + 0, orange[k] + 0 }')
read -r blue orange <<<"${bars[0]}"
if [ "$orange" -gt 500 ] && awk -v b="$blue" -v o="$orange" 'BEGIN { r = b / o; exit !(r > 1.08 && r < 1.26) }'; then
  ok
else
  bad "panel tokens_per_s: blue $blue, orange $orange pixels, expected a ratio near 7/6"
fi
read -r blue orange <<<"${bars[1]}"
if [ "$blue" -gt 500 ] && [ "$orange" -eq 0 ]; then ok; else bad "panel peak_device_bytes: blue $blue, orange $orange pixels"; fi

finish || exit 1
[ "$no_tb" -eq 0 ] || exit 77 # the event files were not checked
