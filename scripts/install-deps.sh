#!/usr/bin/env bash
# Installs the Debian packages tern builds and tests with. Safe to run again:
# it only calls apt-get when something is missing.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config clang-format
  libfabric-dev libhwloc-dev libspdlog-dev libfmt-dev libabsl-dev
  libgtest-dev libgmock-dev
  libflatbuffers-dev flatbuffers-compiler libxxhash-dev libdnnl-dev
  libcli11-dev libncurses-dev nlohmann-json3-dev
  clang libclang-rt-14-dev
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
