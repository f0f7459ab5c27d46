#!/usr/bin/env bash
# --recompute as a user meets it: a bad value names the allowed ones, and kiln info's CUDA plan shrinks with
# each mode (act keeps the MLP activation's input only, mlp keeps neither per layer, block only the residual);
# the default is act.
source "$(dirname "$0")/lib.sh" recompute "$@"

expect_error 2 "allowed values are none,mlp,block,act" -- train --recompute=gelu
expect_error 2 "allowed values are none,mlp,block,act" -- info --recompute=

acts() { "$KILN" info --preset=gpt2-124m --batch=8 --seq=1024 "$@" |
  awk '/^memory \(cuda/ {m = 1} m && /^  activations/ {print $2; exit}'; }
none=$(acts --recompute=none)
act=$(acts --recompute=act)
default=$(acts)
[ "$default" = "$act" ] && ok || bad "default plan $default GiB, --recompute=act $act GiB: act should be the default"
mlp=$(acts --recompute=mlp)
block=$(acts --recompute=block)
python3 -c "import sys; n, a, m, b = map(float, sys.argv[1:]); assert n > a > m > b > 0, (n, a, m, b)" \
  "$none" "$act" "$mlp" "$block" && ok || bad "activation plans none $none, act $act, mlp $mlp, block $block GiB"

finish
