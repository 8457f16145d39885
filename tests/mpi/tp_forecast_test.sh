#!/usr/bin/env bash
# mpirun -n 2 wxe forecast CONFIG.yml --tp 2, and --domain 2, against the one-process forecast
# (netCDF files compared variable by variable, relative 1e-5). Usage: tp_forecast_test.sh MPIEXEC WXE COMPARE SOURCE_DIR
set -u
mpiexec=$1 wxe=$2 compare=$3 src=$4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cfg=$src/tests/data/era5_tiny/config.yml
model=$src/models/wxformer_tiny/model.onnx
args=(forecast "$cfg" --model "$model" --init 2020-12-31T18 --steps 3 --threads 1)
if "$wxe" "${args[@]}" -o "$tmp/tp1.nc" >"$tmp/out" 2>"$tmp/err" \
   && timeout 120 "$mpiexec" --oversubscribe -n 2 "$wxe" "${args[@]}" --tp 2 -o "$tmp/tp2.nc" >>"$tmp/out" 2>>"$tmp/err" \
   && "$compare" "$tmp/tp1.nc" "$tmp/tp2.nc" 1e-5 T U SP tp time level latitude longitude >>"$tmp/out" 2>>"$tmp/err"; then
  echo "ok   forecast-np2-tp2"
else
  echo "FAIL forecast-np2-tp2"; cat "$tmp/out" "$tmp/err"; exit 1
fi
if timeout 120 "$mpiexec" --oversubscribe -n 2 "$wxe" "${args[@]}" --domain 2 -o "$tmp/domain2.nc" >>"$tmp/out" 2>>"$tmp/err" \
   && grep -q "domain 2: latitude bands" "$tmp/err" \
   && "$compare" "$tmp/tp1.nc" "$tmp/domain2.nc" 1e-5 T U SP tp time level latitude longitude >>"$tmp/out" 2>>"$tmp/err"; then
  echo "ok   forecast-np2-domain2"
else
  echo "FAIL forecast-np2-domain2"; cat "$tmp/out" "$tmp/err"; exit 1
fi
