#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (-fsanitize=fuzzer,address,undefined)
# in build-fuzz/ and runs them, one after the other, within SECONDS in all
# (default 60; each gets half, at least 1 s):
#   - the executable loader, on the seed corpus (fuzz/corpus: valid
#     executables) and the regression corpus (tests/executable/corpus:
#     malformed ones);
#   - the compiler's graph file reader, on fuzz/graph_corpus (valid graph
#     files, kept current by tern_compiler_graph_file_test).
# New interesting inputs go to build-fuzz/corpus and build-fuzz/graph_corpus;
# a crash leaves build-fuzz/crash-* (graph reader: build-fuzz/graph-crash-*)
# and makes this script fail.
# Usage: scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
jobs=$(nproc)
# libFuzzer reads -max_total_time=0 as "no limit": never hand it a 0.
graph_seconds=$((seconds / 2 > 0 ? seconds / 2 : 1))
loader_seconds=$((seconds - graph_seconds > 0 ? seconds - graph_seconds : 1))

cmake -S fuzz -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ >/dev/null
ninja -C build-fuzz -j "$jobs" tern_loader_fuzzer tern_graph_fuzzer

mkdir -p build-fuzz/corpus build-fuzz/graph_corpus
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
echo "=== fuzzing the executable loader for ${loader_seconds} s ==="
build-fuzz/tern_loader_fuzzer build-fuzz/corpus fuzz/corpus tests/executable/corpus \
  -max_total_time="$loader_seconds" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
  -artifact_prefix=build-fuzz/ -print_final_stats=1
echo "=== fuzzing the graph file reader for ${graph_seconds} s ==="
build-fuzz/tern_graph_fuzzer build-fuzz/graph_corpus fuzz/graph_corpus \
  -max_total_time="$graph_seconds" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
  -artifact_prefix=build-fuzz/graph- -print_final_stats=1
echo "=== fuzzing ran clean ==="
