#!/usr/bin/env bash
# kiln starts at once: `kiln --version` and `kiln help` answer in under 0.5 s (the best of 3; a generous bound
# for a busy machine, they take milliseconds), because the CUDA, NCCL and PLplot libraries are loaded only by
# the commands that use them. A training run on the CPU never loads the CUDA backend's module or libcudart,
# libcublas, libcublasLt or libnccl (the dynamic loader's own log, LD_DEBUG=libs, names every library it looks
# for); in a CUDA build, --device=cuda does load them (so the check can see a load) and, on a machine without
# a GPU, says so in one line. Without its module beside the binary, or a library the module needs,
# --device=cuda and kiln plot say so in one line.
source "$(dirname "$0")/lib.sh" startup "$@"

# best_ms CMD...: the shortest wall time of three runs of CMD, in milliseconds
best_ms() {
  local best=999999 t0 ms
  for _ in 1 2 3; do
    t0=$(date +%s%N)
    "$@" >/dev/null 2>&1
    ms=$((($(date +%s%N) - t0) / 1000000))
    [ "$ms" -lt "$best" ] && best=$ms
  done
  echo "$best"
}

for cmd in --version help; do
  "$KILN" $cmd >"$T/out" 2>&1 && grep -q . "$T/out" || bad "kiln $cmd failed: $(head -3 "$T/out")"
  ms=$(best_ms "$KILN" $cmd)
  echo "kiln $cmd: $ms ms (best of 3)"
  if [ "$ms" -lt 500 ]; then ok; else bad "kiln $cmd took $ms ms (best of 3), expected under 500"; fi
done

# ---- which libraries a run loads -------------------------------------------------------------------
GPU_LIBS='lib(cudart|cublas|cublasLt|nccl|kiln_cuda)\.so'
# loaded NAME ARGS...: runs kiln ARGS with the dynamic loader's log in $T/NAME.ld.* (one file per process);
# leaves kiln's exit status in $rc and its stderr in $T/NAME.err
loaded() {
  local name=$1
  shift
  LD_DEBUG=libs LD_DEBUG_OUTPUT="$T/$name.ld" "$KILN" "$@" >"$T/$name.out" 2>"$T/$name.err"
  rc=$?
  cat "$T/$name.ld".* >"$T/$name.log" 2>/dev/null
  # the log is there and names a library kiln links (OpenMP's), so that an empty log cannot pass
  grep -q 'libgomp' "$T/$name.log" || bad "$name: the loader's log names no libgomp: LD_DEBUG gave nothing?"
}

small=(--max-steps=2 --layers=1 --dim=32 --heads=2 --seq=32 --batch=4 --eval-every=0)
loaded cpu train --device=cpu "${small[@]}" --out="$T/cpu"
[ "$rc" -eq 0 ] || bad "train --device=cpu exited $rc: $(tail -3 "$T/cpu.err")"
if grep -qE "$GPU_LIBS" "$T/cpu.log"; then
  bad "a CPU run loaded GPU libraries: $(grep -oE "$GPU_LIBS[.0-9]*" "$T/cpu.log" | sort -u | tr '\n' ' ')"
else
  ok
fi
if grep -q 'libplplot' "$T/cpu.log"; then bad "a training run loaded PLplot"; else ok; fi

# --device=auto (the default) on a machine without an NVIDIA driver or GPU decides "cpu" without loading CUDA
if [ ! -e /proc/driver/nvidia ] && [ ! -e /dev/nvidiactl ] && [ ! -e /dev/dxg ] &&
   ! grep -qs 0x10de /sys/bus/pci/devices/*/vendor; then
  loaded auto train "${small[@]}" --out="$T/auto"
  [ "$rc" -eq 0 ] || bad "train (device auto) exited $rc: $(tail -3 "$T/auto.err")"
  if grep -qE "$GPU_LIBS" "$T/auto.log"; then bad "device auto loaded GPU libraries without a GPU"; else ok; fi
  loaded info info
  if grep -qE "$GPU_LIBS" "$T/info.log"; then bad "kiln info loaded GPU libraries without a GPU"; else ok; fi
  grep -q '^gpus: none' "$T/info.out" && ok || bad "kiln info: no 'gpus: none' line: $(grep gpus "$T/info.out")"
else
  echo "an NVIDIA driver or GPU is here: device auto may load CUDA; not checked"
fi

mkdir -p "$T/bin"
cp "$KILN" "$T/bin/kiln" # alone: no module beside it
if "$KILN" --version | grep -q '^backends: .*cuda'; then
  loaded cuda train --device=cuda "${small[@]}" --out="$T/cuda"
  grep -qE 'libcudart\.so' "$T/cuda.log" && ok || bad "--device=cuda loaded no libcudart: the check sees no loads"
  if [ "$rc" -ne 0 ]; then # no GPU here: the backend's own error, in one line
    if [ "$rc" -eq 1 ] && [ "$(wc -l <"$T/cuda.err")" -eq 1 ] &&
       grep -q '^error: device cuda (--device): no CUDA GPU is visible' "$T/cuda.err"; then
      ok
    else
      bad "train --device=cuda exited $rc: $(cat "$T/cuda.err")"
    fi
  fi
  KILN="$T/bin/kiln" expect_error 1 'libkiln_cuda.so): the module is missing' -- train --device=cuda \
    "${small[@]}" --out="$T/nomodule"
  # a library the module needs is missing (its name changed in a copy of the module): the loader's reason
  mkdir -p "$T/bin2"
  cp "$KILN" "$T/bin2/kiln"
  python3 -c "import sys; d = open(sys.argv[1], 'rb').read()
open(sys.argv[2], 'wb').write(d.replace(b'libnccl.so.2\0', b'libnccl.so.9\0'))" \
    "$(dirname "$KILN")/libkiln_cuda.so" "$T/bin2/libkiln_cuda.so"
  KILN="$T/bin2/kiln" expect_error 1 'cannot be loaded: libnccl.so.9: cannot open' -- train --device=cuda \
    "${small[@]}" --out="$T/nolib"
fi
if [ -e "$(dirname "$KILN")/libkiln_plot.so" ]; then
  KILN="$T/bin/kiln" expect_error 1 'libkiln_plot.so): the module is missing' -- plot --out="$T/p.png" \
    "$T/cpu"
fi

finish
