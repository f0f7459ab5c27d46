# shellcheck shell=bash
# Sourced by the bench scripts that build kiln on the GPU machine (run from the repository root).
# gpu_deps: the -dev packages scripts/gpu-deps.sh unpacks from .debs, where the machine lacks them.
# gpu_build [TARGET...]: configures $BUILD for Hopper (KILN_CUDA_ARCHS=${CUDA_ARCH:-90a}, Release) and builds
# the targets (every target when none), logging to $OUT/build.log; on failure prints the log's tail and exits 1.
gpu_deps() {
  if [ -d .debs ] && ! dpkg -s libcmocka-dev >/dev/null 2>&1; then
    eval "$(bash scripts/gpu-deps.sh .debs /tmp/kiln-deps)"
  fi
}

gpu_build() {
  local targets=()
  [ $# -gt 0 ] && targets=(-t "$@")
  if ! cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA_ARCHS="${CUDA_ARCH:-90a}" >"$OUT/build.log" 2>&1 ||
    ! cmake --build "$BUILD" -j "$(nproc)" "${targets[@]}" >>"$OUT/build.log" 2>&1; then
    tail -40 "$OUT/build.log"
    exit 1
  fi
}
