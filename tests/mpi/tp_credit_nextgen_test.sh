#!/usr/bin/env bash
# Issue 23: a CREDIT 2026.2 nextgen_wxformer with spectral norm and column attention, exported by
# the TorchScript exporter (tests/data/credit_nextgen, models/make_credit_nextgen_fixture.py):
#  - `inspect --tp 2` shards attention and feed-forward layers (the spectral-norm weights are
#    computed and transposed in the graph: they must still be read as Linear layers);
#  - `infer --tp 2` with the CREDIT checkpoint equals tp 1 (1e-5) and PyTorch (1e-4);
#  - 3 fine-tuning steps at tp 2 equal tp 1 (losses rtol 1e-5; final parameters, weight_orig and
#    weight_u / weight_v included, 1e-5), the run saves, and both convert back to CREDIT.
# Usage: tp_credit_nextgen_test.sh MPIEXEC WXE COMPARE_CHECKPOINTS SOURCE_DIR
set -u
mpiexec=$1 wxe=$2 compare=$3 src=$4
d=$src/tests/data/credit_nextgen
model=$d/model.onnx
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fails=$((fails + 1)); }
run() { timeout 300 "$mpiexec" --oversubscribe "$@"; }

"$wxe" inspect "$model" --tp 2 >"$tmp/plan" 2>&1
if grep -q "colwise *layers.0.1.layers.0.0.to_q.weight " "$tmp/plan" && grep -q "rowwise *layers.3.1.layers.0.2.to_out.weight " "$tmp/plan" \
   && grep -q "colwise *layers.1.1.layers.0.1.layers.1.weight " "$tmp/plan" && grep -q "rowwise *layers.3.1.layers.0.3.layers.4.weight " "$tmp/plan"; then
  ok "plan-tp2-shards"; else bad "plan-tp2-shards"; cat "$tmp/plan"; fi

"$wxe" infer "$model" -i "$d/x.npy" -w "$d/checkpoint.pt" -o "$tmp/y1.npy" --threads 1 >/dev/null 2>"$tmp/err" \
  || { echo "FAIL tp1 infer"; cat "$tmp/err"; exit 1; }
if run -n 2 "$wxe" infer "$model" -i "$d/x.npy" -w "$d/checkpoint.pt" --tp 2 --threads 1 --compare "$tmp/y1.npy" \
     --tolerance 1e-5 >"$tmp/out" 2>"$tmp/err" \
   && run -n 2 "$wxe" infer "$model" -i "$d/x.npy" -w "$d/checkpoint.pt" --tp 2 --threads 1 --compare "$d/y.npy" \
     --tolerance 1e-4 >>"$tmp/out" 2>>"$tmp/err" && ! grep -q "shard nothing" "$tmp/err"; then
  ok "infer-tp2-matches-tp1"; else bad "infer-tp2-matches-tp1"; cat "$tmp/out" "$tmp/err"; fi

common=(--weights "$d/checkpoint.pt" --data "$d/data" --steps 3 --lr 1e-3 --threads 1 --schedule linear-warmup-cosine
        --warmup-steps 1)
losses() { tail -n +2 "$1/training_log.csv" | cut -d, -f2; }
same_losses() {
  paste <(losses "$1") <(losses "$2") | awk '{ d = $1 - $2; if (d < 0) d = -d; m = $2 < 0 ? -$2 : $2
    if (d > 1e-5 * m) bad = 1; n++ } END { exit (bad || n != 3) }'
}
"$wxe" finetune "$model" "${common[@]}" --save "$tmp/tp1" >/dev/null 2>"$tmp/err" || { echo "FAIL tp1 finetune"; cat "$tmp/err"; exit 1; }
if run -n 2 "$wxe" finetune "$model" "${common[@]}" --tp 2 --save "$tmp/tp2" >/dev/null 2>"$tmp/err" \
   && grep -q "tensor parallel over 2 ranks" "$tmp/err" && same_losses "$tmp/tp2" "$tmp/tp1" \
   && "$compare" "$tmp/tp2/step_000003" "$tmp/tp1/step_000003" 1e-5; then
  ok "finetune-tp2-matches-tp1"; else bad "finetune-tp2-matches-tp1"; cat "$tmp/err"; paste <(losses "$tmp/tp2") <(losses "$tmp/tp1"); fi
for r in tp1 tp2; do
  if "$wxe" convert "$tmp/$r/step_000003" --to credit --output "$tmp/$r.pt" --like "$d/checkpoint.pt" >"$tmp/out" 2>&1; then
    ok "convert-$r-to-credit"; else bad "convert-$r-to-credit"; cat "$tmp/out"; fi
done
exit $((fails > 0))
