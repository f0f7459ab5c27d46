#!/usr/bin/env bash
# For the GPU machine (Ubuntu, no network, no apt): unpack the -dev packages that were fetched beforehand with
#   (cd .debs && apt-get download libpcre2-dev libpcre2-8-0 libcjson-dev libcjson1 libcmocka-dev libcmocka0 liblzma-dev)
# and, for --tensorboard and kiln plot, the packages (and the runtime libraries Ubuntu 24.04 lacks) of
#   (cd .debs && apt-get download libprotobuf-c-dev libprotobuf-c1 protobuf-c-compiler \
#      libplplot-dev libplplot17 libplplot-data plplot-driver-cairo libcsirocsa0 libcsironn0 libqsastime0 libshp2 \
#      libqhull-r8.0 libcairo2 libpango-1.0-0 libpangocairo-1.0-0 libpangoft2-1.0-0 libharfbuzz0b libfontconfig1 \
#      libfribidi0 libthai0 libdatrie1 libthai-data libpixman-1-0 libgraphite2-3 libxcb-shm0 libxcb-render0 \
#      libxrender1 libglib2.0-0 libfreetype6 fontconfig-config fonts-dejavu-core)
# into a prefix, and print the environment that points CMake, the loader, PLplot and fontconfig at it. Usage:
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
if [ -x "$prefix/usr/bin/protoc-c" ]; then
  echo "export PATH=$prefix/usr/bin:\$PATH"
fi
# PLplot looks for its drivers and data where Debian installs them, unless told otherwise
for d in "$lib"/plplot*/drivers; do
  [ -d "$d" ] && echo "export PLPLOT_DRV_DIR=$d"
done
for d in "$prefix"/usr/share/plplot[0-9]*; do
  [ -d "$d" ] && echo "export PLPLOT_LIB=$d"
done
# fontconfig (the plot's text): the unpacked fonts, with a cache inside the prefix
if [ -d "$prefix/usr/share/fonts" ]; then
  cat >"$prefix/fonts.conf" <<CONF
<?xml version="1.0"?>
<!DOCTYPE fontconfig SYSTEM "urn:fontconfig:fonts.dtd">
<fontconfig>
  <dir>$prefix/usr/share/fonts</dir>
  <cachedir>$prefix/var/cache/fontconfig</cachedir>
</fontconfig>
CONF
  echo "export FONTCONFIG_FILE=$prefix/fonts.conf"
fi
