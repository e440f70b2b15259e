#!/usr/bin/env bash
# Installs the Debian packages tern builds and tests with. Safe to run again:
# it only calls apt-get when something is missing.
#
# Every package the build, the tests, the demo and the benchmark scripts need is
# named here; nothing may rely on Recommends (the install runs with
# --no-install-recommends). In particular, Debian's libdnnl is built with the
# OpenCL GPU runtime: its CMake package (dnnl-config.cmake) calls
# find_package(OpenCL REQUIRED) and its imported target links OpenCL::OpenCL.
# tern uses only oneDNN's CPU engine, but the package is oneDNN's supported
# interface (it carries the version and the link line), so we install the
# OpenCL loader's development files (ocl-icd-opencl-dev, which libdnnl-dev only
# recommends) rather than bypass it with a hand-written find_library.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config clang-format
  libfabric-dev libhwloc-dev libspdlog-dev libfmt-dev libabsl-dev
  libgtest-dev libgmock-dev
  libflatbuffers-dev flatbuffers-compiler libxxhash-dev
  libdnnl-dev ocl-icd-opencl-dev  # oneDNN's CMake package links OpenCL::OpenCL (see below)
  libcli11-dev libncurses-dev nlohmann-json3-dev
  clang libclang-rt-14-dev     # the ASan build and the fuzzers (OpenMP: GCC's libgomp, as oneDNN)
  iproute2                     # collectives: the two-host test's network namespaces
  openmpi-bin libopenmpi-dev   # collectives: the comparison in scripts/bench-collectives.sh
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
echo "Installing: ${missing[*]}"
$sudo apt-get update -q
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
