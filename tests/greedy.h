// Tests: greedy generation of exactly max_new tokens (temperature 0, end-of-sequence ignored).
#pragma once

#include <cstdint>

#include "kvboost/runtime.h"

namespace kvboost::test {

inline GenerateOptions greedy(int64_t max_new) {
  GenerateOptions o;
  o.max_new_tokens = max_new;
  o.sampling.temperature = 0.0f;
  o.ignore_eos = true;
  return o;
}

}  // namespace kvboost::test
