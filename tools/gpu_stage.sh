#!/usr/bin/env bash
# Stages a CUDA build for a GPU machine that has the CUDA/cuDNN runtime but none of the build
# dependencies: build/wxe and build/wxe_tests (debug info stripped, xz), the shared libraries
# they need that are not system or CUDA libraries (xz tarball), the models the GPU tests read,
# and run.sh, which runs them there (tools/gpu_check.sh runs it with the inference and training benchmarks).
#   tools/gpu_stage.sh DIR            (DIR: e.g. .dev)
# Environment: STAGE_DATA="repo-relative files" (default: every model the GPU tests read);
# STAGE_LIBS=0 leaves the libraries out (run.sh then takes LIBS_TARBALL, an xz tarball of
# them, at run time). On the GPU machine, from the folder holding DIR:
#   bash DIR/run.sh check                          everything below that needs no extra arguments
#   bash DIR/run.sh tests                          the GPU tests (Backends.*, CudaIndexMath.*, the
#                                                  training ones: GoldenGradients.*, Finetune.Device*)
#   bash DIR/run.sh finetune                       wxe finetune --device cuda vs cpu, 3 steps (losses)
#   bash DIR/run.sh mpi                            mpirun -n 2 finetune (--tp 2, and dp 2) and infer --tp 2
#                                                  --device cuda (needs 2 GPUs and mpirun; NCCL refuses two
#                                                  ranks on one GPU)
#   bash DIR/run.sh v2026 MODEL.onnx [RUNS]        random input; CPU vs CUDA output; bench --device cuda,
#                                                  fp32 and --precision bf16
#   bash DIR/run.sh wxe ARGS...                    wxe itself
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dst=${1:?usage: gpu_stage.sh DIR}
data=${STAGE_DATA:-"models/wxformer_tiny/model.onnx models/wxformer_tiny/x.npy models/wxformer_tiny/y.npy
  tests/data/crossformer_tiny_opset17.onnx tests/data/crossformer_tiny_snbaked_opset17.onnx
  tests/data/crossformer_tiny_x.npy tests/data/crossformer_tiny_y.npy
  tests/data/torch2_crossformer_tiny_dynamo.onnx tests/data/torch2_crossformer_tiny_x.npy tests/data/torch2_crossformer_tiny_y.npy
  tests/data/torch2_wxformer_tiny_dynamo.onnx tests/data/torch2_wxformer_tiny_x.npy tests/data/torch2_wxformer_tiny_y.npy
  tests/data/crossformer_tiny_checkpoint.pt tests/data/wxformer_tiny_opset17.onnx tests/data/wxformer_tiny_checkpoint.pt
  tests/data/train/channel_weights.npy tests/data/train/crossformer_tiny_grad_x.npy tests/data/train/crossformer_tiny_grad_target.npy
  tests/data/train/crossformer_tiny_grad_loss.npy tests/data/train/crossformer_tiny_grads.safetensors
  tests/data/train/crossformer_tiny_grad_state.safetensors tests/data/train/wxformer_tiny_grad_x.npy
  tests/data/train/wxformer_tiny_grad_target.npy tests/data/train/wxformer_tiny_grad_loss.npy
  tests/data/train/wxformer_tiny_grads.safetensors tests/data/train/wxformer_tiny_grad_state.safetensors"}
tmpb=$(mktemp -d)
for b in wxe wxe_tests; do strip -g -o "$tmpb/$b" "$repo/build/$b"; done
tar -C "$tmpb" -cJf "$dst/bin.tar.xz" wxe wxe_tests
rm -rf "$tmpb"
# non-system, non-CUDA libraries
if [ "${STAGE_LIBS:-1}" != 0 ]; then
  libs=$(ldd "$repo/build/wxe_tests" "$repo/build/wxe" | awk '/=> \// {print $3}' | sort -u |
         grep -v -E '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux|libpthread|libdl|librt)[.-]' |
         grep -v -E 'libcudart|libcublas|libcudnn|libnccl|libcuda\.')
  tmp=$(mktemp -d)
  for l in $libs; do cp -L "$l" "$tmp/"; done
  tar -C "$tmp" -cJf "$dst/libs.tar.xz" .
  rm -rf "$tmp"
fi
# the data the GPU tests read (paths as in the repository; a model that is absent is skipped)
cd "$repo"
tar -cf - $data | xz -9 -T1 > "$dst/data.tar.xz"  # -9: its window takes the duplicate models once
# the tests find their data under the source dir compiled into them (WXE_SOURCE_DIR)
srcdir=$repo
cat > "$dst/run.sh" <<EOF
#!/usr/bin/env bash
# Runs the staged wxe on a GPU machine. Usage: bash run.sh tests | v2026 MODEL.onnx [RUNS] | wxe ARGS...
set -euo pipefail
d=\$(cd "\$(dirname "\$0")" && pwd)
w=\${TMPDIR:-/tmp}/wxe-gpu
mkdir -p "\$w/lib" "\$w/bin"
[ -e "\$w/.done" ] || {
  tar -C "\$w/bin" -xJf "\$d/bin.tar.xz"
  mkdir -p "\$w/src" && tar -C "\$w/src" -xJf "\$d/data.tar.xz"
  tar -C "\$w/lib" -xJf "\${LIBS_TARBALL:-\$d/libs.tar.xz}"
  find "\$w/lib" -mindepth 2 -name '*.so*' -exec mv {} "\$w/lib/" \;
  touch "\$w/.done"
}
export LD_LIBRARY_PATH=\$w/lib:/usr/local/cuda/lib64:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
mkdir -p "\$(dirname "$srcdir")" && ln -sfn "\$w/src" "$srcdir"
py=\${PYTHON:-/opt/torch/.venv/bin/python}
gpu_tests() {
  "\$w/bin/wxe_tests" --gtest_filter='Backends.*:CudaIndexMath.*:GoldenGradients.*:Finetune.Device*:Finetune.HostBackendMatchesCpu:DomainParallel.BandCollectivesOnADevice'
}
# 3 steps of wxe finetune on random data (crossformer_tiny), on the CPU and on the GPU: the
# logged losses must agree to 1e-4 relative
finetune_check() {
  local m=\$w/src/tests/data/crossformer_tiny_snbaked_opset17.onnx t=\$w/ft
  rm -rf "\$t" && mkdir -p "\$t/data"
  "\$py" -c "import numpy as n; r=n.random.default_rng(0)
for i in range(4):
    n.save('\$t/data/x_%04d.npy' % i, r.standard_normal((1, 7, 1, 32, 64)).astype('float32'))
    n.save('\$t/data/y_%04d.npy' % i, (0.5 * r.standard_normal((1, 6, 1, 32, 64))).astype('float32'))"
  "\$w/bin/wxe" finetune "\$m" --data "\$t/data" --save "\$t/cpu" --steps 3 --accum 2 --lr 1e-3
  "\$w/bin/wxe" finetune "\$m" --data "\$t/data" --save "\$t/cuda" --steps 3 --accum 2 --lr 1e-3 --device cuda
  "\$py" - "\$t/cpu/training_log.csv" "\$t/cuda/training_log.csv" <<'PY'
import csv, sys
a, b = ([float(r['loss']) for r in csv.DictReader(open(p))] for p in sys.argv[1:3])
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print('finetune cpu losses', a, 'cuda losses', b, 'worst relative difference %.2e' % worst)
sys.exit(0 if len(a) == len(b) == 3 and worst < 1e-4 else 1)
PY
}
mpi_check() {
  local n; n=\$(nvidia-smi -L 2>/dev/null | wc -l)
  if ! command -v mpirun >/dev/null || [ "\$n" -lt 2 ]; then echo "mpi: skipped (needs mpirun and 2 GPUs; \$n GPUs)"; return 0; fi
  local m=\$w/src/tests/data/crossformer_tiny_snbaked_opset17.onnx t=\$w/ft
  [ -d "\$t/data" ] || finetune_check
  mpirun -n 2 "\$w/bin/wxe" finetune "\$m" --data "\$t/data" --save "\$t/tp2" --steps 3 --accum 2 --lr 1e-3 --tp 2 --device cuda
  "\$py" - "\$t/cpu/training_log.csv" "\$t/tp2/training_log.csv" <<'PY'
import csv, sys
a, b = ([float(r['loss']) for r in csv.DictReader(open(p))] for p in sys.argv[1:3])
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print('tp2 cuda losses', b, 'worst relative difference to cpu %.2e' % worst)
sys.exit(0 if len(a) == len(b) and worst < 1e-4 else 1)
PY
  # dp 2: ZeRO's reduce-scatter and all-gather through NCCL on device buffers
  mpirun -n 2 "\$w/bin/wxe" finetune "\$m" --data "\$t/data" --save "\$t/dp2" --steps 3 --accum 2 --lr 1e-3 --device cuda
  "\$py" - "\$t/cpu/training_log.csv" "\$t/dp2/training_log.csv" <<'PY'
import csv, sys
a, b = ([float(r['loss']) for r in csv.DictReader(open(p))] for p in sys.argv[1:3])
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print('dp2 cuda losses', b, 'worst relative difference to cpu %.2e' % worst)
sys.exit(0 if len(a) == len(b) and worst < 1e-4 else 1)
PY
  mpirun -n 2 "\$w/bin/wxe" infer "\$m" --input "\$w/src/tests/data/crossformer_tiny_x.npy" --tp 2 --device cuda \\
    --compare "\$w/src/tests/data/crossformer_tiny_y.npy"
}
case "\${1:-tests}" in
  check) gpu_tests; finetune_check; mpi_check ;;
  tests) gpu_tests ;;
  finetune) finetune_check ;;
  mpi) mpi_check ;;
  v2026)
    m=\$2
    /opt/torch/.venv/bin/python -c "import numpy as n; n.save('\$w/x.npy', n.random.default_rng(0).standard_normal((1, 80, 1, 181, 360)).astype('float32'))"
    "\$w/bin/wxe" infer "\$m" --input "\$w/x.npy" --output "\$w/y_cpu.npy"
    "\$w/bin/wxe" infer "\$m" --input "\$w/x.npy" --device cuda --compare "\$w/y_cpu.npy"
    "\$w/bin/wxe" bench "\$m" --input "\$w/x.npy" --device cuda --runs "\${3:-20}" --json
    "\$w/bin/wxe" infer "\$m" --input "\$w/x.npy" --device cuda --precision bf16 --compare "\$w/y_cpu.npy" --tolerance 1
    "\$w/bin/wxe" bench "\$m" --input "\$w/x.npy" --device cuda --precision bf16 --runs "\${3:-20}" --json ;;
  wxe) shift; "\$w/bin/wxe" "\$@" ;;
esac
EOF
du -sh "$dst"
