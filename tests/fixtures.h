// The large CREDIT fixtures that live outside the repository (the benchmark-size
// wxformer_v2026, the real CREDIT checkpoints): the folder $WXE_FIXTURES names, else
// ../shared/fixtures/credit beside the source folder (from WXE_SOURCE_DIR, the CMake source
// dir). Tests that need one skip, naming the variable, where it is absent.
#pragma once
#include <cstdlib>
#include <filesystem>
#include <string>

namespace wxe::test {

// The fixtures' folder, ending in '/'.
inline std::string credit_fixtures_dir() {
  const char* env = std::getenv("WXE_FIXTURES");
  std::string d = env && *env ? std::string(env) : std::string(WXE_SOURCE_DIR) + "/../shared/fixtures/credit";
  if (d.back() != '/') d += '/';
  return d;
}

// Whether every one of `files` is in the fixtures' folder.
inline bool credit_fixtures_present(std::initializer_list<std::string> files) {
  for (const std::string& f : files)
    if (!std::filesystem::exists(credit_fixtures_dir() + f)) return false;
  return true;
}

// The GTEST_SKIP message for an absent fixture file.
inline std::string credit_fixture_skip(const std::string& file) {
  return credit_fixtures_dir() + file +
         " not present: set WXE_FIXTURES to the folder of the CREDIT fixtures (default: ../shared/fixtures/credit "
         "beside the source folder)";
}

}  // namespace wxe::test
