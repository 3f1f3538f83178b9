// Internal: the packed-weight matmul paths above AVX2 (issue 4) and the Bf16Pairs layout
// (kernels.h PackLayout). Only dispatch.cpp chooses among them.
//   matmul_packed_avx512.cpp       Panel16, f32 FMA on AVX512F/BW/VL (matmul_packed_avx512_impl.h)
//   matmul_packed_avx512bf16.cpp   Bf16Pairs, vdpbf16ps              (matmul_packed_bf16_impl.h)
//   matmul_packed_amx.cpp          Bf16Pairs, AMX-BF16 tiles          (matmul_packed_bf16_impl.h)
// The *_impl.h kernel sources are also compiled by tests/kernels/matmul_packed_isa_emu.cpp on
// SIMDe and a scalar AMX emulator, so that they are tested on CPUs without AVX-512 or AMX.
#pragma once
#include <cstdint>

#include "kvboost/kernels.h"

namespace kvboost::kernels::cpu {

// Bf16Pairs: K padded to a whole AMX tile of k (32 bf16 = 64 bytes), N to two 16-feature panels.
constexpr int64_t kPairsK = 32;
constexpr int64_t kPairsN = 32;
constexpr int64_t kPairsPanel = 16;
inline int64_t pairs_k_padded(int64_t K) { return (K + kPairsK - 1) / kPairsK * kPairsK; }
inline int64_t pairs_n_panels(int64_t N) { return (N + kPairsN - 1) / kPairsN * (kPairsN / kPairsPanel); }
// Bytes of one panel: Kp / 2 rows of 64 bytes.
inline int64_t pairs_panel_bytes(int64_t K) { return pairs_k_padded(K) / 2 * 64; }
inline size_t pairs_packed_bytes(int64_t N, int64_t K) {
  return size_t(pairs_n_panels(N)) * size_t(pairs_panel_bytes(K));
}
// w: [N, K] bf16 (the nn.Linear layout) -> dst (pairs_packed_bytes, 64-byte aligned).
void pack_pairs(const uint16_t* w, int64_t N, int64_t K, uint8_t* dst);
// The bf16 weight w[n][k] as stored in a Bf16Pairs buffer.
inline uint16_t pairs_at(const uint8_t* base, int64_t K, int64_t n, int64_t k) {
  const uint16_t* panel =
      reinterpret_cast<const uint16_t*>(base + (n / kPairsPanel) * pairs_panel_bytes(K));
  return panel[(k / 2) * 32 + (n % kPairsPanel) * 2 + (k & 1)];
}
// matmul_packed_ref for the Bf16Pairs layout (double accumulation, f32 activations).
void matmul_packed_ref_pairs(const float* x, const PackedWeight& w, const float* bias, float* y,
                             int64_t M);

// Panel16 (F32, F16, BF16), any M. Native: only where active_isa() >= Avx512.
void matmul_packed_avx512(const float* x, const PackedWeight& w, const float* bias, float* y,
                          int64_t M);
// Bf16Pairs, any M. Native: only where active_isa() >= Avx512Bf16.
void matmul_packed_avx512bf16(const float* x, const PackedWeight& w, const float* bias, float* y,
                              int64_t M);
// Bf16Pairs, any M (tokens are padded to 32, so M < 16 wastes most of each tile: dispatch
// sends those to matmul_packed_avx512bf16). Native: only where active_isa() >= AmxBf16.
void matmul_packed_amx(const float* x, const PackedWeight& w, const float* bias, float* y,
                       int64_t M);

}  // namespace kvboost::kernels::cpu
