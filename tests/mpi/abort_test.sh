#!/bin/bash
# Failure handling of a whole MPI job (see abort_test.cpp).
# usage: abort_test.sh MPIEXEC BINARY [mpiexec flags...]
# Each job gets a hard time limit below the ctest TIMEOUT, so a hang is reported as such.
set -u
mpiexec=$1 bin=$2
shift 2
flags=("$@")
fails=0
out=$(mktemp)
trap 'rm -f "$out"' EXIT

run() {  # run NP ARGS...: sets rc, output in $out
  local np=$1
  shift
  timeout 60 "$mpiexec" -n "$np" "${flags[@]}" "$bin" "$@" >"$out" 2>&1
  rc=$?
}
bad() { echo "FAIL: $*"; sed 's/^/  | /' "$out"; fails=$((fails + 1)); }

# 1. rank 1 throws and aborts while rank 0 waits in all_reduce.
run 2 abort
if [ $rc -eq 124 ]; then bad "abort: job hung (killed by timeout)"
elif [ $rc -eq 0 ]; then bad "abort: job exited 0"
elif ! grep -q "wxe: error (rank 1): injected failure on rank 1" "$out"; then bad "abort: rank 1's message missing"
elif grep -q "returned from a collective" "$out"; then bad "abort: a rank got past the collective"
else echo "ok: abort ends the job (exit $rc) with rank 1's message"; fi

# 2. --tp 3 in a world of 4: every rank prints the same one-line error and exits non-zero.
run 4 mesh 3
n=$(grep -c "is not divisible by --tp 3" "$out")
if [ $rc -eq 124 ]; then bad "mesh: job hung"
elif [ $rc -eq 0 ]; then bad "mesh: job exited 0"
elif [ "$n" -ne 4 ] || ! grep -q "wxe: error (rank 3): world size 4 is not divisible by --tp 3" "$out"; then
  bad "mesh: expected the error from all 4 ranks, got $n"
else echo "ok: indivisible mesh fails on every rank (exit $rc)"; fi

# 3. and a dividing one works.
run 4 mesh 2
if [ $rc -ne 0 ] || [ "$(grep -c 'mesh dp 2 x tp 2' "$out")" -ne 4 ]; then bad "mesh 2x2: exit $rc"
else echo "ok: mesh dp 2 x tp 2"; fi

exit $((fails > 0))
