#!/usr/bin/env bash
# mpirun -n N wxe finetune --shard-weights (ZeRO-3 over dp x domain) against the same run without
# it (ZeRO-1), crossformer_tiny on CPU ranks, 3 steps:
#  - dp 2, domain 2 and dp 2 x tp 2, one micro-batch per dp group: the same losses and final
#    parameters bit for bit;
#  - spectral norm (crossformer_tiny with its SpectralNorm nodes: u and v updated in the forward)
#    at dp 2: bit for bit;
#  - dp 2 with --accum 4, --forecast-len 2, --ema, --activation-checkpoint blocks and
#    --grad-max-norm 0.3 (two micro-batches of two rollout steps per group: the gradient is summed
#    over dp per backward, then over the backwards, another order): losses and parameters within 1e-6;
#  - a ZeRO-1 checkpoint resumed under --shard-weights and a ZeRO-3 one resumed at dp 1 continue
#    with the uninterrupted run's losses;
#  - the memory line reports half the parameters and gradients (dp x domain = 2), the same AdamW state; ranks started with and without it stop
#    naming the option; --device cuda is refused in one line.
# Usage: zero3_train_test.sh MPIEXEC WXE COMPARE_CHECKPOINTS SOURCE_DIR
set -u
mpiexec=$1 wxe=$2 compare=$3 src=$4
d=$src/tests/data
model=$d/crossformer_tiny_snbaked_opset17.onnx
common=(--data "$d/train/series" --lr 1e-3 --threads 1 --schedule linear-warmup-cosine --warmup-steps 1 --steps 3
        --save-every 2 --keep 3)
nsteps=3 resume_at=step_000002
. "$src/tests/mpi/train_lib.sh"

# halved ERR: rank 0's parameters and gradients under --shard-weights are half ZeRO-1's (dp x domain
# = 2; within 5 % and the line's rounding), its AdamW state the same
halved() {
  awk '/memory: rank 0: parameters [0-9]/ { for (i = 1; i <= NF; i++) if ($i == "state") a = $(i + 1); p = $6 }
       /memory: rank 0: parameters \(sharded\)/ { s = $7; g = $0; sub(/.*gradients \(sharded\) /, "", g); g += 0
         for (i = 1; i <= NF; i++) if ($i == "state") b = $(i + 1) }
       END { ok = p > 0 && s > 0 && 2 * s >= 0.95 * p - 0.1 && 2 * s <= 1.05 * p + 0.1 && g == s && a == b; exit !ok }' "$1"
}
# pair NAME RANKS TOL ARGS...: the run with --shard-weights equals the one without (TOL 0: bit for bit)
pair() {
  local name=$1 n=$2 tol=$3; shift 3
  if mpi "$n" "$@" --save "$tmp/$name.z1" >/dev/null 2>"$tmp/err" \
     && mpi "$n" "$@" --shard-weights --save "$tmp/$name.z3" >/dev/null 2>>"$tmp/err" \
     && halved "$tmp/err" \
     && same_losses "$tmp/$name.z3" "$tmp/$name.z1" $([ "$tol" = 0 ] && echo exact) \
     && "$compare" "$tmp/$name.z3/step_000003" "$tmp/$name.z1/step_000003" "$tol" >/dev/null 2>>"$tmp/err"; then
    ok "$name-zero3-equals-zero1"
  else
    bad "$name-zero3-equals-zero1"; cat "$tmp/err"; paste <(losses "$tmp/$name.z3") <(losses "$tmp/$name.z1")
  fi
}
pair dp2 2 0 --accum 2
pair domain2 2 0 --accum 1 --domain 2
pair dp2tp2 4 0 --accum 2 --tp 2
pair dp2-accum-rollout-ema-ckpt 2 1e-6 --accum 4 --forecast-len 2 --ema --activation-checkpoint blocks \
  --grad-max-norm 0.3
model=$d/crossformer_tiny_opset17.onnx pair dp2-spectral-norm 2 0 --accum 2

# a ZeRO-1 checkpoint (dp 2) resumed with --shard-weights; a ZeRO-3 one resumed at dp 1 without it
resume_copy "$tmp/dp2.z1" "$tmp/r1"
resume_copy "$tmp/dp2.z3" "$tmp/r3"
if mpi 2 --accum 2 --shard-weights --save "$tmp/r1" --resume >/dev/null 2>"$tmp/err" \
   && mpi 1 --accum 2 --save "$tmp/r3" --resume >/dev/null 2>>"$tmp/err" \
   && same_losses "$tmp/r1" "$tmp/dp2.z1" exact && same_losses "$tmp/r3" "$tmp/dp2.z1"; then
  ok "resume-across-zero-stages"
else
  bad "resume-across-zero-stages"; cat "$tmp/err"
fi

# ranks given --shard-weights and not stop at once, naming the option (their collectives would not pair up)
timeout 120 "$mpiexec" --oversubscribe -n 1 "$wxe" finetune "$model" "${common[@]}" --accum 2 --save "$tmp/opt" \
  : -n 1 "$wxe" finetune "$model" "${common[@]}" --accum 2 --shard-weights --save "$tmp/opt" >/dev/null 2>"$tmp/err"
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "rank 1 was started with another --shard-weights" "$tmp/err"; then
  ok "different-shard-weights-named"
else
  bad "different-shard-weights-named (exit $rc)"; cat "$tmp/err"
fi

# --device cuda refuses it in one line, before any step
if ! "$wxe" finetune "$model" "${common[@]}" --accum 2 --shard-weights --device cuda --save "$tmp/cuda" >/dev/null \
     2>"$tmp/err" && grep -q -- "--shard-weights" "$tmp/err" && ! grep -q "step 1" "$tmp/err"; then
  ok "cuda-refused"
else
  bad "cuda-refused"; cat "$tmp/err"
fi
exit $((fails > 0))
