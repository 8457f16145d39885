#!/usr/bin/env bash
# mpirun -n N wxe finetune (data parallel, ZeRO-1 optimizer state): the losses of 3 steps at
# dp 2 and dp 4 equal dp 1's (rtol 1e-5); a run saved at dp 2 resumes at dp 1 and one saved at
# dp 1 resumes at dp 2, continuing with the uninterrupted run's losses (tensor parallel:
# tp_train_test.sh); ranks given different options stop with one error naming the option.
# Usage: dp_train_test.sh MPIEXEC WXE SOURCE_DIR
set -u
mpiexec=$1 wxe=$2 src=$3
d=$src/tests/data
model=$d/crossformer_tiny_snbaked_opset17.onnx
run() { timeout 300 "$mpiexec" --oversubscribe "$@"; }
common=(--data "$d/train/series" --accum 4 --lr 1e-3 --threads 1 --schedule linear-warmup-cosine --warmup-steps 1)
nsteps=3
. "$src/tests/mpi/train_lib.sh"

"$wxe" finetune "$model" "${common[@]}" --save "$tmp/dp1" --steps 3 >/dev/null 2>"$tmp/err" || { echo "FAIL dp1 run"; cat "$tmp/err"; exit 1; }
for n in 2 4; do
  if run -n $n "$wxe" finetune "$model" "${common[@]}" --save "$tmp/dp$n" --steps 3 >"$tmp/out" 2>"$tmp/err" \
     && grep -q "mesh dp $n x tp 1" "$tmp/err" && same_losses "$tmp/dp$n" "$tmp/dp1"; then
    echo "ok   dp$n-matches-dp1"
  else
    echo "FAIL dp$n-matches-dp1"; cat "$tmp/err"; paste <(losses "$tmp/dp$n") <(losses "$tmp/dp1"); fails=$((fails + 1))
  fi
done
# saved at dp 2 after 2 steps, resumed at dp 1; saved at dp 1, resumed at dp 2
run -n 2 "$wxe" finetune "$model" "${common[@]}" --save "$tmp/a" --steps 2 >/dev/null 2>&1
"$wxe" finetune "$model" "${common[@]}" --save "$tmp/b" --steps 2 >/dev/null 2>&1
if "$wxe" finetune "$model" "${common[@]}" --save "$tmp/a" --steps 3 --resume >/dev/null 2>"$tmp/err" \
   && run -n 2 "$wxe" finetune "$model" "${common[@]}" --save "$tmp/b" --steps 3 --resume >/dev/null 2>>"$tmp/err" \
   && same_losses "$tmp/a" "$tmp/dp1" && same_losses "$tmp/b" "$tmp/dp1"; then
  echo "ok   resume-on-another-mesh"
else
  echo "FAIL resume-on-another-mesh"; cat "$tmp/err"; fails=$((fails + 1))
fi
# ranks started with different options stop at once, naming the option (different --steps would
# hang a collective; a different --grad-max-norm would train something else on each rank)
for opt in "--steps 3:--steps 4" "--grad-max-norm 1:--grad-max-norm 0.5" "--save-every 1:--save-every 2"; do
  a=${opt%%:*} b=${opt#*:}
  timeout 120 "$mpiexec" --oversubscribe -n 1 "$wxe" finetune "$model" "${common[@]}" --save "$tmp/opt" $a \
    : -n 1 "$wxe" finetune "$model" "${common[@]}" --save "$tmp/opt" $b >/dev/null 2>"$tmp/err"
  rc=$?
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "rank 1 was started with another ${a%% *}" "$tmp/err"; then
    echo "ok   different-${a%% *}-named"
  else
    echo "FAIL different-${a%% *}-named (exit $rc)"; cat "$tmp/err"; fails=$((fails + 1))
  fi
done
exit $((fails > 0))
