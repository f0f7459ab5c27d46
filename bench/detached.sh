#!/usr/bin/env bash
# A run longer than the remote shell that starts it may live (say a 10-minute limit a command): started in a
# process group of its own (setsid), which goes on running when the starting command returns, and waited for
# by later commands, each within its own limit. For one training step of the 1.3B shape at 1M tokens on one
# GPU (12-15 minutes) or 2M on 4 (docs/long_context.md).
#   bash bench/detached.sh start NAME -- COMMAND...   starts COMMAND (in the repository root) and returns
#   bash bench/detached.sh wait NAME SECONDS          waits up to SECONDS for it; exit 0 once it has ended
#                                                     (its status in $DIR/NAME/rc), 3 while it still runs
#   bash bench/detached.sh stop NAME                  ends it (its whole process group)
# Its output goes to $DIR/NAME/log (DIR: KILN_DETACHED_DIR, /tmp/kiln-detached); wait prints the log's last
# lines and copies it to $OUT/NAME.log when OUT is set.
set -u
cd "$(dirname "$0")/.." || exit 1
DIR=${KILN_DETACHED_DIR:-/tmp/kiln-detached}
die() {
  echo "bench/detached.sh: $*" >&2
  exit 2
}
[ $# -ge 2 ] || die "usage: start NAME -- COMMAND... | wait NAME SECONDS | stop NAME"
verb=$1 name=$2
shift 2
[[ $name =~ ^[A-Za-z0-9_.-]+$ ]] || die "NAME '$name': letters, digits, '_', '.' and '-' only"
d="$DIR/$name"
case $verb in
start)
  [ "${1:-}" = -- ] && shift
  [ $# -ge 1 ] || die "start $name: no command after --"
  [ -f "$d/pid" ] && [ ! -f "$d/rc" ] && kill -0 "$(cat "$d/pid")" 2>/dev/null &&
    die "start $name: already running (pid $(cat "$d/pid"))"
  rm -rf "$d"
  mkdir -p "$d" || die "start $name: cannot create $d"
  printf '%q ' "$@" >"$d/cmd"
  # the new process group (setsid) outlives this command; its leader writes its pid (the group's id), and rc
  # appears once the command has ended
  # shellcheck disable=SC2016 # (expanded by the inner shell)
  setsid bash -c 'echo $$ >"$1/pid"; bash "$1/cmd" >"$1/log" 2>&1 </dev/null; echo $? >"$1/rc.tmp"; mv "$1/rc.tmp" "$1/rc"' \
    _ "$d" </dev/null >/dev/null 2>&1 &
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    [ -s "$d/pid" ] && break
    sleep 0.2
  done
  [ -s "$d/pid" ] || die "start $name: the process group did not start"
  echo "$name: started (process group $(cat "$d/pid")), log $d/log"
  ;;
wait)
  secs=${1:-}
  [[ $secs =~ ^[0-9]+$ ]] || die "wait $name: SECONDS '$secs' is not a whole number"
  [ -f "$d/pid" ] || die "wait $name: nothing was started under $d"
  end=$(($(date +%s) + secs))
  while [ ! -f "$d/rc" ] && [ "$(date +%s)" -lt "$end" ]; do
    sleep 2
  done
  [ -n "${OUT:-}" ] && cp "$d/log" "$OUT/$name.log" 2>/dev/null
  tail -5 "$d/log" 2>/dev/null
  if [ -f "$d/rc" ]; then
    echo "$name: ended, exit $(cat "$d/rc")"
    exit 0
  fi
  echo "$name: still running after ${secs} s"
  exit 3
  ;;
stop)
  [ -f "$d/pid" ] || die "stop $name: nothing was started under $d"
  kill -- -"$(cat "$d/pid")" 2>/dev/null || kill "$(cat "$d/pid")" 2>/dev/null
  echo "$name: stopped"
  ;;
*) die "unknown verb '$verb' (start, wait, stop)" ;;
esac
