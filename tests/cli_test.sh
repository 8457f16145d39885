#!/usr/bin/env bash
# End-to-end checks of the wxe command line: exit codes and one-line errors.
# Usage: cli_test.sh WXE_BINARY SOURCE_DIR
set -u
wxe=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
model=$src/models/wxformer_tiny/model.onnx
x=$src/models/wxformer_tiny/x.npy
y=$src/models/wxformer_tiny/y.npy
fails=0

# expect_fail NAME PATTERN CMD...: non-zero exit, one line on stderr matching PATTERN
expect_fail() {
  local name=$1 pattern=$2
  shift 2
  "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ $rc -ne 1 ]; then  # README: bad input and usage errors exit 1
    echo "FAIL $name: exit $rc"; fails=$((fails + 1)); return
  fi
  # progress lines may precede it; the error itself is the one last line
  if ! tail -n 1 "$tmp/err" | grep -q -- "wxe: error: .*$pattern" || [ "$(grep -c "error" "$tmp/err")" -ne 1 ]; then
    echo "FAIL $name: stderr does not match '$pattern':"; cat "$tmp/err"; fails=$((fails + 1)); return
  fi
  echo "ok   $name"
}

expect_fail missing-model "nope.onnx: cannot open" "$wxe" infer "$tmp/nope.onnx" --input "$x" -o "$tmp/y.npy"
expect_fail missing-input "nope.npy: cannot open" "$wxe" infer "$model" --input "$tmp/nope.npy" -o "$tmp/y.npy"
# npy PATH DESCR SHAPE NBYTES: a .npy header followed by NBYTES zero bytes
npy() {
  local h="{'descr': '$2', 'fortran_order': False, 'shape': $3, }"
  while [ $(( (10 + ${#h} + 1) % 64 )) -ne 0 ]; do h="$h "; done
  h="$h"$'\n'
  local l=${#h}
  { printf '\x93NUMPY\x01\x00'; printf "\\x$(printf %02x $((l & 255)))\\x$(printf %02x $((l >> 8)))";
    printf '%s' "$h"; head -c "$4" /dev/zero; } > "$1"
}
npy "$tmp/x64.npy" "<f8" "(1, 7, 1, 32, 64)" $((8 * 7 * 32 * 64))
npy "$tmp/xshape.npy" "<f4" "(1, 7, 1, 16, 64)" $((4 * 7 * 16 * 64))
npy "$tmp/xtrunc.npy" "<f4" "(1, 7, 1, 32, 64)" 100
expect_fail float64-input "dtype float64, but input 'x' expects float32" "$wxe" infer "$model" --input "$tmp/x64.npy" -o "$tmp/y.npy"
expect_fail wrong-shape "expects shape (1, 7, 1, 32, 64), got (1, 7, 1, 16, 64)" "$wxe" infer "$model" --input "$tmp/xshape.npy" -o "$tmp/y.npy"
expect_fail truncated-npy "truncated .npy data" "$wxe" infer "$model" --input "$tmp/xtrunc.npy" -o "$tmp/y.npy"
expect_fail wrong-input-name "no input named 'foo'" "$wxe" infer "$model" --input "foo=$x" -o "$tmp/y.npy"
head -c 100000 "$model" > "$tmp/trunc.onnx"
expect_fail truncated-onnx "trunc.onnx" "$wxe" infer "$tmp/trunc.onnx" --input "$x" -o "$tmp/y.npy"

# the main job: runs, writes the output, matches PyTorch
if "$wxe" infer "$model" --input "x=$x" --output "$tmp/y.npy" --compare "$y" --tolerance 1e-4 --threads 2 >"$tmp/out" 2>"$tmp/err" \
   && [ -s "$tmp/y.npy" ] && grep -q "max abs diff" "$tmp/out"; then
  echo "ok   infer-matches-pytorch"
else
  echo "FAIL infer-matches-pytorch"; cat "$tmp/out" "$tmp/err"; fails=$((fails + 1))
fi
if "$wxe" inspect "$model" >"$tmp/out" 2>&1 && grep -q "^Conv " "$tmp/out" && grep -q "parameters after passes" "$tmp/out"; then
  echo "ok   inspect"
else
  echo "FAIL inspect"; cat "$tmp/out"; fails=$((fails + 1))
fi
# inspect --domain: the band plan without running (the shipped model's 32 rows: 2 bands, not 3)
if "$wxe" inspect "$model" --domain 2 >"$tmp/out" 2>&1 && grep -q "domain 2: latitude bands; [1-9][0-9]* convolutions exchange halo rows" "$tmp/out" \
   && "$wxe" inspect "$model" --domain 3 >"$tmp/out3" 2>&1 && grep -q -- "--domain 3 splits nothing" "$tmp/out3"; then
  echo "ok   inspect-domain"
else
  echo "FAIL inspect-domain"; cat "$tmp/out" "$tmp/out3"; fails=$((fails + 1))
fi
# issue 41: inspect --tp/--domain below 1 are errors, not ignored; a hostile value in an error
# (100 kB of --init) is cut, not echoed whole
expect_fail inspect-domain-0 "inspect: --domain must be at least 1 (got 0)" "$wxe" inspect "$model" --domain 0
expect_fail inspect-tp-negative "inspect: --tp must be at least 1 (got -3)" "$wxe" inspect "$model" --tp -3
long=$(head -c 100000 /dev/zero | tr '\0' x)
expect_fail long-value-cut "more bytes)" "$wxe" forecast "$src/tests/data/era5_tiny/config.yml" --model "$model" --init "$long" -o "$tmp/f.nc"
if [ "$(wc -c <"$tmp/err")" -gt 4000 ]; then echo "FAIL long-value-cut: $(wc -c <"$tmp/err") bytes of error"; fails=$((fails + 1)); fi
# convert: a legacy checkpoint to safetensors, checked against the graph; a mismatching one refused
ckpt=$src/tests/data/wxformer_tiny_checkpoint.pt
if "$wxe" convert "$ckpt" --output "$tmp/w.safetensors" --onnx "$model" >"$tmp/out" 2>"$tmp/err" \
   && grep -q "spectral-norm layers folded" "$tmp/out" && [ -s "$tmp/w.safetensors" ] && ! ls "$tmp"/w.safetensors.tmp* >/dev/null 2>&1; then
  echo "ok   convert"
else
  echo "FAIL convert"; cat "$tmp/out" "$tmp/err"; fails=$((fails + 1))
fi
if "$wxe" infer "$model" --input "$x" --weights "$tmp/w.safetensors" --compare "$y" --tolerance 1e-4 >"$tmp/out" 2>"$tmp/err"; then
  echo "ok   infer-weights-safetensors"
else
  echo "FAIL infer-weights-safetensors"; cat "$tmp/out" "$tmp/err"; fails=$((fails + 1))
fi
# an export that lost the checkpoint's names (dynamo: spectral norm folded into anonymous
# constants): matched by graph structure, converted, and the converted weights give PyTorch's y
sw=$src/tests/data/structw_crossformer_dynamo
if "$wxe" convert "${sw}_checkpoint.pt" --output "$tmp/sw.safetensors" --onnx "$sw.onnx" >"$tmp/out" 2>"$tmp/err" \
   && grep -q "by graph structure), 0 mismatch" "$tmp/out" \
   && "$wxe" infer "$sw.onnx" --input "${sw}_x.npy" --weights "$tmp/sw.safetensors" --compare "${sw}_y.npy" --tolerance 1e-4 >"$tmp/out" 2>"$tmp/err" \
   && grep -q "matched by graph structure" "$tmp/err"; then
  echo "ok   convert-by-structure"
else
  echo "FAIL convert-by-structure"; cat "$tmp/out" "$tmp/err"; fails=$((fails + 1))
fi
expect_fail convert-mismatch "do not fit" "$wxe" convert "$ckpt" --output "$tmp/bad.safetensors" --onnx "$src/tests/data/crossformer_tiny_snbaked_opset17.onnx"
[ -e "$tmp/bad.safetensors" ] && { echo "FAIL convert-mismatch wrote a file"; fails=$((fails + 1)); }
expect_fail weights-mismatch "weights do not fit the model" "$wxe" infer "$model" --input "$x" --weights "$src/tests/data/crossformer_tiny_checkpoint.pt"

# finetune: two steps, progress lines (stderr is not a TTY), log, checkpoint; then resume to 3
mkdir -p "$tmp/data"
for i in 0000 0001; do cp "$x" "$tmp/data/x_$i.npy"; cp "$y" "$tmp/data/y_$i.npy"; done
if "$wxe" finetune "$model" --data "$tmp/data" --save "$tmp/ft" --steps 2 --lr 1e-4 --threads 2 >"$tmp/out" 2>"$tmp/err" \
   && grep -q "step 2/2 loss" "$tmp/err" && [ "$(wc -l < "$tmp/ft/training_log.csv")" -eq 3 ] \
   && [ "$(cat "$tmp/ft/latest")" = step_000002 ] && [ -s "$tmp/ft/step_000002/model.safetensors" ] \
   && [ -s "$tmp/ft/step_000002/optimizer.safetensors" ] && [ -s "$tmp/ft/loss_curve.png" ]; then
  echo "ok   finetune"
else
  echo "FAIL finetune"; cat "$tmp/out" "$tmp/err"; fails=$((fails + 1))
fi
if "$wxe" finetune "$model" --data "$tmp/data" --save "$tmp/ft" --steps 3 --lr 1e-4 --threads 2 --resume >"$tmp/out" 2>"$tmp/err" \
   && grep -q "resumed from" "$tmp/err" && grep -q "step 3/3" "$tmp/err" && ! grep -q "step 1/3" "$tmp/err" \
   && [ "$(wc -l < "$tmp/ft/training_log.csv")" -eq 4 ]; then
  echo "ok   finetune-resume"
else
  echo "FAIL finetune-resume"; cat "$tmp/out" "$tmp/err"; fails=$((fails + 1))
fi
# the fine-tuned weights run through inference
if "$wxe" infer "$model" --input "$x" --weights "$tmp/ft/step_000003/model.safetensors" >"$tmp/out" 2>"$tmp/err"; then
  echo "ok   infer-finetuned"
else
  echo "FAIL infer-finetuned"; cat "$tmp/out" "$tmp/err"; fails=$((fails + 1))
fi
expect_fail finetune-no-data "no x_" "$wxe" finetune "$model" --data "$tmp" --save "$tmp/ft2" --steps 1
expect_fail finetune-freeze "matches no parameter" "$wxe" finetune "$model" --data "$tmp/data" --save "$tmp/ft2" --steps 1 --freeze "nothing.*"
expect_fail finetune-accum "at least 1" "$wxe" finetune "$model" --data "$tmp/data" --save "$tmp/ft2" --steps 1 --accum 0
expect_fail finetune-bf16-device "--precision bf16 trains on the cpu only for now" "$wxe" finetune "$model" --data "$tmp/data" --save "$tmp/ft2" --steps 1 --precision bf16 --device cuda
expect_fail finetune-bf16-reference "--precision bf16 does not apply" "$wxe" finetune "$model" --data "$tmp/data" --save "$tmp/ft2" --steps 1 --precision bf16 --reference
expect_fail bench-train-bf16-device "--precision bf16 trains on the cpu only for now" "$wxe" bench "$model" --input "$x" --train --precision bf16 --device cuda
# finetune --precision bf16: says what runs in bfloat16, trains, and the loss is finite
if "$wxe" finetune "$model" --data "$tmp/data" --save "$tmp/ft_bf16" --steps 2 --lr 1e-4 --threads 2 --precision bf16 >"$tmp/out" 2>"$tmp/err" \
   && grep -q "wxe: precision bf16: [0-9]* Linear and [1-9][0-9]* Conv nodes multiply in bfloat16" "$tmp/err" \
   && grep -q "final loss [0-9]" "$tmp/out"; then
  echo "ok   finetune-bf16"
else
  echo "FAIL finetune-bf16"; cat "$tmp/out" "$tmp/err"; fails=$((fails + 1))
fi

# back to CREDIT: the fine-tuned checkpoint as a CREDIT trainer checkpoint, in the original's
# order with its optimizer indices; a checkpoint of another model is refused
cross=$src/tests/data/crossformer_tiny_snbaked_opset17.onnx
if "$wxe" convert "$tmp/ft/step_000003" --to credit --output "$tmp/credit.pt" >"$tmp/out" 2>"$tmp/err" \
   && grep -q "CREDIT's layout" "$tmp/out" && grep -q "note: without --like" "$tmp/err" && [ -s "$tmp/credit.pt" ]; then
  echo "ok   convert-to-credit"
else
  echo "FAIL convert-to-credit"; cat "$tmp/out" "$tmp/err"; fails=$((fails + 1))
fi
expect_fail convert-to-credit-like "mismatches" "$wxe" convert "$tmp/ft/step_000003" --to credit --output "$tmp/credit2.pt" --like "$src/tests/data/crossformer_tiny_checkpoint.pt"
[ -e "$tmp/credit2.pt" ] && { echo "FAIL convert-to-credit-like wrote a file"; fails=$((fails + 1)); }
if "$wxe" convert "$tmp/ft/step_000003" --to credit --output "$tmp/credit3.pt" --like "$src/tests/data/wxformer_tiny_checkpoint.pt" \
     >"$tmp/out" 2>"$tmp/err" && grep -q "AdamW state of 310 parameters at step 3" "$tmp/out" && [ -s "$tmp/credit3.pt" ] \
   && [ ! -s "$tmp/err" ] && ! ls "$tmp"/credit3.pt.tmp* >/dev/null 2>&1; then
  echo "ok   convert-to-credit-like-original"
else
  echo "FAIL convert-to-credit-like-original"; cat "$tmp/out" "$tmp/err"; fails=$((fails + 1))
fi
expect_fail convert-to-credit-bad-like "cannot open" "$wxe" convert "$tmp/ft/step_000003" --to credit --output "$tmp/credit4.pt" --like "$tmp/nope.pt"

# sharded checkpoints: full -> 3 files -> full, bit for bit; a folder that is not a sharded
# checkpoint is never replaced
if "$wxe" convert "$tmp/w.safetensors" --output "$tmp/sharded" --shard 3 >"$tmp/out" 2>"$tmp/err" \
   && [ -s "$tmp/sharded/index.json" ] && [ -s "$tmp/sharded/rank_00002.safetensors" ] && [ ! -e "$tmp/sharded.tmp" ] \
   && "$wxe" convert "$tmp/sharded" --output "$tmp/unsharded.safetensors" >>"$tmp/out" 2>>"$tmp/err" \
   && cmp -s "$tmp/w.safetensors" "$tmp/unsharded.safetensors"; then
  echo "ok   convert-sharded-round-trip"
else
  echo "FAIL convert-sharded-round-trip"; cat "$tmp/out" "$tmp/err"; fails=$((fails + 1))
fi
expect_fail convert-shard-user-dir "refusing to replace it" "$wxe" convert "$tmp/w.safetensors" --output "$tmp/data" --shard 2
[ -e "$tmp/data/x_0000.npy" ] || { echo "FAIL convert-shard-user-dir touched the folder"; fails=$((fails + 1)); }

# careless command lines (issue 11): usage errors exit 1 with the "wxe: error:" line; options
# that would do nothing are refused; files are checked before the forward pass
expect_fail usage-no-model "model is required" "$wxe" infer --input "$x"
expect_fail usage-unknown-option "--nope" "$wxe" infer "$model" --input "$x" --nope
expect_fail usage-no-command "A subcommand is required" "$wxe"
for t in 0 -1 100000; do
  expect_fail "threads-$t" "threads" "$wxe" infer "$model" --input "$x" --threads "$t"
done
expect_fail tolerance-without-compare "requires --compare" "$wxe" infer "$model" --input "$x" --tolerance 1
echo '{}' > "$tmp/plan.json"
expect_fail plan-without-tp "--plan needs --tp" "$wxe" infer "$model" --input "$x" --plan "$tmp/plan.json"
expect_fail reference-bf16 "--precision bf16 does not apply" "$wxe" infer "$model" --input "$x" --reference --precision bf16
expect_fail domain-device-one-rank "world size 1 is not divisible by --tp 1 x --domain 2" "$wxe" infer "$model" --input "$x" --domain 2 --device cuda
expect_fail model-is-directory "$tmp: is a directory" "$wxe" infer "$tmp" --input "$x"
expect_fail compare-missing-before-run "nope.npy: cannot open" "$wxe" infer "$model" --input "$x" --compare "$tmp/nope.npy"
grep -q "forward:" "$tmp/out" && { echo "FAIL compare-missing-before-run ran the model first"; fails=$((fails + 1)); }
expect_fail output-unwritable-before-run "cannot write here" "$wxe" infer "$model" --input "$x" -o "$tmp/no/such/dir/y.npy"
grep -q "forward:" "$tmp/out" && { echo "FAIL output-unwritable-before-run ran the model first"; fails=$((fails + 1)); }
"$wxe" infer "$model" --input "$x" --weights "$src/tests/data/crossformer_tiny_checkpoint.pt" >/dev/null 2>"$tmp/err"
if [ "$(wc -c < "$tmp/err")" -lt 1500 ] && grep -q "more" "$tmp/err"; then
  echo "ok   weights-mismatch-short"
else
  echo "FAIL weights-mismatch-short: $(wc -c < "$tmp/err") bytes"; fails=$((fails + 1))
fi
if "$wxe" --version >"$tmp/out" 2>&1 && grep -q "^wxe [0-9]" "$tmp/out" \
   && "$wxe" help >"$tmp/out" 2>&1 && grep -q "infer" "$tmp/out" \
   && "$wxe" help infer >"$tmp/out" 2>&1 && grep -q -- "--compare" "$tmp/out"; then
  echo "ok   version-and-help"
else
  echo "FAIL version-and-help"; cat "$tmp/out"; fails=$((fails + 1))
fi
# cuBLAS is loaded when a CUDA run needs it, not linked (linked, it costs every process ~210 MB
# of resident memory at start-up): wxe names no libcublas among its needed libraries
if command -v readelf >/dev/null; then
  if readelf -d "$wxe" | grep -q "NEEDED.*libcublas"; then
    echo "FAIL cublas-not-linked: $(readelf -d "$wxe" | grep NEEDED.*libcublas)"; fails=$((fails + 1))
  else
    echo "ok   cublas-not-linked"
  fi
fi
# -i before the model does not swallow it; paths with '=' are paths
cp "$x" "$tmp/a=b.npy"
if "$wxe" infer -i "$tmp/a=b.npy" "$model" -o "$tmp/o=1.npy" --threads 2 >"$tmp/out" 2>"$tmp/err" && [ -s "$tmp/o=1.npy" ]; then
  echo "ok   option-order-and-equals-paths"
else
  echo "FAIL option-order-and-equals-paths"; cat "$tmp/out" "$tmp/err"; fails=$((fails + 1))
fi

# CREDIT configs: forecast to netCDF (progress, the file read back by its header), errors
era5=$src/tests/data/era5_tiny
if "$wxe" forecast "$era5/config.yml" --model "$model" --init 2020-12-31T18 --steps 2 -o "$tmp/fc.nc" --threads 2 \
     >"$tmp/out" 2>"$tmp/err" && grep -q "2 steps" "$tmp/out" && [ -s "$tmp/fc.nc" ] && [ ! -e "$tmp/fc.nc.tmp" ]; then
  echo "ok   forecast-netcdf"
else
  echo "FAIL forecast-netcdf"; cat "$tmp/out" "$tmp/err"; fails=$((fails + 1))
fi
# plan from a CREDIT config: the input shape from its data (7 channels of 32 x 64, as x.npy), so
# every mesh's state, kept and step columns equal the plan from the .npy's header
rows() { awk '/^dp [0-9]/ {print $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11}' "$1"; }
if "$wxe" plan "$model" "$era5/config.yml" --ranks 2 --train >"$tmp/plan_cfg" 2>&1 &&
   "$wxe" plan "$model" --input "$x" --ranks 2 --train >"$tmp/plan_npy" 2>&1 &&
   [ "$(rows "$tmp/plan_cfg" | wc -l)" -ge 4 ] && [ "$(rows "$tmp/plan_cfg")" = "$(rows "$tmp/plan_npy")" ]; then
  echo "ok   plan-from-config"
else
  echo "FAIL plan-from-config"; cat "$tmp/plan_cfg" "$tmp/plan_npy"; fails=$((fails + 1))
fi
# several --init: one file per init time (OUT_<init>.nc), which score averages over
if "$wxe" forecast "$era5/config.yml" --model "$model" --init 2020-12-31T12 --init 2020-12-31T18 --steps 2 -o "$tmp/fcs.nc" \
     --threads 2 >"$tmp/out" 2>"$tmp/err" && [ -s "$tmp/fcs_2020-12-31T12.nc" ] && [ -s "$tmp/fcs_2020-12-31T18.nc" ] &&
   [ ! -e "$tmp/fcs.nc" ] && "$wxe" score "$tmp"/fcs_*.nc --truth "$era5/config.yml" -o "$tmp/fcs.csv" >/dev/null 2>&1 &&
   grep -q "^fcs_2020-12-31T12,T,500,6,2," "$tmp/fcs.csv"; then
  echo "ok   forecast-several-inits"
else
  echo "FAIL forecast-several-inits"; cat "$tmp/out" "$tmp/err" "$tmp/fcs.csv"; fails=$((fails + 1))
fi
# plot and score: bad input is one line naming the file and the variable, exit 1
sc=$src/tests/data/score
expect_fail plot-no-var "a_1.nc: no variable 'Q' (the file has T, SP)" "$wxe" plot "$sc/a_1.nc" --var Q -o "$tmp/p.png"
expect_fail plot-no-level "a_1.nc: variable 'T' has no level 700 (levels: 500, 850)" "$wxe" plot "$sc/a_1.nc" --var T@700 -o "$tmp/p.png"
expect_fail plot-no-step "a_1.nc: --step 9: the file has 2 steps" "$wxe" plot "$sc/a_1.nc" --var SP --step 9 -o "$tmp/p.png"
expect_fail score-no-file "nope.nc" "$wxe" score "$tmp/nope.nc" --truth "$era5/config.yml" -o "$tmp/s.csv"
expect_fail score-compare-one "score --compare needs two models or more" "$wxe" score --compare "$sc/a_1.nc" --truth "$era5/config.yml" -o "$tmp/s.csv"
expect_fail forecast-gap "era5_2020.nc: variable 'T' has no time 2020-12-31T03:00:00" "$wxe" forecast "$era5/config.yml" --model "$model" --init 2020-12-31T03 -o "$tmp/fc2.nc"
expect_fail forecast-reference-device "--reference runs the CPU reference kernels; --device cuda does not apply" "$wxe" forecast "$era5/config.yml" --model "$model" --init 2020-12-31T18 -o "$tmp/fc2.nc" --reference --device cuda
expect_fail forecast-bad-init "--init: '2020-13-01' is not a date-time" "$wxe" forecast "$era5/config.yml" --model "$model" --init 2020-13-01 -o "$tmp/fc2.nc"
expect_fail finetune-config-no-model "needs --model" "$wxe" finetune "$era5/config.yml" --save "$tmp/run"
# a FIFO as the input: an error at once, not a read that waits for a writer (timeout: exit 124)
mkfifo "$tmp/fifo.npy"
expect_fail infer-fifo-input "fifo.npy: is not a regular file" timeout 20 "$wxe" infer "$model" --input "$tmp/fifo.npy" -o "$tmp/y.npy"
# a bad number in a config: the file, key and value, not a bare "stoll"
sed -e 's/timestep: "6h"/timestep: "99999999999999999999h"/' -e "s#path: \"#path: \"$era5/#" "$era5/config.yml" > "$tmp/bad_timestep.yml"
expect_fail config-bad-timestep "bad_timestep.yml: data.timestep: '99999999999999999999h'" "$wxe" forecast "$tmp/bad_timestep.yml" --model "$model" --init 2020-12-31T18 -o "$tmp/fc3.nc"
# physics postblocks: a fixer before the inverse scaler (it would see normalised values)
{ sed -e "s#path: \"#path: \"$era5/#" -e '/^trainer:/,$d' "$era5/config.yml"; printf '%s\n' 'postblocks:' '  per_step:' \
    '    mass:' '      type: global_mass_fixer' '      args:' "        save_loc_physics: $src/tests/data/physics/statics.nc" \
    '        lon_lat_level_name: [lon2d, lat2d, hyai, hybi]' '        q_var: era5/prognostic/3d/U' \
    '        sp_var: era5/prognostic/2d/SP'; } > "$tmp/phys_order.yml"
expect_fail physics-fixer-before-scaler "phys_order.yml: postblocks.per_step.mass: global_mass_fixer before the inverse bridgescaler_transform sees normalised values" "$wxe" forecast "$tmp/phys_order.yml" --model "$model" --init 2020-12-31T18 -o "$tmp/fc4.nc"

# bench --train: the memory line and its JSON figures; what persists (parameters, gradients as
# large, AdamW twice) and the activations fit within the host tensors' peak
if "$wxe" bench "$model" --input "$x" --train --runs 1 --threads 1 --json >"$tmp/out" 2>"$tmp/err" \
   && grep -q "wxe: memory: rank 0: parameters .* activations at the peak .* (kept for the backward .*, transient .*); host tensors at the peak" "$tmp/err" \
   && tail -n 1 "$tmp/out" | awk '{
        for (i = 1; i <= NF; ++i) { k = $i; gsub(/[",:{}]/, "", k); v = $(i + 1); gsub(/[,}]/, "", v); f[k] = v + 0 }
        ok = f["params_mb"] > 0 && f["grads_mb"] == f["params_mb"] && f["adamw_mb"] > 1.99 * f["params_mb"] \
             && f["kept_mb"] > 0 && f["params_mb"] + f["grads_mb"] + f["adamw_mb"] + f["kept_mb"] + f["transient_mb"] <= f["tensors_peak_mb"] + 0.5 \
             && f["tensors_peak_mb"] <= f["peak_rss_mb"]
        exit !ok }'; then
  echo "ok   bench-train-memory"
else
  echo "FAIL bench-train-memory"; cat "$tmp/out" "$tmp/err"; fails=$((fails + 1))
fi

# bench --nodes N: the N slowest nodes with their shapes, forward (and with --train backward) times
if "$wxe" bench "$model" --input "$x" --runs 1 --threads 1 --nodes 3 >"$tmp/out" 2>"$tmp/err" \
   && grep -A3 "^the 3 slowest nodes (ms per run)" "$tmp/out" | tail -n 3 | grep -c " -> (" | grep -qx 3 \
   && "$wxe" bench "$model" --input "$x" --train --runs 1 --threads 1 --nodes 40 >"$tmp/out" 2>"$tmp/err" \
   && grep -A40 "^the 40 slowest nodes" "$tmp/out" | grep -q "(backward) WindowAttention" \
   && grep -A40 "^the 40 slowest nodes" "$tmp/out" | tail -n +2 | grep -v "(backward)" | grep -q " -> ("; then
  echo "ok   bench-nodes"
else
  echo "FAIL bench-nodes"; cat "$tmp/out" "$tmp/err"; fails=$((fails + 1))
fi

exit $((fails > 0))
