#!/usr/bin/env bash
# Installs the build into a temporary prefix, then builds and runs a consumer
# project with find_package(tern) and with pkg-config. Also checks that
# libtern exports only tern_* symbols and carries a SONAME.
set -euo pipefail
build_dir=$1
source_dir=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
lib=$(ls "$work"/prefix/lib*/libtern.so.0)
readelf -d "$lib" | grep -q 'SONAME.*libtern.so.0' || { echo "libtern has no SONAME libtern.so.0"; exit 1; }
bad=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVW]$/ && $3 !~ /^tern_/ {print $3}')
if [ -n "$bad" ]; then echo "libtern exports non-tern symbols:"; echo "$bad"; exit 1; fi

export PKG_CONFIG_PATH="$(dirname "$lib")/pkgconfig"
cmake -S "$source_dir/consumer" -B "$work/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_BUILD_RPATH="$(dirname "$lib")" >/dev/null
ninja -C "$work/consumer" >"$work/build.log" || { cat "$work/build.log"; exit 1; }
"$work/consumer/consumer_cmake"
"$work/consumer/consumer_pkgconfig"
echo "install test passed"
