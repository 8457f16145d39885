#!/usr/bin/env bash
# Ranks started with different options (issue 41): infer, forecast and finetune compare their
# options over the world once at start-up, before any other collective, and every rank stops
# with one line naming the option and both values: no hang, no crash, no mixed output.
# Usage: options_test.sh MPIEXEC WXE SOURCE_DIR
set -u
mpiexec=$1 wxe=$2 src=$3
d=$src/tests/data
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
model=$src/models/wxformer_tiny/model.onnx
# x2.npy: x.npy with its last value changed (a copy at another path would agree: files are
# compared by their contents, so node-local copies are fine)
cp "$src/models/wxformer_tiny/x.npy" "$tmp/x2.npy"
size=$(wc -c <"$tmp/x2.npy")
printf '\x00\x00\x80\x3f' | dd of="$tmp/x2.npy" bs=1 seek=$((size - 4)) conv=notrunc status=none
cp "$src/models/wxformer_tiny/x.npy" "$tmp/x_copy.npy"
cfg=$d/era5_tiny/config.yml
# differ NAME WANT COMMON... -- RANK0 -- RANK1: rank 0 and rank 1 given COMMON plus their own
# options must both fail (exit not 0, not a timeout, no signal) with WANT in the error
differ() {
  local name=$1 want=$2; shift 2
  local common=() a=() b=()
  while [ "$1" != "--" ]; do common+=("$1"); shift; done; shift
  while [ "$1" != "--" ]; do a+=("$1"); shift; done; shift
  b=("$@")
  timeout 120 "$mpiexec" --oversubscribe -n 1 "$wxe" "${common[@]}" "${a[@]}" : -n 1 "$wxe" "${common[@]}" "${b[@]}" \
    >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $rc -lt 128 ] && grep -qF -- "$want" "$tmp/err" \
     && ! grep -q "internal error" "$tmp/err"; then
    echo "ok   $name"
  else
    echo "FAIL $name (exit $rc)"; cat "$tmp/err"; fails=$((fails + 1))
  fi
}
inf=(infer "$model" --threads 1 -o "$tmp/y.npy")
differ infer-tp-vs-domain "rank 1 was started with another --tp than rank 0 ('1' on rank 1, '2' on rank 0)" \
  "${inf[@]}" -i "$src/models/wxformer_tiny/x.npy" -- --tp 2 -- --tp 1 --domain 2
differ infer-input "rank 1 was started with another --input than rank 0 ('$tmp/x2.npy' on rank 1" \
  "${inf[@]}" --domain 2 -- -i "$src/models/wxformer_tiny/x.npy" -- -i "$tmp/x2.npy"
# a node-local copy of the same input at another path: the ranks agree and the run goes on
if timeout 120 "$mpiexec" --oversubscribe -n 1 "$wxe" "${inf[@]}" -i "$src/models/wxformer_tiny/x.npy" --domain 2 \
     : -n 1 "$wxe" "${inf[@]}" -i "$tmp/x_copy.npy" --domain 2 >"$tmp/out" 2>"$tmp/err"; then
  echo "ok   infer-input-copy-agrees"
else
  echo "FAIL infer-input-copy-agrees"; cat "$tmp/err"; fails=$((fails + 1))
fi
fc=(forecast "$cfg" --model "$model" --threads 1 -o "$tmp/f.nc" --domain 2)
differ forecast-steps "rank 1 was started with another --steps than rank 0 ('3' on rank 1, '2' on rank 0)" \
  "${fc[@]}" --init 2020-12-31T18 -- --steps 2 -- --steps 3
differ forecast-init "rank 1 was started with another --init than rank 0" "${fc[@]}" --steps 1 -- --init 2020-12-31T18 -- --init 2021-01-01T00
ft=(finetune "$d/crossformer_tiny_snbaked_opset17.onnx" --data "$d/train/series" --save "$tmp/ft" --steps 1 --threads 1)
differ finetune-activation-checkpoint "rank 1 was started with another --activation-checkpoint than rank 0 ('none' on rank 1, (not given) on rank 0)" \
  "${ft[@]}" --tp 2 -- -- --activation-checkpoint none
differ finetune-weights "rank 1 was started with another --weights than rank 0 ((not given) on rank 1" \
  "${ft[@]}" --domain 2 -- --weights "$d/crossformer_tiny_checkpoint.pt" --
# another command on rank 1 (option lists of other lengths): named, no hang
differ other-command "rank 1 was started with another command than rank 0 ('forecast' on rank 1, 'infer' on rank 0)" \
  -- "${inf[@]}" -i "$src/models/wxformer_tiny/x.npy" --domain 2 -- "${fc[@]}" --init 2020-12-31T18
# --tp x --domain past INT_MAX: an error, not SIGFPE or an assertion
if timeout 60 "$mpiexec" --oversubscribe -n 2 "$wxe" "${inf[@]}" -i "$src/models/wxformer_tiny/x.npy" --tp 2 --domain 2147483647 \
   >"$tmp/out" 2>"$tmp/err"; then rc=0; else rc=$?; fi
if [ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -q "world size 2 is not divisible by --tp 2 x --domain 2147483647" "$tmp/err"; then
  echo "ok   tp-x-domain-overflow"
else
  echo "FAIL tp-x-domain-overflow (exit $rc)"; cat "$tmp/err"; fails=$((fails + 1))
fi
exit $((fails > 0))
