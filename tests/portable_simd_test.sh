#!/usr/bin/env bash
# The x86 intrinsics have a portable path (kernels/cpu/simd.h), so the CPU kernels build for
# aarch64 (Grace, Neoverse) too: (1) on this machine, tests/portable_simd_check.cpp built with the
# x86 intrinsics and with the portable ones (WXE_PORTABLE_SIMD) prints the same bits for every
# intrinsic the kernels use; (2) with Debian's aarch64 cross compiler (g++-aarch64-linux-gnu,
# which tools/build.sh installs for a full build on x86), the check program and every source of
# kernels/cpu that uses them compile for aarch64. Exit 77 (skipped) without the cross compiler.
# Usage: portable_simd_test.sh SOURCE_DIR
set -u
src=$(cd "$1" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
cxx=${CXX:-c++}
if [ "$(uname -m)" = x86_64 ]; then
  if $cxx -std=c++17 -O2 -mavx -mfma -I"$src" "$src/tests/portable_simd_check.cpp" -o "$tmp/avx" &&
     $cxx -std=c++17 -O2 -mavx -mfma -DWXE_PORTABLE_SIMD -I"$src" "$src/tests/portable_simd_check.cpp" -o "$tmp/portable" &&
     "$tmp/avx" >"$tmp/avx.txt" && "$tmp/portable" >"$tmp/portable.txt" &&
     [ "$(wc -l <"$tmp/avx.txt")" -eq 16 ] && cmp -s "$tmp/avx.txt" "$tmp/portable.txt"; then
    echo "ok   portable intrinsics give the x86 ones' bits ($(wc -l <"$tmp/avx.txt") checks)"
  else
    echo "FAIL portable intrinsics differ from the x86 ones:"
    diff "$tmp/avx.txt" "$tmp/portable.txt"
    fails=$((fails + 1))
  fi
fi
a64=aarch64-linux-gnu-g++
[ "$(uname -m)" = aarch64 ] && a64=$cxx
if ! command -v "$a64" >/dev/null; then
  echo "skip aarch64: no $a64 (apt-get install g++-aarch64-linux-gnu)"
  exit $((fails > 0 ? 1 : 77))
fi
# oneDNN's headers are the same on every architecture: the host's, through a folder of their own
mkdir -p "$tmp/inc"
for h in /usr/include/oneapi /usr/include/dnnl*.h /usr/include/dnnl*.hpp; do [ -e "$h" ] && ln -s "$h" "$tmp/inc/"; done
files=(tests/portable_simd_check.cpp)
while IFS= read -r f; do files+=("$f"); done < <(cd "$src" && grep -l 'kernels/cpu/simd.h\|kernels/cpu/transpose.h' kernels/cpu/*.cpp | sort)
for f in "${files[@]}"; do
  if out=$("$a64" -std=c++17 -O2 -fopenmp -Wall -Wextra -Wno-unused-parameter -I"$src" -idirafter "$tmp/inc" \
           -c "$src/$f" -o "$tmp/obj.o" 2>&1); then
    echo "ok   aarch64: $f"
  else
    echo "FAIL aarch64: $f"
    echo "$out" | head -20
    fails=$((fails + 1))
  fi
done
exit $((fails > 0))
