// Errors: bad input is an Error (one line, names the file/node/tensor); broken internal
// invariants are WXE_ASSERT, always on.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace wxe {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

namespace detail {
inline void cat(std::ostringstream&) {}
template <class T, class... R>
void cat(std::ostringstream& os, const T& v, const R&... r) {
  os << v;
  cat(os, r...);
}
}  // namespace detail

// Builds a message from pieces: str("node ", name, ": ", n, " inputs").
template <class... A>
std::string str(const A&... a) {
  std::ostringstream os;
  detail::cat(os, a...);
  return os.str();
}

inline bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

template <class... A>
[[noreturn]] void fail(const A&... a) {
  throw Error(str(a...));
}

[[noreturn]] void assert_failed(const char* cond, const char* file, int line);

}  // namespace wxe

#define WXE_ASSERT(cond) \
  ((cond) ? (void)0 : ::wxe::assert_failed(#cond, __FILE__, __LINE__))
// Bad-input check: throws wxe::Error with the message pieces.
#define WXE_CHECK(cond, ...) \
  ((cond) ? (void)0 : ::wxe::fail(__VA_ARGS__))
