// Set-up shared by the Google Benchmark programs (kernels_bench, kernels_gbench): random
// activations and weights of every element type, the KVBOOST_THREADS override, and the label
// each result carries (kernel path, threads).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kvboost/common.h"
#include "kvboost/kernels.h"

namespace kvboost::bench {

// Normally distributed values (activations): n is small next to the weights.
inline std::vector<float> randv(size_t n, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// splitmix64: fast enough to fill a 525 MB lm_head in about a second (std::normal_distribution
// takes ten times longer); the values only have to be finite and varied.
inline uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
// Uniform in [-scale, scale).
inline float uniform(uint64_t& s, float scale) {
  return (float(splitmix64(s) >> 40) * (1.0f / 8388608.0f) - 1.0f) * scale;
}

// n_copies copies of a random [N, K] matrix of the plain type wt (F32, F16, BF16), contiguous.
inline std::vector<uint8_t> make_weights(kernels::WType wt, int64_t N, int64_t K, int n_copies,
                                         uint64_t seed = 7) {
  const size_t esz = size_t(kernels::wtype_size(wt)), one = size_t(N * K) * esz;
  std::vector<uint8_t> buf(one * size_t(n_copies));
  uint64_t s = seed;
  for (int64_t i = 0; i < N * K; ++i) {
    const float f = uniform(s, 0.05f);
    if (wt == kernels::WType::F32) {
      std::memcpy(buf.data() + 4 * i, &f, 4);
    } else {
      const uint16_t h = wt == kernels::WType::F16 ? f32_to_f16(f) : f32_to_bf16(f);
      std::memcpy(buf.data() + 2 * i, &h, 2);
    }
  }
  for (int c = 1; c < n_copies; ++c) std::memcpy(buf.data() + one * size_t(c), buf.data(), one);
  return buf;
}

// A random [N, K] matrix of a quantized type: random quant bytes (every nibble and bit pattern)
// with small finite f16 scales, as tests/kernels/test_quant_matmul.cpp random_blocks. The
// kernels' speed does not depend on the values, only on them being finite.
inline std::vector<uint8_t> make_quant_weights(kernels::WType wt, int64_t N, int64_t K, uint64_t seed = 7) {
  using kernels::WType;
  const int64_t bb = kernels::wtype_block_bytes(wt), nb = N * K / kernels::wtype_block_elems(wt);
  std::vector<uint8_t> b(size_t(nb * bb));
  uint64_t s = seed;
  for (size_t i = 0; i + 8 <= b.size(); i += 8) {
    const uint64_t r = splitmix64(s);
    std::memcpy(b.data() + i, &r, 8);
  }
  auto put_f16 = [](uint8_t* p, float v) {
    const uint16_t h = f32_to_f16(v);
    std::memcpy(p, &h, 2);
  };
  for (int64_t i = 0; i < nb; ++i) {
    uint8_t* p = b.data() + i * bb;
    switch (wt) {
      case WType::Q8_0: case WType::Q4_0: case WType::Q5_0: put_f16(p, uniform(s, 0.05f)); break;
      case WType::Q4_Z: put_f16(p, std::fabs(uniform(s, 0.05f))), p[2] &= 0x0F, p[3] = 0; break;
      case WType::Q4_K: case WType::Q5_K: put_f16(p, uniform(s, 0.002f)), put_f16(p + 2, uniform(s, 0.002f)); break;
      case WType::Q6_K: put_f16(p + 208, uniform(s, 0.001f)); break;
      default: break;
    }
  }
  return b;
}

// KVBOOST_THREADS=n: kernels on n threads (default: all cores). Applied once.
inline void apply_env() {
  static bool done = false;
  if (done) return;
  done = true;
  if (const char* t = std::getenv("KVBOOST_THREADS")) set_num_threads(std::atoi(t));
}

// "avx2 threads=2": what a result was measured with.
inline std::string label() {
  return std::string(isa_name(active_isa())) + " threads=" + std::to_string(num_threads());
}

}  // namespace kvboost::bench
