// Dequantization of ggml blocks: every ISA path bit-identical to the scalar reference on
// random blocks, hand-computed values for Q8_0 / Q4_0 / Q5_0 / Q4_K, and argument errors. The
// comparison against the gguf Python package is in tests/model/test_gguf.cpp (DequantOracle).
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kvboost/common.h"
#include "kvboost/kernels.h"
#include "test_util.h"

using namespace kvboost;
using kernels::GgmlType;

namespace {

const GgmlType kTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0,
                           GgmlType::Q5_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

void put_f16(uint8_t* p, float f) {
  const uint16_t h = f32_to_f16(f);
  std::memcpy(p, &h, 2);
}

// Random bytes, with every f16 scale field set to a finite value (random bits there could be
// inf/NaN, which would make bitwise comparison meaningless).
std::vector<uint8_t> random_blocks(GgmlType t, int64_t n, std::mt19937& rng) {
  const int64_t nb = n / kernels::ggml_block_elems(t), bb = kernels::ggml_block_bytes(t);
  std::vector<uint8_t> b(size_t(nb * bb));
  for (auto& x : b) x = uint8_t(rng());
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  for (int64_t i = 0; i < nb; ++i) {
    uint8_t* p = b.data() + i * bb;
    switch (t) {
      case GgmlType::F32:
        for (int64_t k = 0; k < bb; k += 4) { float f = u(rng); std::memcpy(p + k, &f, 4); }
        break;
      case GgmlType::F16: put_f16(p, u(rng)); break;
      case GgmlType::BF16: { uint16_t h = f32_to_bf16(u(rng)); std::memcpy(p, &h, 2); } break;
      case GgmlType::Q8_0: case GgmlType::Q4_0: case GgmlType::Q5_0: put_f16(p, u(rng) * 0.1f); break;
      case GgmlType::Q4_K: case GgmlType::Q5_K: put_f16(p, u(rng) * 0.01f); put_f16(p + 2, u(rng) * 0.01f); break;
      case GgmlType::Q6_K: put_f16(p + 208, u(rng) * 0.01f); break;
    }
  }
  return b;
}

}  // namespace

TEST(Dequant, BlockSizes) {
  EXPECT_EQ(kernels::ggml_row_bytes(GgmlType::Q8_0, 64), 68);
  EXPECT_EQ(kernels::ggml_row_bytes(GgmlType::Q4_0, 32), 18);
  EXPECT_EQ(kernels::ggml_row_bytes(GgmlType::Q5_0, 640), 440);
  EXPECT_TRUE(kernels::ggml_type_supported(6));
  EXPECT_EQ(kernels::ggml_row_bytes(GgmlType::Q4_K, 512), 288);
  EXPECT_EQ(kernels::ggml_row_bytes(GgmlType::Q5_K, 256), 176);
  EXPECT_EQ(kernels::ggml_row_bytes(GgmlType::Q6_K, 256), 210);
  EXPECT_EQ(kernels::ggml_row_bytes(GgmlType::BF16, 3), 6);
  EXPECT_TRUE(kernels::ggml_type_supported(12));
  EXPECT_FALSE(kernels::ggml_type_supported(3));  // Q4_1
}

TEST(Dequant, EveryIsaMatchesReferenceBitForBit) {
  std::mt19937 rng(5);
  const Isa saved = active_isa();
  for (GgmlType t : kTypes) {
    const int64_t n = 256 * 5;
    auto src = random_blocks(t, n, rng);
    std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
    kernels::dequantize_row_ref(src.data(), t, want.data(), n);
    for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
      set_active_isa(isa);
      std::fill(got.begin(), got.end(), -1.0f);
      kernels::dequantize_row(src.data(), t, got.data(), n);
      EXPECT_EQ(0, std::memcmp(want.data(), got.data(), got.size() * 4))
          << kernels::ggml_type_name(t) << " on " << isa_name(active_isa());
    }
  }
  set_active_isa(saved);
}

TEST(Dequant, HandComputedBlocks) {
  // Q8_0: d = 0.5, q = j - 16
  uint8_t q8[34];
  put_f16(q8, 0.5f);
  for (int j = 0; j < 32; ++j) q8[2 + j] = uint8_t(int8_t(j - 16));
  // Q4_0: d = 2, byte j = (lo = j % 16, hi = 15 - j % 16)
  uint8_t q4[18];
  put_f16(q4, 2.0f);
  for (int j = 0; j < 16; ++j) q4[2 + j] = uint8_t(j | ((15 - j) << 4));
  // Q4_K: d = 1, dmin = 0.5; sub-block j has scale j + 1 and min 2j (j >= 4 use the split
  // encoding); every nibble is 3.
  uint8_t q4k[144] = {};
  put_f16(q4k, 1.0f);
  put_f16(q4k + 2, 0.5f);
  uint8_t sc[8], mn[8];
  for (int j = 0; j < 8; ++j) sc[j] = uint8_t(j + 1 + (j >= 4 ? 40 : 0)), mn[j] = uint8_t(2 * j + (j >= 4 ? 20 : 0));
  for (int j = 0; j < 4; ++j) {
    q4k[4 + j] = uint8_t((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    q4k[4 + j + 4] = uint8_t((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
    q4k[4 + j + 8] = uint8_t((sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4));
  }
  std::memset(q4k + 16, 0x33, 128);
  // Q5_0: d = 0.25, byte j = (lo = j, hi = 15 - j), qh = 0xAAAA0F0F: elements 0..3, 8..11 and
  // the odd ones of 16..31 get the 5th bit.
  uint8_t q5[22];
  put_f16(q5, 0.25f);
  const uint32_t qh5 = 0xAAAA0F0Fu;
  std::memcpy(q5 + 2, &qh5, 4);
  for (int j = 0; j < 16; ++j) q5[6 + j] = uint8_t(j | ((15 - j) << 4));
  const Isa saved = active_isa();
  for (Isa isa : {Isa::Scalar, Isa::Avx2}) {
    set_active_isa(isa);
    float y[256];
    kernels::dequantize_row(q8, GgmlType::Q8_0, y, 32);
    for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], 0.5f * float(j - 16));
    kernels::dequantize_row(q4, GgmlType::Q4_0, y, 32);
    for (int j = 0; j < 16; ++j) {
      EXPECT_EQ(y[j], 2.0f * float(j - 8));
      EXPECT_EQ(y[j + 16], 2.0f * float(7 - j));
    }
    kernels::dequantize_row(q5, GgmlType::Q5_0, y, 32);
    for (int j = 0; j < 16; ++j) {
      EXPECT_EQ(y[j], 0.25f * float((j | int((qh5 >> j) & 1) << 4) - 16)) << j;
      EXPECT_EQ(y[j + 16], 0.25f * float(((15 - j) | int(j % 2) << 4) - 16)) << j;
    }
    kernels::dequantize_row(q4k, GgmlType::Q4_K, y, 256);
    for (int j = 0; j < 8; ++j)
      for (int l = 0; l < 32; ++l) EXPECT_EQ(y[32 * j + l], float(sc[j]) * 3.0f - 0.5f * float(mn[j])) << j;
  }
  set_active_isa(saved);
}

TEST(Dequant, RejectsPartialBlocks) {
  std::vector<uint8_t> b(210);
  std::vector<float> y(256);
  EXPECT_THROW(kernels::dequantize_row(b.data(), GgmlType::Q6_K, y.data(), 100), Error);
  EXPECT_THROW(kernels::dequantize_row_ref(b.data(), GgmlType::Q8_0, y.data(), 33), Error);
  EXPECT_THROW(kernels::dequantize_row(b.data(), GgmlType(3), y.data(), 32), Error);
}
