#!/usr/bin/env bash
# kiln for a dry run of the bench scripts (KILN_DRY=1): `train ARGS` and `launch [--nproc-per-node=N ...] --
# ARGS` become `kiln info [--world=N] ARGS`, which parses and validates ARGS as a run would and plans it, but
# trains nothing; a refusal is noted in $KILN_DRY_LOG (with the arguments) and exits as the run would have,
# and each accepted run in $KILN_DRY_CHECKED where set.
# Anything else (doctor, ...) goes to the real kiln ($KILN_REAL).
set -u
real=${KILN_REAL:?KILN_REAL names the kiln binary}
log=${KILN_DRY_LOG:-/dev/stderr}
world=${OMPI_COMM_WORLD_SIZE:-${PMI_SIZE:-1}} # (under mpirun, its world)
case "${1:-}" in
train) shift ;;
launch)
  shift
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    case $1 in --nproc-per-node=*) world=${1#*=} ;; esac
    shift
  done
  [ $# -gt 0 ] && shift # the --
  ;;
*) exec "$real" "$@" ;;
esac
if ! out=$("$real" info --world="$world" "$@" 2>&1 >/dev/null); then
  printf 'refused (world %s): %s\n  %s\n' "$world" "$*" "$(printf '%s' "$out" | head -2)" >>"$log"
  exit 2
fi
[ -n "${KILN_DRY_CHECKED:-}" ] && printf 'world %s: %s\n' "$world" "$*" >>"$KILN_DRY_CHECKED"
exit 0
