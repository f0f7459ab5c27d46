#!/usr/bin/env bash
# Installs the Debian packages kiln needs to build and test, if any are missing.
# As root it runs apt-get; otherwise it prints the exact command to run.
set -euo pipefail
# protobuf-c: TensorBoard event files; PLplot with its cairo driver: kiln plot's PNGs; netpbm: test_plot reads
# the PNGs back
pkgs=(build-essential cmake pkg-config iproute2 util-linux libcmocka-dev libpcre2-dev libcjson-dev liblzma-dev libopenmpi-dev openmpi-bin
      libprotobuf-c-dev protobuf-c-compiler libplplot-dev plplot-driver-cairo netpbm)
missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ -n "${KILN_DEPS_PREFIX:-}" ]; then
  # A machine without apt (the GPU machine): scripts/gpu-deps.sh unpacked the packages into this prefix.
  exit 0
fi
cmd="apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || true
  $cmd -qq
else
  echo "install-deps: missing packages: ${missing[*]}" >&2
  echo "install-deps: run: sudo $cmd" >&2
  exit 1
fi
