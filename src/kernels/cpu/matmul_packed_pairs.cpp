// The Bf16Pairs packed layout (kernels.h PackLayout, matmul_packed_isa.h): packing, the scalar
// reference over it, and the layout choice per ISA. Plain C++: runs on any CPU.
#include <cstring>

#include "cpu/matmul_packed_isa.h"
#include "kvboost/common.h"

namespace kvboost::kernels {

const char* pack_layout_name(PackLayout l) {
  switch (l) {
    case PackLayout::Panel16: return "Panel16";
    case PackLayout::Bf16Pairs: return "Bf16Pairs";
  }
  return "?";
}

PackLayout pack_layout_for(Isa isa, WType wt) {
  return wt == WType::BF16 && isa >= Isa::Avx512Bf16 ? PackLayout::Bf16Pairs : PackLayout::Panel16;
}

namespace cpu {

void pack_pairs(const uint16_t* w, int64_t N, int64_t K, uint8_t* dst) {
  const int64_t n_panels = pairs_n_panels(N), Kp = pairs_k_padded(K);
  const int64_t panel_bytes = pairs_panel_bytes(K);
  parallel_for_dynamic(n_panels, n_panels > 1 && N * K >= (1 << 16), [&](int64_t p, int) {
    uint16_t* out = reinterpret_cast<uint16_t*>(dst + p * panel_bytes);
    for (int i = 0; i < kPairsPanel; ++i) {
      const int64_t n = p * kPairsPanel + i;
      const uint16_t* row = n < N ? w + n * K : nullptr;
      // Feature i's pairs are the 32-bit words i of each 64-byte row (stride 32 bf16).
      for (int64_t k = 0; k < Kp; ++k) out[(k / 2) * 32 + i * 2 + (k & 1)] = row && k < K ? row[k] : 0;
    }
  });
}

void matmul_packed_ref_pairs(const float* x, const PackedWeight& w, const float* bias, float* y,
                             int64_t M) {
  const int64_t N = w.n(), K = w.k();
  const uint8_t* base = static_cast<const uint8_t*>(w.data());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t m = 0; m < M; ++m) {
      double acc = bias ? bias[n] : 0.0;
      for (int64_t k = 0; k < K; ++k) acc += double(x[m * K + k]) * bf16_to_f32(pairs_at(base, K, n, k));
      y[m * N + n] = float(acc);
    }
}

}  // namespace cpu
}  // namespace kvboost::kernels
