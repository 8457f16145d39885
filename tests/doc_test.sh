#!/usr/bin/env bash
# The docs' commands, run (docs/internals/tests.md, "The doc-test"): every fenced block whose
# info string is `sh doctest` in README.md and docs/**/*.md runs in bash with `set -e`, from a
# scratch folder per doc file in which build/wxe is the binary under test and models/ and tests/
# are the repository's, blocks of one file in order (a block may use what the one before
# wrote). Also: .ci/run runs the README's test command verbatim, the README's first command
# builds only wxe, and every relative link between the docs names a file (and heading) that
# exists. Fails listing each block that failed, with its output.
# Usage: doc_test.sh WXE_BINARY SOURCE_DIR [MPIEXEC]   (MPIEXEC's folder goes first on PATH)
set -u
wxe=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
src=$(cd "$2" && pwd)
[ $# -ge 3 ] && [ -n "$3" ] && PATH=$(dirname "$3"):$PATH
# Open MPI refuses root (containers) unless asked; ctest sets these too (CMakeLists.txt)
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1} OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
blocks=0
t_all=$(date +%s.%N)

fail() { echo "FAIL $*"; fails=$((fails + 1)); }

cd "$src" || exit 1
docs=(README.md)
while IFS= read -r f; do docs+=("$f"); done < <(find docs -name '*.md' | LC_ALL=C sort)

# --- the README's two commands and .ci/run ---
first_block=$(awk '/^```sh$/ {inb = 1; next} inb && /^```/ {exit} inb' README.md)
cmd1=$(sed -n 1p <<<"$first_block")
cmd2=$(sed -n 2p <<<"$first_block")
if [ "$(wc -l <<<"$first_block")" -eq 2 ] && [[ "$cmd1" == "tools/build.sh wxe && build/wxe "* ]] \
   && [ -n "$cmd2" ] && grep -qxF -- "$cmd2" .ci/run; then
  echo "ok   readme-commands (.ci/run runs: $cmd2)"
else
  fail "readme-commands: the README's first block must be two commands, the first 'tools/build.sh wxe && build/wxe ...', the second run verbatim by .ci/run"
  echo "$first_block"
fi

# --- links between the docs: [text](relative/path.md#heading) ---
slug() {  # GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens
  tr '[:upper:]' '[:lower:]' | sed -e 's/[^a-z0-9 _-]//g' -e 's/ /-/g'
}
anchors() {  # the headings of a markdown file as anchors, outside fenced blocks
  awk '/^```/ {f = !f; next} !f && /^#+ / {sub(/^#+ /, ""); print}' "$1" | slug
}
links=0
link_fails=$fails
for f in "${docs[@]}"; do
  dir=$(dirname "$f")
  while IFS= read -r link; do
    target=${link%%#*}
    anchor=""
    [[ "$link" == *"#"* ]] && anchor=${link#*#}
    links=$((links + 1))
    if [ -n "$target" ]; then
      path=$dir/$target
    else
      path=$f
    fi
    if [ ! -e "$path" ]; then
      fail "link $f: ($link): no file $path"
    elif [ -n "$anchor" ] && [[ "$path" == *.md ]] && ! anchors "$path" | grep -qxF -- "$anchor"; then
      fail "link $f: ($link): no heading '#$anchor' in $path"
    fi
  done < <(awk '/^```/ {f = !f; next} !f' "$f" | grep -o '\](\([^)]*\))' | sed -e 's/^](//' -e 's/)$//' \
             | grep -v '^[a-z]*://' | grep -v '^mailto:')
done
[ $fails -eq "$link_fails" ] && echo "ok   links ($links relative links in ${#docs[@]} files)"

# --- the runnable blocks ---
for f in "${docs[@]}"; do
  work=$tmp/$(tr '/.' '__' <<<"$f")
  mkdir -p "$work/build"
  ln -s "$wxe" "$work/build/wxe"
  ln -s "$src/models" "$work/models"
  ln -s "$src/tests" "$work/tests"
  # one file per block: doctest_<first line>.sh
  awk -v dir="$work" '
    /^```sh doctest *$/ && !inb { inb = 1; n++; out = sprintf("%s/doctest_%03d_%d.sh", dir, n, NR + 1); next }
    inb && /^```/ { inb = 0; close(out); next }
    inb { print > out }' "$f"
  for b in "$work"/doctest_*.sh; do
    [ -e "$b" ] || continue
    blocks=$((blocks + 1))
    line=${b##*_}
    line=${line%.sh}
    t0=$(date +%s.%N)
    (cd "$work" && timeout 120 bash -e "$b") >"$work/out" 2>&1
    rc=$?
    secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    if [ $rc -eq 0 ]; then
      echo "ok   $f:$line (${secs} s)"
    else
      fail "$f:$line: exit $rc (${secs} s):"
      sed 's/^/       /' "$b"
      echo "     output:"
      tail -n 30 "$work/out" | sed 's/^/       /'
    fi
  done
done
total=$(awk -v a="$t_all" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
if [ $blocks -lt 10 ]; then
  fail "only $blocks runnable blocks found (fences '\`\`\`sh doctest')"
fi
echo "$blocks blocks, $fails failures, ${total} s"
exit $((fails > 0))
