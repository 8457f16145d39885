#!/usr/bin/env bash
# Installs what the build needs (Debian 12 packages, via apt, only if missing) and builds
# into build/: one target when its name comes first (`tools/build.sh wxe`: the command line
# only), else everything (wxe, the tests, the fuzz binary).
# Usage: tools/build.sh [TARGET] [extra cmake args]
set -euo pipefail
cd "$(dirname "$0")/.."
target=()
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
  target=(--target "$1")
  shift
fi
packages=(build-essential cmake libprotobuf-dev protobuf-compiler libonnx-dev libdnnl-dev
          libcli11-dev libgtest-dev zlib1g-dev libopenmpi-dev openmpi-bin
          libplplot-dev plplot-driver-cairo libplplot-data libpng-dev libnetcdf-dev libyaml-cpp-dev
          libblosc-dev libzstd-dev)
# a full build's tests also compile the CPU kernels for aarch64 (tests/portable_simd_test.sh)
[ ${#target[@]} -eq 0 ] && [ "$(uname -m)" = x86_64 ] && packages+=(g++-aarch64-linux-gnu)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "build.sh: installing ${missing[*]}" >&2
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -q "${missing[@]}"
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j"$(nproc)" "${target[@]}"
