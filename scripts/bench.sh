#!/usr/bin/env bash
# Regenerates the figures of docs/runtime-bench.md and docs/executables-bench.md
# on this machine, in one go: a RelWithDebInfo build of the benchmarks in
# build-bench/, then the runtime benchmark (round trip, copies, allocation),
# the kernels benchmark (matmul, elementwise, overlap, the MLP from C) and
# the executable measurements (build + load, 256 MiB of constants), ROUNDS
# times each. Every run starts with the machine it ran on (CPU model,
# features, glibc's copy thresholds, build type, the DMA engine's copy
# strategy): figures from one machine do not hold on another.
#
# Usage: scripts/bench.sh [--rounds N] [--out DIR]   (default 2 rounds, bench-out/)
# Writes DIR/runtime-N.txt, DIR/kernels-N.txt, DIR/measure-N.txt and
# DIR/summary.md (the rows that the docs' tables quote, per run). Pause other
# jobs first: with two CPUs, one busy process halves a figure.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=2
out=bench-out
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: scripts/bench.sh [--rounds N] [--out DIR]" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
scripts/install-deps.sh
cmake -S . -B build-bench -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
ninja -C build-bench tern_bench_runtime tern_bench_kernels tern_exe_measure

summary="$out/summary.md"
{
  echo "# Benchmark runs ($(date -u +%Y-%m-%dT%H:%MZ))"
  echo
} >"$summary"
for run in $(seq 1 "$rounds"); do
  echo "=== run $run of $rounds ==="
  build-bench/bench/tern_bench_runtime | tee "$out/runtime-$run.txt"
  build-bench/bench/tern_bench_kernels | tee "$out/kernels-$run.txt"
  build-bench/tests/executable/tern_exe_measure | tee "$out/measure-$run.txt"
  {
    echo "## Run $run"
    echo
    echo '```'
    grep -h '^# machine:' "$out/runtime-$run.txt"
    grep -hE 'round trip|ratio|GB/s|us|target' "$out/runtime-$run.txt" "$out/kernels-$run.txt" \
      "$out/measure-$run.txt" | grep -v '^# machine:'
    echo '```'
    echo
  } >>"$summary"
done
echo "=== summary: $summary ==="
cat "$summary"
