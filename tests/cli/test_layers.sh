#!/usr/bin/env bash
# Layering (docs/architecture.md): no KILN_* environment variable is read below run/ and cmd/. The knobs are read once,
# in run/knobs.c, and passed down as options; the launcher's variables are read in parallel/comm/env.c from
# an array it is given. A file under src/ outside src/run/ and src/cmd/ fails the check when it calls
# getenv("KILN_...") (or secure_getenv), or when it reads the environment at all (getenv, secure_getenv,
# environ) and names a "KILN_..." string, which a name held in a variable or a macro would be. The check runs
# first on a made-up tree that breaks the rule both ways, so that it is seen to fail.
source "$(dirname "$0")/lib.sh" layers "$@"
SRC=${KILN_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}

# violations ROOT: the offending files under ROOT/src, one a line
violations() {
  local root=$1
  local files=(--include='*.c' --include='*.h' --include='*.cu' --include='*.cuh' --include='*.cpp')
  {
    grep -rlE "${files[@]}" '\b(secure_)?getenv *\( *"KILN_' "$root/src"
    grep -rlE "${files[@]}" '\b((secure_)?getenv *\(|environ\b)' "$root/src" | while read -r f; do
      grep -q '"KILN_' "$f" && echo "$f"
    done
  } | grep -vE "^$root/src/(run|cmd)/" | sort -u
}

# the check itself: a made-up tree with a direct read, a name in a variable, one behind a macro, and the same
# reads where they are allowed
mkdir -p "$T/fake/src/backend/cuda" "$T/fake/src/data" "$T/fake/src/parallel" "$T/fake/src/run" "$T/fake/src/cmd"
echo 'static int v(void) { return getenv("KILN_ATTN") != 0; }' >"$T/fake/src/backend/cuda/direct.cu"
printf 'static const char *name = "KILN_SOURCE_DIR";\nconst char *dir(void) { return getenv(name); }\n' \
  >"$T/fake/src/data/variable.c"
printf '#define DELAY "KILN_COMM_DELAY_US"\nint d(void) { return atoi(secure_getenv(DELAY)); }\n' \
  >"$T/fake/src/parallel/macro.h"
echo 'int k(void) { return getenv("KILN_ATTN") != 0; }' >"$T/fake/src/run/knobs.c"
echo 'int l(void) { return getenv("KILN_LAUNCH_EXE") != 0; }' >"$T/fake/src/cmd/launch.c"
echo 'int e(void) { return getenv("HOME") != 0; } // KILN_ in a comment is no read' >"$T/fake/src/data/other.c"
got=$(violations "$T/fake" | sed "s|^$T/fake/||" | tr '\n' ' ')
want="src/backend/cuda/direct.cu src/data/variable.c src/parallel/macro.h "
[ "$got" = "$want" ] && ok || bad "the check on a made-up tree found '$got', expected '$want'"

# the real tree
found=$(violations "$SRC")
[ -z "$found" ] && ok || bad "KILN_* variables read below run/ and cmd/ (pass them down from run/knobs.c): $found"
# and the knobs' reader is where the rule says it is
grep -q 'kiln_knobs_read' "$SRC/src/run/knobs.c" && ok || bad "src/run/knobs.c has no kiln_knobs_read"

finish
