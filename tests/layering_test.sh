#!/usr/bin/env bash
# The folders are layers (docs/internals/layering.md): every #include "x/..." of a source file must
# name a folder its layer may use. Fails listing each include that reaches up or sideways.
# Usage: layering_test.sh SOURCE_DIR
set -u
cd "$1" || exit 1
# folder: the include prefixes it may use (besides its own)
declare -A may=(
  [engine/ir]=""
  [engine/math]="engine/ir"
  [engine/io]="engine/ir"
  [engine/passes]="engine/ir engine/io engine/math"
  [engine/exec]="engine/ir engine/io engine/math engine/passes"
  [kernels]="engine"
  [models]="engine"
  [importers]="engine"
  [parallel]="engine"
  [data]="engine"
  [load]="engine parallel importers models data"
  [train]="engine parallel importers models data load"
  [forecast]="engine parallel importers models data load train"
)
fails=0 checked=0
for dir in "${!may[@]}"; do
  while IFS= read -r hit; do
    file=${hit%%:*} inc=${hit#*#include \"}
    inc=${inc%%\"*}
    checked=$((checked + 1))
    ok=0
    for p in $dir ${may[$dir]}; do [[ $inc == "$p"/* ]] && ok=1; done
    [[ $inc == */* ]] || ok=1  # a sibling header in the same folder
    if [ $ok = 0 ]; then echo "FAIL $file includes $inc (layer $dir may use: ${may[$dir]})"; fails=$((fails + 1)); fi
  done < <(grep -rn '#include "' "$dir" --include='*.h' --include='*.cpp' --include='*.cu')
done
[ "$checked" -gt 100 ] || { echo "FAIL only $checked includes checked"; exit 1; }
echo "$checked includes checked, $fails reach outside their layer"
exit $((fails > 0))
