#!/usr/bin/env bash
# Everything a lent GPU machine (the device tool) is for, in one call of at most ~9 minutes:
#   1. the GPU tests (Backends.*, CudaIndexMath.*, GoldenGradients.*, Finetune.Device*, ...)
#   2. wxe finetune --device cuda against the CPU's losses, 3 steps
#   3. wxformer_v2026 (made there with CREDIT's class): inference fp32 and bf16 against PyTorch
#      eager and torch.compile (bench/compare_peers.py --device cuda), CPU vs CUDA output
#   4. a v2026 training step with and without activation checkpointing against PyTorch eager and
#      torch.compile: time and device memory (bench/compare_train.py --device cuda)
#   5. (profile) v2026 inference per op type and its slowest nodes, fp32 and bf16
#   6. with >= 2 GPUs and mpirun: tp 2 and dp 2 under NCCL (run.sh mpi)
# Each stage has its own time limit and the script stops starting stages past BUDGET seconds
# (default 500), so a hang costs one stage, not the call. Logs go to $OUT (at most 8 files).
#
# Stage here, then call (STAGES picks stages, default "tests finetune infer train mpi"; also profile):
#   tools/gpu_stage.sh .dev && tools/credit_stub.sh .credstub $WXE_PYTHON
#   (the tree that travels must stay under 64 MiB: move tests/data and models/wxformer_tiny out of
#   it and `git rm -r -q --cached` them for the call, `git reset -q` and move them back after;
#   this script links the staged copies in)
#   device run: bash tools/gpu_check.sh    carry: [".dev", ".credstub"]
# On a machine without a GPU it says so and exits 77 at once.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-check-out}
mkdir -p "$OUT"
if ! nvidia-smi -L 2>/dev/null | grep -q GPU; then
  echo "gpu_check: no NVIDIA GPU here (nvidia-smi -L lists none): nothing to run" >&2
  exit 77
fi
[ -f .dev/run.sh ] || { echo "gpu_check: .dev/run.sh missing: run tools/gpu_stage.sh .dev and carry .dev" >&2; exit 2; }
nvidia-smi -L
export PYTHONUNBUFFERED=1
w=/tmp/wxe-gpu
t0=$(date +%s)
budget=${BUDGET:-500}
stages=" ${STAGES:-tests finetune infer train mpi} "
left() { echo $(( budget - ($(date +%s) - t0) )); }
want() {  # want STAGE NEEDED_SECONDS: the stage is asked for and there is time for it
  [[ $stages == *" $1 "* ]] || return 1
  [ "$(left)" -ge "$2" ] || { echo "$1: skipped, $(left) s of the budget left"; return 1; }
}
bash .dev/run.sh wxe --help > /dev/null 2>&1 || echo "wxe --help failed (unpack or libraries)"
echo "unpacked ($(( $(date +%s) - t0 )) s)"
# the tests read their data under the source dir compiled in; this tree travels without it
[ -e tests/data/crossformer_tiny_opset17.onnx ] || { rm -rf tests/data; ln -s $w/src/tests/data tests/data; }
[ -e models/wxformer_tiny/model.onnx ] || { rm -rf models/wxformer_tiny; ln -s $w/src/models/wxformer_tiny models/wxformer_tiny; }
export LD_LIBRARY_PATH=$w/lib:/usr/local/cuda/lib64:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib
wxe=$w/bin/wxe

if want tests 60; then
  timeout 170 bash .dev/run.sh tests > $OUT/tests.log 2>&1; echo "tests rc $? ($(( $(date +%s) - t0 )) s)"
  grep -E "^\[  FAILED |^\[==========\]|^\[  PASSED" $OUT/tests.log | tail -20
fi
if want finetune 30; then
  timeout 60 bash .dev/run.sh finetune > $OUT/finetune.log 2>&1; echo "finetune rc $?"
  grep -E "losses|error" $OUT/finetune.log | cut -c1-300
fi
v26=/tmp/v26/wxformer_v2026_snbaked_opset17.onnx
if [[ $stages == *" infer "* || $stages == *" train "* || $stages == *" profile "* ]]; then
  PYTHONPATH=$(pwd)/.credstub timeout 90 python3 models/make_production_model.py --model wxformer_v2026 --out /tmp/v26 \
    > $OUT/v2026_make.log 2>&1 || echo "making wxformer_v2026 failed: $(tail -2 $OUT/v2026_make.log)"
fi
if [ -f $v26 ] && want infer 60; then
  x=/tmp/v26/wxformer_v2026_x.npy
  {
    timeout 60 $wxe infer $v26 --input $x --output /tmp/v26/y_cpu.npy --threads 16
    timeout 60 $wxe infer $v26 --input $x --device cuda --compare /tmp/v26/y_cpu.npy
    PYTHONPATH=$(pwd)/.credstub timeout 200 python3 bench/compare_peers.py $v26 $x --device cuda --runs 10 \
      --wxe $wxe --peers wxe,torch,torch_compile --torch-model wxformer_v2026 --expected /tmp/v26/y_cpu.npy \
      --json $OUT/infer_fp32.json
    PYTHONPATH=$(pwd)/.credstub timeout 80 python3 bench/compare_peers.py $v26 $x --device cuda --runs 10 \
      --wxe $wxe --peers wxe,torch --torch-model wxformer_v2026 --wxe-arg=--precision --wxe-arg=bf16 --torch-bf16
  } > $OUT/infer.log 2>&1
  echo "infer ($(( $(date +%s) - t0 )) s)"; grep -E "max abs|^(wxe|pytorch|torch.compile) |error|Error" $OUT/infer.log | cut -c1-200
fi
if [ -f $v26 ] && want train 60; then
  {
    for ck in none blocks; do
      timeout 60 $wxe bench --train $v26 --input /tmp/v26/wxformer_v2026_x.npy --device cuda --runs 3 --activation-checkpoint $ck
    done
    for ck in "" "--checkpoint"; do
      WXE_FIXTURES=/tmp/v26 PYTHONPATH=$(pwd)/.credstub timeout $([ -z "$ck" ] && echo 200 || echo 120) python3 bench/compare_train.py \
        --device cuda --models wxformer_v2026 --threads 4 --runs 5 --wxe $wxe $ck \
        --engines wxe,torch$([ -z "$ck" ] && echo ,torch_compile) --json $OUT/train${ck:+_ckpt}.json
    done
  } > $OUT/train.log 2>&1
  echo "train ($(( $(date +%s) - t0 )) s)"; grep -E "memory|training step over|^wxformer_v2026|error|Error" $OUT/train.log | cut -c1-300
fi
if [ -f $v26 ] && want profile 40; then  # where the time goes: per op type and the slowest nodes
  # and with cuDNN's algorithms chosen by timing them (WXE_CUDNN_FIND=1) rather than by heuristics
  for find in 0 1; do
    for p in fp32 bf16; do
      echo "== inference $p, WXE_CUDNN_FIND=$find"
      WXE_CUDNN_FIND=$find timeout 60 $wxe bench $v26 --input /tmp/v26/wxformer_v2026_x.npy --device cuda --runs 10 --precision $p --nodes 12
    done
    echo "== training step, WXE_CUDNN_FIND=$find"
    WXE_CUDNN_FIND=$find timeout 60 $wxe bench --train $v26 --input /tmp/v26/wxformer_v2026_x.npy --device cuda --runs 3
  done > $OUT/profile.log 2>&1
  echo "profile ($(( $(date +%s) - t0 )) s)"; grep -E "^== |^forward over|^training step over" $OUT/profile.log
fi
if want mpi 40; then
  timeout 90 bash .dev/run.sh mpi > $OUT/mpi.log 2>&1; echo "mpi rc $?"; grep -E "losses|skipped|max abs" $OUT/mpi.log | cut -c1-200
fi
echo "total $(( $(date +%s) - t0 )) s"
