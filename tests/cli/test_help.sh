#!/usr/bin/env bash
# Help for every command, and "did you mean" for a misspelled command or option: `kiln help C`, `kiln C --help`
# and `kiln C -h` each print C's usage on stdout and exit 0, for every command `kiln help` lists; a command
# or option one slip away from a real one is named in the error.
source "$(dirname "$0")/lib.sh" help "$@"

"$KILN" help >"$T/help" 2>"$T/help.err" && ok || bad "kiln help exited $?"
cmds=$(awk '/^commands:/ {m = 1; next} m && /^  [a-z]/ {print $1} m && /^$/ {exit}' "$T/help")
[ "$(echo "$cmds" | wc -w)" -ge 12 ] && ok || bad "kiln help lists $(echo "$cmds" | wc -w) commands: $cmds"
for c in $cmds; do
  for form in "help $c" "$c --help" "$c -h"; do
    # shellcheck disable=SC2086
    "$KILN" $form >"$T/out" 2>"$T/err" </dev/null
    rc=$?
    if [ "$rc" -ne 0 ]; then bad "kiln $form exited $rc: $(head -c 300 "$T/err")"; continue; fi
    if ! grep -q "kiln $c\b" "$T/out"; then bad "kiln $form: its usage does not name 'kiln $c': $(head -2 "$T/out")"; continue; fi
    [ -s "$T/err" ] && { bad "kiln $form wrote on stderr: $(head -2 "$T/err")"; continue; }
    ok
  done
done
# the help lists what it accepts (a command's options, not only its name)
"$KILN" help plot | grep -q -- '--bars' && ok || bad "kiln help plot does not list --bars"
"$KILN" help train | grep -q -- 'max-steps' && ok || bad "kiln help train does not list max-steps"

# did you mean: commands (kiln and kiln help) and each command's options
expect_error 2 "unknown command 'trian' (kiln): did you mean 'train'?" -- trian
expect_error 2 "unknown command 'smaple' (kiln): did you mean 'sample'?" -- smaple
expect_error 2 "unknown command 'plto' (kiln help): did you mean 'plot'?" -- help plto
expect_error 2 "unknown command 'fly' (kiln): there is no such command" -- fly
expect_error 2 "did you mean 'max-steps'" -- train --max-step=3
expect_error 2 "did you mean 'temperature'" -- sample --run="$T" --tempreture=1
expect_error 2 "did you mean 'shard-tokens'" -- tokenize --out="$T/tok" --shard-token=3 "$T/x.txt"
expect_error 2 "did you mean 'dtype'" -- export --run="$T" --out="$T/hf" --dtyp=bf16
expect_error 2 "did you mean 'text'" -- logits --run="$T" --txt=hello
expect_error 2 "did you mean 'vocab'" -- encode --vocb=x
expect_error 2 "did you mean 'width'" -- plot "$T" --out="$T/x.png" --widht=800
# nothing close: the list of what is allowed, no guess
expect_error 2 "unknown option 'colour' (kiln plot): allowed are" -- plot "$T" --out="$T/x.png" --colour=red
finish
