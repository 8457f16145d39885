#!/usr/bin/env bash
# mpirun -n 2 wxe finetune CONFIG.yml with ring-crps (trainer.ensemble_size 2: one member of
# CREDIT's noise model per data-parallel rank, both ranks fed the same samples): it trains, and a
# run stopped after 2 steps and resumed equals the uninterrupted one bit for bit (losses and the
# saved checkpoint); on one rank it is an error naming the rule. KCRPS with 2 members on each of
# 2 ranks trains too.
# Usage: ring_train_test.sh MPIEXEC WXE COMPARE_CHECKPOINTS SOURCE_DIR
set -u
mpiexec=$1 wxe=$2 cmp=$3 src=$(cd "$4" && pwd)
d=$src/tests/data/era5_tiny
common=(--model "$src/tests/data/crossformer_noise_tiny.onnx" --threads 1)
nsteps=3
resume_at=step_000002
. "$src/tests/mpi/train_lib.sh"
config() {  # config LOSS OUT: era5_tiny's config with this loss, 2 members, 3 steps, a checkpoint each step
  sed -e "s|\"era5_%Y\.\*\"|\"$d/era5_%Y.*\"|; s|\"forcing_%Y.nc\"|\"$d/forcing_%Y.nc\"|; s|\"static.nc\"|\"$d/static.nc\"|" \
      -e "s|\"scaler.json\"|\"$d/scaler.json\"|; s|use_ema: false|use_ema: false\n  ensemble_size: 2|" \
      -e "s|batches_per_epoch: 2|batches_per_epoch: 3|; s|training_loss: \"mse\"|training_loss: \"$1\"\n  validation_loss: \"mae\"|" \
      -e "s|use_latitude_weights: true|use_latitude_weights: false|" "$d/config.yml" >"$2"
}
config ring-crps "$tmp/ring.yml"
config KCRPS "$tmp/kcrps.yml"
model=$tmp/ring.yml
if mpi 2 --save "$tmp/whole" >/dev/null 2>"$tmp/err" && [ "$(losses "$tmp/whole" | wc -l)" -eq 3 ]; then
  ok "ring-crps-trains"
else
  bad "ring-crps-trains"; cat "$tmp/err"
fi
if mpi 2 --save "$tmp/part" --steps 2 >/dev/null 2>"$tmp/err" && mpi 2 --save "$tmp/part" --resume >/dev/null 2>>"$tmp/err" \
   && same_losses "$tmp/part" "$tmp/whole" exact && "$cmp" "$tmp/part/step_000003" "$tmp/whole/step_000003" 0 >"$tmp/out" 2>&1; then
  ok "ring-crps-resumes-bit-for-bit"
else
  bad "ring-crps-resumes-bit-for-bit"; cat "$tmp/err" "$tmp/out"; paste <(losses "$tmp/part") <(losses "$tmp/whole")
fi
if ! "$wxe" finetune "$model" "${common[@]}" --save "$tmp/one" >/dev/null 2>"$tmp/err" \
   && grep -q "ring-crps holds one ensemble member per data-parallel rank: ensemble_size 2 must equal the data-parallel size 1" "$tmp/err"; then
  ok "ring-crps-on-one-rank-named"
else
  bad "ring-crps-on-one-rank-named"; cat "$tmp/err"
fi
model=$tmp/kcrps.yml
if mpi 2 --save "$tmp/kcrps" >/dev/null 2>"$tmp/err" && [ "$(losses "$tmp/kcrps" | wc -l)" -eq 3 ]; then
  ok "kcrps-on-two-ranks-trains"
else
  bad "kcrps-on-two-ranks-trains"; cat "$tmp/err"
fi
exit $((fails > 0))
