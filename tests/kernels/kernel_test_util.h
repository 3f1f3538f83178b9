// Shared by the kernel tests: random inputs, the ISA paths this CPU can run, and a guard that
// restores the active ISA and thread count after a test changes them.
#pragma once

#include <random>
#include <vector>

#include "kvboost/common.h"

namespace kvboost::kernel_test {

inline std::vector<float> randv(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Scalar always; then every vector path the hardware supports (asking for the widest and
// reading back what dispatch allows).
inline std::vector<Isa> isas() {
  std::vector<Isa> out{Isa::Scalar};
  set_active_isa(Isa::Avx512);
  const Isa hw = active_isa();
  if (hw >= Isa::Avx2) out.push_back(Isa::Avx2);
  if (hw >= Isa::Avx512) out.push_back(Isa::Avx512);
  return out;
}

struct IsaGuard {
  Isa saved = active_isa();
  int threads = num_threads();
  ~IsaGuard() {
    set_active_isa(saved);
    set_num_threads(threads);
  }
};

}  // namespace kvboost::kernel_test
