#!/usr/bin/env bash
# On a lent GPU machine (the device tool): the GPU tests, cpu-vs-cuda fine-tuning losses, the
# v2026 training step profile and memory (with and without checkpointing), and one training
# step against PyTorch on the GPU for the tiny models and v2026 (bench/compare_train.py
# --device cuda). Stage first, here: tools/gpu_stage.sh .dev; tools/credit_stub.sh .credstub
# $WXE_PYTHON; copy this script to .dev/; then run `bash .dev/gpu_train_check.sh`
# there with .dev and .credstub carried. Logs and JSON go to $OUT. The working tree that travels
# must stay under 64 MiB: move tests/data and models/wxformer_tiny out of it (and `git rm -r
# --cached` them) for the call, and back after; this script links the staged copies in.
set -uo pipefail
cd "$(dirname "$0")/.."
nvidia-smi -L
export PYTHONUNBUFFERED=1
w=/tmp/wxe-gpu
t0=$(date +%s)
bash .dev/run.sh wxe --help > /dev/null 2>&1 || echo "wxe --help failed"
# the tests read their data under the source dir compiled in; this tree travels without it
[ -e tests/data/crossformer_tiny_opset17.onnx ] || { rm -rf tests/data; ln -s $w/src/tests/data tests/data; }
[ -e models/wxformer_tiny/model.onnx ] || { rm -rf models/wxformer_tiny; ln -s $w/src/models/wxformer_tiny models/wxformer_tiny; }
if [ "${TESTS:-1}" = 1 ]; then
  timeout 240 bash .dev/run.sh tests > $OUT/tests.log 2>&1; echo "tests rc $? ($(( $(date +%s) - t0 )) s)"
  grep -E "^\[  (PASSED|FAILED) |^\[==========\]|worst|cases|ChannelLayerNorm|Linear gelu" $OUT/tests.log | tail -24
fi
timeout 60 bash .dev/run.sh finetune > $OUT/finetune.log 2>&1; echo "finetune rc $?"; grep -E "kernels run|losses" $OUT/finetune.log | cut -c1-300
export PYTHONPATH=$(pwd)/.credstub
timeout 60 python3 models/make_production_model.py --model wxformer_v2026 --out /tmp/v26 2>&1 | grep wrote
export LD_LIBRARY_PATH=$w/lib:/usr/local/cuda/lib64:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib
for ck in none blocks; do
  timeout 120 $w/bin/wxe bench --train /tmp/v26/wxformer_v2026_snbaked_opset17.onnx --input /tmp/v26/wxformer_v2026_x.npy \
    --device cuda --runs 3 --activation-checkpoint $ck > $OUT/v26_$ck.log 2>&1; echo "bench $ck rc $?"
  grep -E "host|memory:|training step over" $OUT/v26_$ck.log | cut -c1-400
  [ $ck = none ] && grep -A16 "op type" $OUT/v26_$ck.log
done
for ck in "" "--checkpoint"; do
  WXE_FIXTURES=/tmp/v26 WXE_TESTDATA=$w/src/tests/data timeout 200 python3 bench/compare_train.py --device cuda \
    --models ${MODELS:-crossformer_tiny,wxformer_tiny,wxformer_v2026} --threads 4 --runs 5 --wxe $w/bin/wxe $ck \
    --json $OUT/train${ck:+_ckpt}.json 2>&1 | tee $OUT/train${ck:+_ckpt}.log | grep -E "^(crossformer|wxformer)"
done
echo "total $(( $(date +%s) - t0 )) s"
