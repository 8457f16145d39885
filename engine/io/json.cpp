#include "engine/io/json.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>

#include "engine/ir/error.h"

namespace wxe {

namespace {
constexpr int kMaxDepth = 16;
}  // namespace

namespace {

class JsonParser {
 public:
  JsonParser(const std::string& text, const std::string& path, const std::string& what)
      : t_(text), path_(path), what_(what) {}
  Json parse() {
    if (!valid_utf8(t_)) bad("not valid UTF-8");
    ws();
    Json v = value(0);
    ws();
    if (p_ != t_.size()) bad("unexpected trailing characters");
    return v;
  }

 private:
  [[noreturn]] void bad(const std::string& msg) const {
    fail(path_, ": malformed ", what_, ": ", msg, " (byte ", p_, ")");
  }
  void ws() {
    while (p_ < t_.size() && (t_[p_] == ' ' || t_[p_] == '\t' || t_[p_] == '\n' || t_[p_] == '\r')) ++p_;
  }
  char peek() const { return p_ < t_.size() ? t_[p_] : '\0'; }
  void expect(char c) {
    if (peek() != c || p_ >= t_.size()) bad(std::string("expected '") + c + "'");
    ++p_;
  }
  Json value(int depth) {
    if (depth > kMaxDepth) bad("nested too deeply");
    char c = peek();
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') {
      Json j;
      j.type = Json::Str;
      j.s = string();
      return j;
    }
    if (c == '-' || (c >= '0' && c <= '9')) return number();
    for (const char* lit : {"true", "false", "null"})
      if (t_.compare(p_, std::strlen(lit), lit) == 0) {
        p_ += std::strlen(lit);
        Json j;
        j.type = Json::Lit;
        j.s = lit;
        return j;
      }
    bad(p_ >= t_.size() ? "unexpected end" : "unexpected character");
  }
  Json object(int depth) {
    Json j;
    j.type = Json::Obj;
    expect('{');
    ws();
    if (peek() == '}') { ++p_; return j; }
    std::set<std::string> seen;
    for (;;) {
      ws();
      if (peek() != '"') bad("expected a string key");
      std::string k = string();
      if (!seen.insert(k).second) bad("duplicate key '" + printable(k) + "'");
      ws();
      expect(':');
      ws();
      j.keys.push_back(std::move(k));
      j.items.push_back(value(depth + 1));
      ws();
      if (peek() == ',') { ++p_; continue; }
      expect('}');
      return j;
    }
  }
  Json array(int depth) {
    Json j;
    j.type = Json::Arr;
    expect('[');
    ws();
    if (peek() == ']') { ++p_; return j; }
    for (;;) {
      ws();
      j.items.push_back(value(depth + 1));
      ws();
      if (peek() == ',') { ++p_; continue; }
      expect(']');
      return j;
    }
  }
  static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  uint32_t hex4() {
    if (t_.size() - p_ < 4) bad("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      int h = hexval(t_[p_++]);
      if (h < 0) bad("bad \\u escape");
      v = v * 16 + h;
    }
    return v;
  }
  std::string string() {
    expect('"');
    std::string r;
    for (;;) {
      if (p_ >= t_.size()) bad("unterminated string");
      char c = t_[p_++];
      if (c == '"') return r;
      if ((uint8_t)c < 0x20) bad("control character in a string");
      if (c != '\\') { r += c; continue; }
      if (p_ >= t_.size()) bad("unterminated string");
      char e = t_[p_++];
      switch (e) {
        case '"': r += '"'; break;
        case '\\': r += '\\'; break;
        case '/': r += '/'; break;
        case 'b': r += '\b'; break;
        case 'f': r += '\f'; break;
        case 'n': r += '\n'; break;
        case 'r': r += '\r'; break;
        case 't': r += '\t'; break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xdc00 && cp <= 0xdfff) bad("lone low surrogate");
          if (cp >= 0xd800 && cp <= 0xdbff) {
            if (t_.size() - p_ < 2 || t_[p_] != '\\' || t_[p_ + 1] != 'u') bad("lone high surrogate");
            p_ += 2;
            uint32_t lo = hex4();
            if (lo < 0xdc00 || lo > 0xdfff) bad("bad surrogate pair");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
          }
          if (cp < 0x80) {
            r += (char)cp;
          } else if (cp < 0x800) {
            r += (char)(0xc0 | (cp >> 6));
            r += (char)(0x80 | (cp & 0x3f));
          } else if (cp < 0x10000) {
            r += (char)(0xe0 | (cp >> 12));
            r += (char)(0x80 | ((cp >> 6) & 0x3f));
            r += (char)(0x80 | (cp & 0x3f));
          } else {
            r += (char)(0xf0 | (cp >> 18));
            r += (char)(0x80 | ((cp >> 12) & 0x3f));
            r += (char)(0x80 | ((cp >> 6) & 0x3f));
            r += (char)(0x80 | (cp & 0x3f));
          }
          break;
        }
        default: bad("bad escape");
      }
    }
  }
  Json number() {
    size_t b = p_;
    auto digits = [&] {
      size_t s = p_;
      while (p_ < t_.size() && t_[p_] >= '0' && t_[p_] <= '9') ++p_;
      return p_ - s;
    };
    if (peek() == '-') ++p_;
    if (peek() == '0') ++p_;
    else if (digits() == 0) bad("bad number");
    if (peek() == '.') {
      ++p_;
      if (digits() == 0) bad("bad number");
    }
    if (peek() == 'e' || peek() == 'E') {
      ++p_;
      if (peek() == '+' || peek() == '-') ++p_;
      if (digits() == 0) bad("bad number");
    }
    Json j;
    j.type = Json::Num;
    j.s = t_.substr(b, p_ - b);
    return j;
  }

  const std::string& t_;
  const std::string& path_;
  const std::string& what_;
  size_t p_ = 0;
};

}  // namespace

Json parse_json(const std::string& text, const std::string& path, const std::string& what) {
  return JsonParser(text, path, what).parse();
}

std::string printable(const std::string& s, size_t max) {
  std::string r;
  for (char c : s.substr(0, max)) r += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (s.size() > max) r += "...";
  return r;
}

// Strict UTF-8 (no overlongs, no surrogates, <= U+10FFFF).
bool valid_utf8(const std::string& s) {
  size_t i = 0, n = s.size();
  while (i < n) {
    uint8_t c = (uint8_t)s[i];
    if (c < 0x80) { ++i; continue; }
    int len;
    uint32_t cp;
    if ((c & 0xe0) == 0xc0) { len = 2; cp = c & 0x1f; }
    else if ((c & 0xf0) == 0xe0) { len = 3; cp = c & 0x0f; }
    else if ((c & 0xf8) == 0xf0) { len = 4; cp = c & 0x07; }
    else return false;
    if (i + len > n) return false;
    for (int k = 1; k < len; ++k) {
      uint8_t d = (uint8_t)s[i + k];
      if ((d & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    static const uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += len;
  }
  return true;
}






std::string base64_decode(const std::string& text, const std::string& what) {
  auto sextet = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
  };
  size_t n = text.size();
  while (n > 0 && text[n - 1] == '=') --n;
  if (text.size() - n > 2 || n % 4 == 1) fail(what, ": malformed base64 (length ", text.size(), ")");
  std::string out;
  out.reserve(n * 3 / 4);
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < n; ++i) {
    int v = sextet(text[i]);
    if (v < 0) fail(what, ": malformed base64 (byte ", i, ")");
    acc = (acc << 6) | (uint32_t)v;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += (char)((acc >> bits) & 0xff);
    }
  }
  return out;
}

int64_t checked_index(const Json& j) {
  if (j.type != Json::Num || j.s.empty() || j.s.size() > 19) return -1;
  uint64_t v = 0;  // at most 19 digits: no uint64 overflow
  for (char c : j.s) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + (uint64_t)(c - '0');
  }
  return v > (uint64_t)INT64_MAX ? -1 : (int64_t)v;
}

int64_t parse_int64(const std::string& text, const std::string& what) {
  const char* b = text.c_str();
  char* end = nullptr;
  errno = 0;
  const long long v = text.empty() || std::isspace((unsigned char)text[0]) ? 0 : std::strtoll(b, &end, 10);
  if (!end || end == b || *end || end != b + text.size()) fail(what, ": '", printable(text), "' is not an integer");
  if (errno == ERANGE) fail(what, ": '", printable(text), "' is out of range");
  return (int64_t)v;
}

double parse_double(const std::string& text, const std::string& what) {
  const char* b = text.c_str();
  char* end = nullptr;
  errno = 0;
  const double v = text.empty() || std::isspace((unsigned char)text[0]) ? 0 : std::strtod(b, &end);
  if (!end || end == b || *end || end != b + text.size()) fail(what, ": '", printable(text), "' is not a number");
  if (errno == ERANGE && std::fabs(v) > 1) fail(what, ": '", printable(text), "' is out of range");
  if (!std::isfinite(v)) fail(what, ": '", printable(text), "' is not a finite number");
  return v;
}

void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (char c : s) {
    uint8_t u = (uint8_t)c;
    if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (u < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", u);
      out += buf;
    } else out += c;
  }
  out += '"';
}

}  // namespace wxe
