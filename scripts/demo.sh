#!/usr/bin/env bash
# Sets up tern, builds it, and runs the demo: list the simulated devices, then
# copy data host -> device -> device -> host and check it.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
ninja -C build -j "$(nproc)" hello_devices copy_roundtrip

export TERN_SIM_NODE=${TERN_SIM_NODE:-demo}
echo "--- examples/hello_devices.c ---"
build/examples/hello_devices
echo "--- examples/copy_roundtrip.c ---"
build/examples/copy_roundtrip
