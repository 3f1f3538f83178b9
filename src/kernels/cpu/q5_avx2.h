// Internal, AVX2 translation units only: Q5_0's 32 high bits as bytes.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace kvboost::kernels::cpu {

// qh: Q5_0's 4 bytes (bit j of the little-endian uint32 = 5th bit of element j) -> byte j of
// the result is 0x10 when bit j is set, else 0 (ggml's bytes_from_bits_32, masked to 0x10).
// Byte k of qh is broadcast to result bytes 8k..8k+7; OR-ing in every bit but the one of
// interest and comparing with 0xFF tests that bit.
inline __m256i q5_high_bits(const uint8_t* qh) {
  uint32_t x;
  std::memcpy(&x, qh, 4);
  const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
  __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(int(x)), shuf);
  bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
  return _mm256_and_si256(_mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1)), _mm256_set1_epi8(0x10));
}

}  // namespace kvboost::kernels::cpu
