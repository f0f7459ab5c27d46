# Shared by the tests/cli/test_*.sh scripts (sourced, not a test itself):
#   source "$(dirname "$0")/lib.sh" NAME "$@"
# sets KILN (the binary: $1 or $KILN) and T (a fresh temporary directory, removed on exit), counts checks
# with ok/bad, and `finish` prints the "N passed, N failed" line and sets the exit status.
set -u
KILN=${2:-${KILN:?}}
T=$(mktemp -d "/tmp/kiln_${1}_XXXXXX")
trap 'rm -rf "$T"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }

# flip_byte FILE POS: inverts the byte at POS (negative: from the end), so that the file surely changes (a
# fixed byte written there may be the one already there)
flip_byte() {
  python3 -c "import sys; p = int(sys.argv[2]); b = bytearray(open(sys.argv[1], 'rb').read()); b[p] ^= 0xFF
open(sys.argv[1], 'wb').write(b)" "$1" "$2"
}

# signal_twice PID RUN SIG: once RUN/metrics.jsonl has a line (training is under way), SIG twice at once to
# PID; leaves its exit status in $twice_rc.
signal_twice() {
  local pid=$1 run=$2 sig=$3
  for _ in $(seq 300); do [ -s "$run/metrics.jsonl" ] && break; sleep 0.01; done
  kill -"$sig" "$pid"
  kill -"$sig" "$pid"
  wait "$pid"
  twice_rc=$?
}

# term_twice PID ERRFILE WHAT: PID (a run stalled by --inject-stall, its stderr in ERRFILE) outlives one
# SIGTERM and ends within 5 s of a second, 1.2 s later (one within a second is the same request twice);
# checks both, and leaves the exit status in $term_rc.
term_twice() {
  local pid=$1 err=$2 what=$3
  for _ in $(seq 500); do grep -q "inject-stall: sleeping" "$err" 2>/dev/null && break; sleep 0.01; done
  kill -TERM "$pid"
  sleep 1.2
  kill -0 "$pid" 2>/dev/null && ok || bad "$what ended on its first SIGTERM"
  kill -TERM "$pid"
  for _ in $(seq 500); do kill -0 "$pid" 2>/dev/null || break; sleep 0.01; done
  if kill -0 "$pid" 2>/dev/null; then
    kill -KILL "$pid"
    bad "$what outlived its second SIGTERM by 5 s"
  else
    ok
  fi
  wait "$pid"
  term_rc=$?
}

# expect_error EXIT_CODE PATTERN -- ARGS...: kiln exits with EXIT_CODE and prints exactly one line on stderr,
# starting with "error: " and containing PATTERN.
expect_error() {
  local code=$1 pat=$2
  shift 3
  "$KILN" "$@" >"$T/out" 2>"$T/err"
  local rc=$?
  if [ "$rc" -ne "$code" ]; then bad "kiln $* exited $rc, expected $code ($(cat "$T/err"))"; return; fi
  if [ "$(wc -l <"$T/err")" -ne 1 ]; then bad "kiln $* printed $(wc -l <"$T/err") lines on stderr, expected 1"; return; fi
  if ! grep -q -- "$pat" "$T/err"; then bad "kiln $*: '$pat' not in: $(cat "$T/err")"; return; fi
  if ! grep -q '^error: ' "$T/err"; then bad "kiln $*: message does not start with 'error: '"; return; fi
  ok
}

# same_run A B TOL: two run directories' losses, at the steps both logged, agree within TOL (relative), and
# their final weights (model.safetensors) within 50 TOL; prints the differences (python3).
same_run() {
  python3 - "$1" "$2" "$3" <<'PY'
import json, struct, sys
a, b, tol = sys.argv[1], sys.argv[2], float(sys.argv[3])
def losses(d):
    return {r["step"]: r["loss"] for r in map(json.loads, open(d + "/metrics.jsonl"))}
la, lb = losses(a), losses(b)
common = sorted(set(la) & set(lb))
assert common, "no common steps"
worst = max(abs(la[s] - lb[s]) / abs(la[s]) for s in common)
def weights(d):
    raw = open(d + "/model.safetensors", "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    body = raw[8 + n:]
    return struct.unpack("<%df" % (len(body) // 4), body)
wa, wb = weights(a), weights(b)
# The weights: within 50 tol, but for up to 1% of them, with the whole difference under 1% of the weights'
# norm. AdamW moves an element by about the learning rate the first time its gradient is clearly non-zero,
# whatever that gradient's size, so an element whose gradient is a near-cancelling sum can move the other way
# when the sum runs in another order (seen at 4 ranks: 137 of 33,664 elements 1-3e-3 apart after 12 steps at
# lr 3e-3, with the losses within 3e-6), and the steps after spread it a little. A fault (a stale bucket, a
# wrong slice) moves whole tensors by the learning rate a step, or leaves the losses.
if len(wa) != len(wb):
    print(f"{a.split('/')[-1]} vs {b.split('/')[-1]}: {len(wa)} weights against {len(wb)}")
    sys.exit(1)
diffs = [abs(x - y) for x, y in zip(wa, wb)]
wd, far = max(diffs), sum(d > 50 * tol for d in diffs)
rel = (sum(d * d for d in diffs) / max(sum(x * x for x in wa), 1e-30)) ** 0.5
print(f"{a.split('/')[-1]} vs {b.split('/')[-1]}: steps {common[0]}..{common[-1]}, worst loss rel diff {worst:.2e}, "
      f"weights max abs diff {wd:.2e}, {far} of {len(wa)} beyond {50 * tol:.0e}, relative norm {rel:.1e}")
sys.exit(0 if worst <= tol and far <= len(wa) // 100 and rel <= 1e-2 else 1)
PY
}

# same_weights A B: the tensors of two runs' model.safetensors are bitwise equal (the headers differ: they carry
# the data's hash and the run's config)
same_weights() {
  python3 - "$1" "$2" <<'PY'
import struct, sys
def body(d):
    raw = open(d + "/model.safetensors", "rb").read()
    return raw[8 + struct.unpack("<Q", raw[:8])[0]:]
sys.exit(0 if body(sys.argv[1]) == body(sys.argv[2]) else 1)
PY
}

finish() {
  echo "$pass passed, $fail failed"
  [ "$fail" -eq 0 ]
}

# need_mpirun: for the tests under mpirun. Skipped (exit 77) where there is none; OpenMPI may run as root and
# oversubscribe the cores; MPI holds the words every such test starts its ranks with.
need_mpirun() {
  if ! command -v mpirun >/dev/null; then
    echo "mpirun not found: skipped (scripts/install-deps.sh installs openmpi-bin)"
    exit 77
  fi
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  # shellcheck disable=SC2034 # (the sourcing test's)
  MPI=(mpirun --oversubscribe --bind-to none)
}

# test_seed: seed is KILN_TEST_SEED, else a fresh one, printed so that a failure can be run again
test_seed() {
  seed=${KILN_TEST_SEED:-$((RANDOM + 1))}
  echo "seed $seed"
}
