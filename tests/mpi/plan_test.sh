#!/usr/bin/env bash
# wxe plan against finetune's own measurements under mpirun (wxformer_tiny, CPU ranks):
#  - at tp 2, domain 2 and dp 2 (with --activation-checkpoint blocks) the plan's activations at
#    the peak and kept for the backward are within 10% of rank 0's memory line after step 1,
#    and finetune's "plan:" line puts the predicted peak within 10% of the measured peak RSS;
#  - bad requests (no model, --ranks 0, --memory -1) are one line and exit 1;
#  - finetune --memory too small stops before step 1, naming options that would fit.
# Usage: plan_test.sh MPIEXEC WXE SOURCE_DIR
set -u
mpiexec=$1 wxe=$2 src=$3
m=$src/models/wxformer_tiny
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fails=$((fails + 1)); }
mkdir -p "$tmp/d"
for i in 0000 0001; do cp "$m/x.npy" "$tmp/d/x_$i.npy"; cp "$m/y.npy" "$tmp/d/y_$i.npy"; done

# NAME ARGS...: finetune on 2 ranks, one step; compare with the plan's row for that mesh
mesh_case() {
  local name=$1 tp=$2 domain=$3 ck=$4
  shift 4
  if ! timeout 300 "$mpiexec" --oversubscribe -n 2 "$wxe" finetune "$m/model.onnx" --data "$tmp/d" --save "$tmp/s_$name" \
       --steps 1 --threads 1 --activation-checkpoint "$ck" "$@" >"$tmp/out" 2>"$tmp/err"; then
    bad "$name: finetune failed: $(tail -3 "$tmp/err")"; return
  fi
  "$wxe" plan "$m/model.onnx" --train --ranks 2 --input "$m/x.npy" --json >"$tmp/plan.json" 2>"$tmp/perr" || {
    bad "$name: plan failed: $(cat "$tmp/perr")"; return; }
  python3 - "$tmp/err" "$tmp/plan.json" "$tp" "$domain" "$ck" <<'PY' && ok "$name" || bad "$name"
import json, re, sys
err, plan, tp, domain, ck = open(sys.argv[1]).read(), json.load(open(sys.argv[2])), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
line = re.search(r"memory: rank 0: .*activations at the peak ([\d.]+) MB \(kept for the backward ([\d.]+),", err)
meas = re.search(r"plan: predicted peak (\d+) MB per rank; measured after step 1: (\d+) MB", err)
row = [r for r in plan["rows"] if r["tp"] == tp and r["domain"] == domain and r["checkpoint"] == ck][0]
checks = [("activations", row["activations_mb"], float(line.group(1))), ("kept", row["kept_mb"], float(line.group(2))),
          ("peak RSS (finetune's own plan)", float(meas.group(1)), float(meas.group(2)))]
good = True
for what, p, mes in checks:
    print(f"  {what}: planned {p:.1f} MB, measured {mes:.1f} MB")
    good = good and abs(p - mes) <= 0.10 * mes
sys.exit(0 if good else 1)
PY
}
mesh_case tp2 2 1 none --tp 2
mesh_case domain2 1 2 none --domain 2
mesh_case dp2_blocks 1 1 blocks --accum 2

# bad requests: one line on stderr, exit 1
err_case() {
  local name=$1; shift
  "$wxe" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ $rc -eq 1 ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q "^wxe: error: .*$name" "$tmp/err"; then
    ok "error: $name"
  else
    bad "error: $name (exit $rc): $(cat "$tmp/err")"
  fi
}
err_case "no_such.onnx" plan "$tmp/no_such.onnx" --ranks 2 --train
err_case "--ranks" plan "$m/model.onnx" --ranks 0
err_case "--memory" plan "$m/model.onnx" --ranks 1 --memory -1

# will not fit: stops before step 1 with the options that would
"$wxe" finetune "$m/model.onnx" --data "$tmp/d" --save "$tmp/s_small" --steps 1 --threads 1 --memory 0.0001 \
  >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ $rc -eq 1 ] && grep -q "^wxe: error: predicted .* GB per rank > .* GB given (--memory): " "$tmp/err" \
   && [ "$(grep -c '^wxe: error' "$tmp/err")" -eq 1 ] && ! grep -q "memory: rank 0" "$tmp/err" \
   && [ ! -f "$tmp/s_small/training_log.csv" ]; then
  ok "will not fit: $(grep '^wxe: error' "$tmp/err")"
else
  bad "will not fit (exit $rc): $(tail -3 "$tmp/err")"
fi
# between the one-rank peaks with and without checkpointing (the plan's): it names blocks
"$wxe" plan "$m/model.onnx" --train --ranks 1 --input "$m/x.npy" --json >"$tmp/p1.json"
gb=$(python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['rows']; print((r[0]['peak_mb'] + r[1]['peak_mb']) / 2e3)" "$tmp/p1.json")
"$wxe" finetune "$m/model.onnx" --data "$tmp/d" --save "$tmp/s_tight" --steps 1 --threads 1 --memory "$gb" \
  >"$tmp/out" 2>"$tmp/err"
if [ $? -eq 1 ] && grep -q "activation-checkpoint blocks .* would fit" "$tmp/err"; then
  ok "names what would fit: $(grep '^wxe: error' "$tmp/err")"
else
  bad "names what would fit: $(tail -3 "$tmp/err")"
fi
[ $fails -eq 0 ] && echo "plan: all passed" || echo "plan: $fails failed"
exit $((fails > 0))
