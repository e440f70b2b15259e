#!/usr/bin/env bash
# Sets up tern, builds it, and runs the demo: list the simulated devices; copy
# data host -> device -> device -> host and check it; build, load and run a
# vector add; write a 2-layer MLP executable, run it on an input and check its
# output against a host reference; and dump the MLP executable.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
ninja -C build -j "$(nproc)" hello_devices copy_roundtrip vector_add mlp_gen run_model tern_cli

export TERN_SIM_NODE=${TERN_SIM_NODE:-demo}
work=$(mktemp -d "${TMPDIR:-/tmp}/tern-demo-XXXXXX")
trap 'rm -rf "$work"' EXIT

echo "--- examples/hello_devices.c ---"
build/examples/hello_devices
echo "--- examples/copy_roundtrip.c ---"
build/examples/copy_roundtrip
echo "--- examples/vector_add.c ---"
build/examples/vector_add
echo "--- examples/mlp_gen.c: a 2-layer MLP with seeded weights ---"
build/examples/mlp_gen "$work/mlp.tern" "$work/x.npy" "$work/y_expected.npy"
echo "--- examples/run_model.c: run it and check the output against the reference ---"
build/examples/run_model "$work/mlp.tern" "$work/x.npy" --expect "$work/y_expected.npy" \
  --output-dir "$work" --repeat 10
echo "--- tern dump: what the MLP executable holds ---"
build/tools/tern dump "$work/mlp.tern"
