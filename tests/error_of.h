// The message of the kvboost::Error that f() throws, or "" when it throws none (tests that
// check what an error says).
#pragma once

#include <string>
#include <utility>

#include "kvboost/common.h"

namespace kvboost::test {

template <typename F>
std::string error_of(F&& f) {
  try {
    std::forward<F>(f)();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace kvboost::test
