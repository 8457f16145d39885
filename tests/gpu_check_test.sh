#!/usr/bin/env bash
# tools/gpu_check.sh rehearsed where there is no GPU: it must stop at once with exit 77 and say
# why (never hang, never start a stage). Skipped (77) on a machine with an NVIDIA GPU, where the
# script would run its checks for real.
set -uo pipefail
src=${1:?usage: gpu_check_test.sh SOURCE_DIR}
if nvidia-smi -L 2>/dev/null | grep -q GPU; then echo "skipped: this machine has a GPU"; exit 77; fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
start=$(date +%s)
OUT=$out timeout 60 bash "$src/tools/gpu_check.sh" >"$out/stdout" 2>"$out/stderr"
rc=$?
took=$(( $(date +%s) - start ))
fails=0
[ "$rc" = 77 ] || { echo "FAIL: exit $rc, expected 77"; fails=1; }
grep -q "no NVIDIA GPU here" "$out/stderr" || { echo "FAIL: no reason given: $(cat "$out/stderr")"; fails=1; }
[ "$took" -le 10 ] || { echo "FAIL: took $took s to give up"; fails=1; }
[ -z "$(ls -A "$out" | grep -v -x -e stdout -e stderr)" ] || { echo "FAIL: wrote logs: $(ls "$out")"; fails=1; }
[ "$fails" = 0 ] && echo "gpu_check.sh without a GPU: exit 77 in $took s, reason given"
exit "$fails"
