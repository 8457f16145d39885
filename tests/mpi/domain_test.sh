#!/usr/bin/env bash
# mpirun -n N wxe infer|finetune --domain D on the dp x tp x domain mesh (CPU ranks):
#  - inference at domain 2, domain 4 and tp 2 x domain 2 equals the one-process output
#    (crossformer_tiny; max abs 1e-5), nextgen's at domain 2 and a mirror-padded WXFormer's at
#    domain 4; the log names the halo exchanges; a --domain that splits nothing is refused;
#  - 10 fine-tuning steps at domain 2, tp 2 x domain 2 and dp 2 x domain 2 give the
#    one-process losses (rtol 1e-5) and final parameters (compare_checkpoints 3e-5: the biases
#    before a per-channel GroupNorm have gradients of rounding noise, which AdamW normalizes);
#  - the AdamW state is shared out over dp x domain (ZeRO-1): half per rank at domain 2;
#  - with activation checkpointing the domain-2 losses are the same bit for bit;
#  - a domain-2 run stopped at step 5 resumes at domain 1 (and a one-process run at domain 2)
#    with the uninterrupted losses: domain ranks write whole parameters once.
# Usage: domain_test.sh MPIEXEC WXE COMPARE_CHECKPOINTS SOURCE_DIR
set -u
mpiexec=$1 wxe=$2 compare=$3 src=$4
d=$src/tests/data
model=$d/crossformer_tiny_snbaked_opset17.onnx
common=(--data "$d/train/series" --accum 2 --lr 1e-3 --threads 1 --schedule linear-warmup-cosine --warmup-steps 2
        --steps 10 --save-every 5 --keep 3 --shuffle --seed 5)
nsteps=10 resume_at=step_000005
. "$src/tests/mpi/train_lib.sh"

# inference: NAME MODEL X RANKS ARGS...
infer_case() {
  local name=$1 m=$2 x=$3 n=$4; shift 4
  [ -f "$tmp/$(basename "$m").npy" ] || "$wxe" infer "$m" -i "$x" -o "$tmp/$(basename "$m").npy" -t 1 >/dev/null 2>"$tmp/err"
  if timeout 300 "$mpiexec" --oversubscribe -n "$n" "$wxe" infer "$m" -i "$x" -t 1 "$@" \
       --compare "$tmp/$(basename "$m").npy" --tolerance 1e-5 >"$tmp/out" 2>"$tmp/err" \
     && grep -q "convolutions exchange halo rows" "$tmp/err"; then
    ok "$name"
  else
    bad "$name"; cat "$tmp/out" "$tmp/err"
  fi
}
infer_case infer-domain2 "$model" "$d/crossformer_tiny_x.npy" 2 --domain 2
infer_case infer-domain4 "$model" "$d/crossformer_tiny_x.npy" 4 --domain 4
infer_case infer-tp2xdomain2 "$model" "$d/crossformer_tiny_x.npy" 4 --tp 2 --domain 2
infer_case infer-nextgen-domain2 "$d/nextgen_model_ts.onnx" "$d/nextgen_model_x.npy" 2 --domain 2
infer_case infer-wxformer-mirror-domain4 "$d/wxformer_mirror.onnx" "$d/wxformer_mirror_x.npy" 4 --domain 4
# a --domain that splits nothing: one line naming it, every rank exits
if ! timeout 120 "$mpiexec" --oversubscribe -n 3 "$wxe" infer "$model" -i "$d/crossformer_tiny_x.npy" -t 1 --domain 3 \
     >/dev/null 2>"$tmp/err" && grep -q -- "--domain 3 splits nothing" "$tmp/err"; then
  ok "infer-domain3-refused"; else bad "infer-domain3-refused"; cat "$tmp/err"; fi

"$wxe" finetune "$model" "${common[@]}" --save "$tmp/d1" >/dev/null 2>"$tmp/d1.err" || { echo "FAIL domain1 run"; cat "$tmp/d1.err"; exit 1; }
for mesh in "2 1 2" "4 2 2" "4 1 2"; do
  set -- $mesh
  name=n$1tp$2domain$3
  if mpi "$1" --tp "$2" --domain "$3" --save "$tmp/$name" >/dev/null 2>"$tmp/err" && cp "$tmp/err" "$tmp/$name.err" \
     && grep -q "mesh dp $(($1 / $2 / $3)) x tp $2 x domain $3" "$tmp/err" && grep -q "domain $3: latitude bands" "$tmp/err" \
     && same_losses "$tmp/$name" "$tmp/d1" && "$compare" "$tmp/$name/step_000010" "$tmp/d1/step_000010" 3e-5 >>"$tmp/err" 2>&1; then
    ok "$name-matches-domain1"
  else
    bad "$name-matches-domain1"; cat "$tmp/err"; paste <(losses "$tmp/$name") <(losses "$tmp/d1")
  fi
done
# ZeRO-1 over dp x domain: at domain 2 each rank keeps half the AdamW state of one process
adamw() { sed -n 's/.*memory: rank 0: .*AdamW state \([0-9.]*\) MB.*/\1/p' "$tmp/$1.err" | head -1; }
if awk -v a="$(adamw d1)" -v b="$(adamw n2tp1domain2)" 'BEGIN { exit !(a > 0 && b > 0 && a / b > 1.9 && a / b < 2.1) }'; then
  ok "adamw-state-shared-over-domain"; else bad "adamw-state-shared-over-domain"; adamw d1; adamw n2tp1domain2; fi
# activation checkpointing on bands: the same losses bit for bit (recomputed segments repeat no
# exchange that is not theirs)
if mpi 2 --domain 2 --activation-checkpoint blocks --save "$tmp/ck" >/dev/null 2>"$tmp/err" \
   && grep -q "activation checkpointing: [1-9][0-9]* blocks" "$tmp/err" && same_losses "$tmp/ck" "$tmp/n2tp1domain2" exact; then
  ok "domain2-checkpointing-bit-exact"; else bad "domain2-checkpointing-bit-exact"; cat "$tmp/err"; fi
# stopped at step 5 at domain 2, resumed in one process; and the other way
resume_copy "$tmp/n2tp1domain2" "$tmp/r1"
if "$wxe" finetune "$model" "${common[@]}" --save "$tmp/r1" --resume >/dev/null 2>"$tmp/err" \
   && same_losses "$tmp/r1" "$tmp/d1"; then ok "domain2-resumed-at-domain1"; else bad "domain2-resumed-at-domain1"; cat "$tmp/err"; fi
resume_copy "$tmp/d1" "$tmp/r2"
if mpi 2 --domain 2 --save "$tmp/r2" --resume >/dev/null 2>"$tmp/err" && same_losses "$tmp/r2" "$tmp/d1"; then
  ok "domain1-resumed-at-domain2"; else bad "domain1-resumed-at-domain2"; cat "$tmp/err"; fi
exit $((fails > 0))
