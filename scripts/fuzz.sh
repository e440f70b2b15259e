#!/usr/bin/env bash
# Builds the executable loader's libFuzzer target with clang
# (-fsanitize=fuzzer,address,undefined) in build-fuzz/ and runs it for
# SECONDS (default 60) on the seed corpus (fuzz/corpus: valid executables)
# and the regression corpus (tests/executable/corpus: malformed ones).
# New interesting inputs go to build-fuzz/corpus; a crash leaves
# build-fuzz/crash-* and makes this script fail.
# Usage: scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
jobs=$(nproc)

cmake -S fuzz -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ >/dev/null
ninja -C build-fuzz -j "$jobs" tern_loader_fuzzer

mkdir -p build-fuzz/corpus
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
echo "=== fuzzing the executable loader for ${seconds} s ==="
build-fuzz/tern_loader_fuzzer build-fuzz/corpus fuzz/corpus tests/executable/corpus \
  -max_total_time="$seconds" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
  -artifact_prefix=build-fuzz/ -print_final_stats=1
echo "=== fuzzing ran clean ==="
