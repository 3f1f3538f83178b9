// Dequantization throughput of each GGUF block type, scalar reference vs the AVX2 path: output
// floats per second over 1 Mi elements (median of 7 runs). Was the test Dequant.Throughput, which
// asserted nothing; a benchmark is a program.
//   build/bench/dequant_bench [n_elements]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "kvboost/common.h"
#include "kvboost/kernels.h"

using namespace kvboost;
using kernels::GgmlType;

namespace {
void put_f16(uint8_t* p, float f) {
  const uint16_t h = f32_to_f16(f);
  std::memcpy(p, &h, 2);
}

// Random blocks with finite scales (as tests/kernels/test_dequant.cpp makes them).
std::vector<uint8_t> random_blocks(GgmlType t, int64_t n, std::mt19937& rng) {
  const int64_t nb = n / kernels::ggml_block_elems(t), bb = kernels::ggml_block_bytes(t);
  std::vector<uint8_t> b(size_t(nb * bb));
  for (auto& x : b) x = uint8_t(rng());
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  for (int64_t i = 0; i < nb; ++i) {
    uint8_t* p = b.data() + i * bb;
    switch (t) {
      case GgmlType::Q8_0: case GgmlType::Q4_0: case GgmlType::Q5_0: put_f16(p, u(rng) * 0.1f); break;
      case GgmlType::Q4_K: case GgmlType::Q5_K: put_f16(p, u(rng) * 0.01f); put_f16(p + 2, u(rng) * 0.01f); break;
      case GgmlType::Q6_K: put_f16(p + 208, u(rng) * 0.01f); break;
      default: break;
    }
  }
  return b;
}
}  // namespace

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : int64_t(1) << 20;
  if (n <= 0 || n % 256) {
    std::fprintf(stderr, "dequant_bench: n_elements %lld must be a positive multiple of 256\n", (long long)n);
    return 2;
  }
  std::mt19937 rng(9);
  const Isa saved = active_isa();
  for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
    auto src = random_blocks(t, n, rng);
    std::vector<float> y(static_cast<size_t>(n));
    for (Isa isa : {Isa::Scalar, Isa::Avx2}) {
      set_active_isa(isa);
      kernels::dequantize_row(src.data(), t, y.data(), n);  // warm-up
      std::vector<double> ms;
      for (int r = 0; r < 7; ++r) {
        const double t0 = now_ms();
        kernels::dequantize_row(src.data(), t, y.data(), n);
        ms.push_back(now_ms() - t0);
      }
      std::nth_element(ms.begin(), ms.begin() + 3, ms.end());
      const double m = ms[3];
      std::printf("dequant %-5s %-6s %7.2f Gelem/s (%.1f GB/s written)\n", kernels::ggml_type_name(t),
                  isa_name(active_isa()), double(n) / m / 1e6, double(n) * 4 / m / 1e6);
    }
  }
  set_active_isa(saved);
  return 0;
}
