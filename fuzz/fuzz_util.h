// Shared by the libFuzzer targets: writing the input to a file for the loaders that take a path,
// and the rule that every target follows -- kvboost::Error (a clear message) is the expected
// answer to bad input; anything else escaping (std::bad_alloc, std::out_of_range, a crash, a
// sanitizer report) is a finding.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "kvboost/common.h"

namespace kvboost::fuzz {

// A per-process scratch file holding the input.
inline const std::string& write_input(const uint8_t* data, size_t size, const char* suffix) {
  static std::string path = "/tmp/kvboost_fuzz_" + std::to_string(::getpid()) + suffix;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f) {
    if (size) std::fwrite(data, 1, size, f);
    std::fclose(f);
  }
  return path;
}

// Runs fn; a kvboost::Error must name its problem (a non-empty message).
template <typename F>
void expect_clean(F&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    if (!e.what() || !*e.what()) __builtin_trap();
  }
}

}  // namespace kvboost::fuzz
