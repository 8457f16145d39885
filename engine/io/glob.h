// Glob patterns over tensor names ('*': any run of characters, '?': one character), shared by
// --freeze, TP plan files and anything else that selects tensors by name.
#pragma once
#include <string>

namespace wxe {

// True when `pattern` matches all of `name`. No recursion and no backtracking beyond the last
// '*': time O(|pattern| + |name|) for patterns with at most one '*' and O(|pattern| * |name|)
// at worst, so a hostile plan file ("*********Z") cannot hang a run.
bool glob_match(const std::string& pattern, const std::string& name);

}  // namespace wxe
