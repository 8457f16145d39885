// A small strict JSON parser (objects, arrays, strings, numbers; nothing else) and writer
// helpers, for file headers and indexes (safetensors, plan files, sharded checkpoints).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace wxe {

struct Json {
  enum Type { Str, Num, Arr, Obj, Lit } type = Str;
  std::string s;                  // Str: content (UTF-8); Num: the number's text; Lit: true, false or null
  std::vector<Json> items;        // Arr elements; Obj values
  std::vector<std::string> keys;  // Obj keys (unique), parallel to items
  const Json* get(const std::string& k) const {
    for (size_t i = 0; i < keys.size(); ++i)
      if (keys[i] == k) return &items[i];
    return nullptr;
  }
};

// Parses `text`; errors name `path` and say "malformed <what>". Depth is capped at 16.
Json parse_json(const std::string& text, const std::string& path, const std::string& what = "JSON");
// RFC 4648 base64 (padding optional, no whitespace); errors name `what`.
std::string base64_decode(const std::string& text, const std::string& what);
// A JSON number that is a non-negative integer fitting int64; -1 otherwise.
int64_t checked_index(const Json& j);
// Whole-string number parsing for values read from files: `text` must be a number and nothing
// else ("7x", "", " 7" are errors), in range ("99999999999999999999" and "1e999" are errors;
// an underflow such as "1e-320" reads as the nearest double, 0 or subnormal). Errors are
// "<what>: '<text>' is not a number" or "... is out of range".
int64_t parse_int64(const std::string& text, const std::string& what);
double parse_double(const std::string& text, const std::string& what);
// Appends s as a JSON string literal.
void json_string(std::string& out, const std::string& s);
bool valid_utf8(const std::string& s);
// s shortened to max characters with non-printable bytes escaped, for messages.
std::string printable(const std::string& s, size_t max = 120);

}  // namespace wxe
