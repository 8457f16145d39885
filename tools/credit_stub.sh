#!/usr/bin/env bash
# Copies CREDIT's model files (miles-credit's CrossFormer and WXFormer, with what they import)
# from an installed miles-credit into DIR/credit, without the package's other dependencies
# (xarray, torch_harmonics, segmentation_models_pytorch, ...): PYTHONPATH=DIR then builds the
# models in bench/compare_train.py and models/make_production_model.py on a machine that has
# only torch and einops, such as a lent GPU machine. The post block is a stub that refuses.
#   tools/credit_stub.sh DIR [PYTHON]      (PYTHON: one with miles-credit installed)
set -euo pipefail
dst=${1:?usage: credit_stub.sh DIR [PYTHON]}
py=${2:-python3}
src=$("$py" -c 'import credit, os; print(os.path.dirname(credit.__file__))')
rm -rf "$dst/credit"
mkdir -p "$dst/credit/models/wxformer" "$dst/credit/postblock"
for f in models/crossformer.py models/wxformer/crossformer.py models/base_model.py boundary_padding.py \
         models/unet_attention_modules.py models/checkpoint.py; do
  cp "$src/$f" "$dst/credit/$f"
done
touch "$dst/credit/__init__.py" "$dst/credit/models/__init__.py" "$dst/credit/models/wxformer/__init__.py" \
      "$dst/credit/postblock/__init__.py"
cat > "$dst/credit/postblock/gen1.py" <<'PY'
class PostBlock:  # stub: the benchmark configs build CREDIT's models without the post block
    def __init__(self, *args, **kwargs):
        raise RuntimeError("CREDIT's PostBlock is not in this stub (tools/credit_stub.sh)")
PY
echo "$dst/credit from $src"
