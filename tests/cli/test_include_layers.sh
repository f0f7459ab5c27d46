#!/usr/bin/env bash
# The layers of docs/architecture.md, held by the code: every `#include "dir/..."` in src/ goes from a layer to
# one it may use, and never the other way. A new arrow is a decision: add it to ALLOWED below and to the
# architecture page's drawing in the same change. The check also proves it can fail: an include of cmd/ from
# model/, planted in a copy of the tree, must be refused.
source "$(dirname "$0")/lib.sh" include_layers "$@"
SRC=${KILN_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}/src

# layer: what it may include (util/ is open to every layer; a layer may include itself)
ALLOWED="
main: cmd
cmd: run interop parallel parallel/comm precision optim model data io core backend
run: parallel parallel/comm precision optim model data io core backend
interop: run model io core
parallel: parallel/comm optim model core
parallel/comm: io core
precision: model core
optim: model core
model: core
data: io core
io: core
core:
backend: core
backend/cpu: core
backend/cuda: core
"

check_tree() { # src dir -> prints each include that breaks the layers; fails if the check cannot run
  set -o pipefail
  (cd "$1" && grep -rnoE '#include "[a-z_]+/[^"]+"' --include='*.c' --include='*.h' --include='*.cu' \
    --include='*.cuh' .) | awk -v allowed="$ALLOWED" '
    function layer(p, a, n) { # a path under src/ (or an include path) -> its layer
      n = split(p, a, "/")
      if (p == "kiln.c") return "main"
      if (a[1] == "parallel" && a[2] == "comm" && n > 2) return "parallel/comm"
      if (a[1] == "backend" && (a[2] == "cpu" || a[2] == "cuda") && n > 2) return a[1] "/" a[2]
      return n > 1 ? a[1] : "?"
    }
    BEGIN {
      n = split(allowed, lines, "\n")
      for (i = 1; i <= n; i++) if (lines[i] ~ /:/) {
        split(lines[i], kv, ":"); m = split(kv[2], tgt, " ")
        ok[kv[1]] = 1
        for (j = 1; j <= m; j++) may[kv[1], tgt[j]] = 1
      }
    }
    {
      split($0, f, ":"); file = f[1]; sub(/^\.\//, "", file)
      inc = $0; sub(/^[^"]*"/, "", inc); sub(/".*$/, "", inc)
      from = layer(file); to = layer(inc)
      if (from != to && to != "util" && !((from, to) in may))
        print file ":" f[2] " includes " inc " (" from " -> " to ")"
    }'
}

out=$(check_tree "$SRC") || bad "the include check itself failed"
[ -z "$out" ] && ok || bad "includes across the layers: $out"

# nothing names the old folders
grep -rlE '#include "(dist|train)/' "$SRC" >"$T/old" && bad "includes of dist/ or train/: $(cat "$T/old")" || ok

# the check can fail: a copy of the tree with model/ including cmd/
cp -r "$SRC" "$T/src"
echo '#include "cmd/cmd.h"' >>"$T/src/model/config.c"
out=$(check_tree "$T/src")
[[ $out == *"model/config.c"*"(model -> cmd)"* ]] && ok || bad "a planted model -> cmd include went unseen: $out"

finish
