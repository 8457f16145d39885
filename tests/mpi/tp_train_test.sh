#!/usr/bin/env bash
# mpirun -n N wxe finetune --tp T on the dp x tp mesh (crossformer_tiny, CPU ranks):
#  - 20 steps at tp 1 (one process), tp 2 and dp 2 x tp 2 (sequence parallel: every row-parallel
#    layer's sum a reduce-scatter) give the same losses (rtol 1e-5) and
#    the same final parameters (relative L2 3e-5 over all of them, 3e-2 for any one tensor: the
#    position-bias MLP's last biases and the biases before per-channel GroupNorms, whose
#    statistics the tp group sums in another order, have gradients of rounding noise that AdamW
#    normalizes);
#  - a run stopped at step 10 and resumed on another mesh (dp2 x tp2 -> tp 1, tp 4, dp 4;
#    tp 1 -> dp2 x tp2) continues with the uninterrupted run's losses (rtol 1e-5);
#  - resumed on the same mesh it is bit-exact (losses and final parameters);
#  - the sharded checkpoint converts to one safetensors and to a CREDIT .pt.
# Usage: tp_train_test.sh MPIEXEC WXE COMPARE_CHECKPOINTS SOURCE_DIR
set -u
mpiexec=$1 wxe=$2 compare=$3 src=$4
d=$src/tests/data
model=$d/crossformer_tiny_snbaked_opset17.onnx
common=(--data "$d/train/series" --accum 4 --lr 1e-3 --threads 1 --schedule linear-warmup-cosine --warmup-steps 2
        --steps 20 --save-every 10 --keep 3 --shuffle --seed 3)
nsteps=20 resume_at=step_000010
. "$src/tests/mpi/train_lib.sh"

"$wxe" finetune "$model" "${common[@]}" --save "$tmp/tp1" >/dev/null 2>"$tmp/err" || { echo "FAIL tp1 run"; cat "$tmp/err"; exit 1; }
for mesh in "2 2" "4 2"; do
  set -- $mesh
  name=n$1tp$2
  if mpi "$1" --tp "$2" --save "$tmp/$name" >/dev/null 2>"$tmp/err" && grep -q "tensor parallel over $2 ranks" "$tmp/err" \
     && grep -q "sequence parallel: 20 reduce-scatters" "$tmp/err" \
     && same_losses "$tmp/$name" "$tmp/tp1" && "$compare" "$tmp/$name/step_000020" "$tmp/tp1/step_000020" 3e-5; then
    ok "$name-matches-tp1"
  else
    bad "$name-matches-tp1"; cat "$tmp/err"; paste <(losses "$tmp/$name") <(losses "$tmp/tp1")
  fi
done
[ -f "$tmp/n4tp2/step_000010/index.json" ] && ok "sharded-checkpoint-written" || bad "sharded-checkpoint-written"

# stopped at step 10 on dp2 x tp2, resumed on tp 1, tp 4, dp 4
resume_copy "$tmp/n4tp2" "$tmp/r1"
resume_copy "$tmp/n4tp2" "$tmp/r4"
resume_copy "$tmp/n4tp2" "$tmp/rdp4"
if "$wxe" finetune "$model" "${common[@]}" --save "$tmp/r1" --resume >/dev/null 2>"$tmp/err" \
   && same_losses "$tmp/r1" "$tmp/tp1"; then ok "dp2xtp2-resumed-at-tp1"; else bad "dp2xtp2-resumed-at-tp1"; cat "$tmp/err"; fi
if mpi 4 --tp 4 --save "$tmp/r4" --resume >/dev/null 2>"$tmp/err" && same_losses "$tmp/r4" "$tmp/tp1"; then
  ok "dp2xtp2-resumed-at-tp4"; else bad "dp2xtp2-resumed-at-tp4"; cat "$tmp/err"; fi
if mpi 4 --save "$tmp/rdp4" --resume >/dev/null 2>"$tmp/err" && same_losses "$tmp/rdp4" "$tmp/tp1"; then
  ok "dp2xtp2-resumed-at-dp4"; else bad "dp2xtp2-resumed-at-dp4"; cat "$tmp/err"; fi
# stopped at step 10 on one process, resumed on dp2 x tp2
resume_copy "$tmp/tp1" "$tmp/r22"
if mpi 4 --tp 2 --save "$tmp/r22" --resume >/dev/null 2>"$tmp/err" && same_losses "$tmp/r22" "$tmp/tp1"; then
  ok "tp1-resumed-at-dp2xtp2"; else bad "tp1-resumed-at-dp2xtp2"; cat "$tmp/err"; fi
# the same mesh: bit for bit
resume_copy "$tmp/n2tp2" "$tmp/same"
if mpi 2 --tp 2 --save "$tmp/same" --resume >/dev/null 2>"$tmp/err" && same_losses "$tmp/same" "$tmp/n2tp2" exact \
   && "$compare" "$tmp/same/step_000020" "$tmp/n2tp2/step_000020" 0 >/dev/null; then
  ok "tp2-resume-bit-exact"; else bad "tp2-resume-bit-exact"; cat "$tmp/err"; fi
# convert: sharded -> one safetensors holding every tensor whole; -> CREDIT .pt
if "$wxe" convert "$tmp/n4tp2/step_000020" -o "$tmp/full.safetensors" >/dev/null 2>"$tmp/err" \
   && "$wxe" convert "$tmp/n4tp2/step_000020" --to credit --output "$tmp/credit.pt" >/dev/null 2>>"$tmp/err" \
   && [ -s "$tmp/full.safetensors" ] && [ -s "$tmp/credit.pt" ]; then
  ok "convert-sharded"; else bad "convert-sharded"; cat "$tmp/err"; fi
exit $((fails > 0))
