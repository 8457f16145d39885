#!/usr/bin/env bash
# Stages a CUDA build for a GPU machine that has the CUDA/cuDNN runtime but none of the build
# dependencies: build/wxe and build/wxe_tests (debug info stripped, xz), the shared libraries
# they need that are not system or CUDA libraries (xz tarball), the models the GPU tests read,
# and run.sh, which runs them there.
#   tools/gpu_stage.sh DIR            (DIR: e.g. /work/main/.dev)
# Environment: STAGE_DATA="repo-relative files" (default: every model the GPU tests read);
# STAGE_LIBS=0 leaves the libraries out (run.sh then takes LIBS_TARBALL, an xz tarball of
# them, at run time). On the GPU machine, from the folder holding DIR:
#   bash DIR/run.sh tests                          the GPU tests (Backends.*, CudaIndexMath.*)
#   bash DIR/run.sh v2026 MODEL.onnx [RUNS]        random input; CPU vs CUDA output; bench --device cuda
#   bash DIR/run.sh wxe ARGS...                    wxe itself
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dst=${1:?usage: gpu_stage.sh DIR}
data=${STAGE_DATA:-"models/wxformer_tiny/model.onnx models/wxformer_tiny/x.npy models/wxformer_tiny/y.npy
  tests/data/crossformer_tiny_opset17.onnx tests/data/crossformer_tiny_snbaked_opset17.onnx
  tests/data/crossformer_tiny_x.npy tests/data/crossformer_tiny_y.npy
  tests/data/torch2_crossformer_tiny_dynamo.onnx tests/data/torch2_crossformer_tiny_x.npy tests/data/torch2_crossformer_tiny_y.npy
  tests/data/torch2_wxformer_tiny_dynamo.onnx tests/data/torch2_wxformer_tiny_x.npy tests/data/torch2_wxformer_tiny_y.npy"}
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
tar -cJf "$dst/data.tar.xz" $data
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
case "\${1:-tests}" in
  tests) "\$w/bin/wxe_tests" --gtest_filter='Backends.*:CudaIndexMath.*' ;;
  v2026)
    m=\$2
    /opt/torch/.venv/bin/python -c "import numpy as n; n.save('\$w/x.npy', n.random.default_rng(0).standard_normal((1, 80, 1, 181, 360)).astype('float32'))"
    "\$w/bin/wxe" infer "\$m" --input "\$w/x.npy" --output "\$w/y_cpu.npy"
    "\$w/bin/wxe" infer "\$m" --input "\$w/x.npy" --device cuda --compare "\$w/y_cpu.npy"
    "\$w/bin/wxe" bench "\$m" --input "\$w/x.npy" --device cuda --runs "\${3:-20}" --json ;;
  wxe) shift; "\$w/bin/wxe" "\$@" ;;
esac
EOF
du -sh "$dst"
