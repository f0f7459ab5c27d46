#!/usr/bin/env bash
# For the GPU machine (Ubuntu, no network, no apt): unpack the -dev packages that were fetched beforehand with
#   (cd .debs && apt-get download libpcre2-dev libpcre2-8-0 libcjson-dev libcjson1 libcmocka-dev libcmocka0 liblzma-dev)
# into a prefix, and print the environment that points CMake and the loader at it. Usage:
#   eval "$(bash scripts/gpu-deps.sh .debs /tmp/kiln-deps)"
set -euo pipefail
debs=${1:-.debs}
prefix=${2:-/tmp/kiln-deps}
mkdir -p "$prefix"
for f in "$debs"/*.deb; do
  dpkg -x "$f" "$prefix"
done
lib="$prefix/usr/lib/x86_64-linux-gnu"
echo "export KILN_DEPS_PREFIX=$prefix"
echo "export CMAKE_PREFIX_PATH=$prefix/usr\${CMAKE_PREFIX_PATH:+:\$CMAKE_PREFIX_PATH}"
echo "export LD_LIBRARY_PATH=$lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
