#!/usr/bin/env bash
# mpirun -n N wxe finetune --tp T on a model WITH spectral norm (crossformer_tiny_opset17.onnx:
# SN traced, so the training graph keeps SpectralNorm + 1x1 Conv, fused to_qkv):
#  - the attention and feed-forward SN convs are sharded (SpectralNormTP), not refused;
#  - 4 steps at tp 1 (one process) and tp 2 give the same losses (rtol 1e-5) and the same final parameters, weight_orig and the power
#    iteration's weight_u / weight_v included (compare_checkpoints, 1e-5);
#  - the sharded checkpoint stores the fused to_qkv weight_orig by heads ("groups": 3);
#  - a run stopped at step 2 on tp 2 and resumed on tp 1, and one stopped on tp 1 and resumed
#    on tp 2, continue with the uninterrupted run's losses (rtol 1e-5);
#  - with --activation-checkpoint blocks, tp 2 gives the same losses and checkpoint bit for bit.
# Data parallelism is left out on purpose: each dp rank runs its own power iterations (as under
# PyTorch DDP), so dp > 1 does not reproduce a one-process run of an SN model.
# Usage: tp_sn_train_test.sh MPIEXEC WXE COMPARE_CHECKPOINTS SOURCE_DIR
set -u
mpiexec=$1 wxe=$2 compare=$3 src=$4
d=$src/tests/data
model=$d/crossformer_tiny_opset17.onnx
common=(--data "$d/train/series" --accum 2 --lr 1e-3 --threads 1 --schedule linear-warmup-cosine --warmup-steps 2
        --steps 4 --save-every 2 --keep 3 --shuffle --seed 3)
nsteps=4 resume_at=step_000002
. "$src/tests/mpi/train_lib.sh"

"$wxe" finetune "$model" "${common[@]}" --save "$tmp/tp1" >/dev/null 2>"$tmp/err" || { echo "FAIL tp1 run"; cat "$tmp/err"; exit 1; }
for tp in 2; do
  if mpi "$tp" --tp "$tp" --save "$tmp/tp$tp" >/dev/null 2>"$tmp/err" && grep -q "tensor parallel over $tp ranks" "$tmp/err" \
     && same_losses "$tmp/tp$tp" "$tmp/tp1" && "$compare" "$tmp/tp$tp/step_000004" "$tmp/tp1/step_000004" 1e-5; then
    ok "sn-tp$tp-matches-tp1"
  else
    bad "sn-tp$tp-matches-tp1"; cat "$tmp/err"; paste <(losses "$tmp/tp$tp") <(losses "$tmp/tp1")
  fi
done
# the fused qkv is stored by heads; u and v whole
if grep -q '"groups": 3' "$tmp/tp2/step_000002/index.json" \
   && grep -A1 'to_qkv.weight_u"' "$tmp/tp2/step_000002/index.json" | grep -q '"parts": 1'; then
  ok "sn-qkv-stored-by-heads"; else bad "sn-qkv-stored-by-heads"; fi

# stopped at step 4 on tp 2, resumed on tp 1; stopped on tp 1, resumed on tp 2
resume_copy "$tmp/tp2" "$tmp/r1"
resume_copy "$tmp/tp1" "$tmp/r2"
if "$wxe" finetune "$model" "${common[@]}" --save "$tmp/r1" --resume >/dev/null 2>"$tmp/err" \
   && same_losses "$tmp/r1" "$tmp/tp1" && "$compare" "$tmp/r1/step_000004" "$tmp/tp1/step_000004" 1e-5; then
  ok "sn-tp2-resumed-at-tp1"; else bad "sn-tp2-resumed-at-tp1"; cat "$tmp/err"; fi
if mpi 2 --tp 2 --save "$tmp/r2" --resume >/dev/null 2>"$tmp/err" && same_losses "$tmp/r2" "$tmp/tp1" \
   && "$compare" "$tmp/r2/step_000004" "$tmp/tp1/step_000004" 1e-5; then
  ok "sn-tp1-resumed-at-tp2"; else bad "sn-tp1-resumed-at-tp2"; cat "$tmp/err"; fi
# activation checkpointing at tp 2 (collectives never recomputed, spectral norm not advanced
# twice): the losses and the checkpoint of the run without it, bit for bit
if mpi 2 --tp 2 --save "$tmp/ck2" --activation-checkpoint blocks >/dev/null 2>"$tmp/err" \
   && grep -q "blocks recomputed in the backward" "$tmp/err" && same_losses "$tmp/ck2" "$tmp/tp2" exact \
   && "$compare" "$tmp/ck2/step_000004" "$tmp/tp2/step_000004" 0; then
  ok "sn-tp2-checkpointed-equals-tp2"; else bad "sn-tp2-checkpointed-equals-tp2"; cat "$tmp/err"; fi
exit $((fails > 0))
