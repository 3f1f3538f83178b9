// matmul over quantized weights (Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K, Q4_Z, Q4_Z128) on every ISA path against
// matmul_ref (the weight row dequantized exactly, double accumulation), shapes with M = 1
// (decode GEMV) and M > 1 (token tiles), odd N, K of several blocks, with and without bias.
//
// Tolerance, derived from the one approximation the fast paths make: each activation block of
// 32 is stored as q * d with d = max|x| / 127 and q = round(x / d), so |x - q d| <= d / 2 and
// the exact dot over the stored weights w moves by at most
//     bound(m, n) = sum over blocks b of d_b / 2 * sum_{k in b} |w[n, k]|,
// plus f32 rounding (products and the sum over blocks): 1e-5 * sum_k |x[m, k] w[n, k]|.
// The scalar and AVX2 paths compute the same integer dots below 64 tokens (AVX2 through the
// prefill GEMM from 16 on), so between them only the f32 rounding term remains; from 64 on the
// scalar path dequantizes the weights to f32.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kvboost/common.h"
#include "kvboost/kernels.h"
#include "kernel_test_util.h"
#include "test_util.h"

using namespace kvboost;
using namespace kvboost::kernels;

namespace {
using kernel_test::IsaGuard;
using kernel_test::isas;
using kernel_test::randv;

const WType kQTypes[] = {WType::Q8_0, WType::Q4_0, WType::Q5_0, WType::Q4_K, WType::Q5_K, WType::Q6_K, WType::Q4_Z,
                         WType::Q4_Z128};

void put_f16(uint8_t* p, float f) {
  const uint16_t h = f32_to_f16(f);
  std::memcpy(p, &h, 2);
}
float f16r(float f) { return f16_to_f32(f32_to_f16(f)); }
int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

// ---- small quantizers (what llama.cpp / gguf_fixture.py / the AWQ loader write) ----
void quant_q8_0(const float* x, uint8_t* b) {
  float amax = 0;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127;
  put_f16(b, d);
  for (int i = 0; i < 32; ++i) b[2 + i] = uint8_t(int8_t(d > 0 ? std::lround(x[i] / d) : 0));
}
void quant_q4_0(const float* x, uint8_t* b) {  // ggml: d = (signed max) / -8
  float amax = 0, mx = 0;
  for (int i = 0; i < 32; ++i)
    if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), mx = x[i];
  const float d = mx / -8, id = d != 0 ? 1 / d : 0;
  put_f16(b, d);
  for (int j = 0; j < 16; ++j) {
    const int lo = clampi(int(x[j] * id + 8.5f), 0, 15), hi = clampi(int(x[j + 16] * id + 8.5f), 0, 15);
    b[2 + j] = uint8_t(lo | (hi << 4));
  }
}
void quant_q5_0(const float* x, uint8_t* b) {  // ggml quantize_row_q5_0_ref: d = (signed max) / -16
  float amax = 0, mx = 0;
  for (int i = 0; i < 32; ++i)
    if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), mx = x[i];
  const float d = mx / -16, id = d != 0 ? 1 / d : 0;
  put_f16(b, d);
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    const int lo = clampi(int(x[j] * id + 16.5f), 0, 31), hi = clampi(int(x[j + 16] * id + 16.5f), 0, 31);
    b[6 + j] = uint8_t((lo & 0xF) | ((hi & 0xF) << 4));
    qh |= uint32_t(lo >> 4) << j | uint32_t(hi >> 4) << (j + 16);
  }
  for (int i = 0; i < 4; ++i) b[2 + i] = uint8_t(qh >> (8 * i));
}
void quant_q4_z(const float* x, uint8_t* b) {  // asymmetric: min..max over 16 levels
  float lo = x[0], hi = x[0];
  for (int i = 0; i < 32; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
  const float d = f16r((hi - lo) / 15);
  const int z = d > 0 ? clampi(int(std::lround(-lo / d)), 0, 15) : 0;
  put_f16(b, d);
  b[2] = uint8_t(z), b[3] = 0;
  for (int j = 0; j < 16; ++j) {
    const int a = d > 0 ? clampi(int(std::lround(x[j] / d)) + z, 0, 15) : z;
    const int c = d > 0 ? clampi(int(std::lround(x[j + 16] / d)) + z, 0, 15) : z;
    b[4 + j] = uint8_t(a | (c << 4));
  }
}
// Q4_Z128: one (d, z) for 128 elements; byte i holds elements i | 32 + i, byte 32 + i 64 + i | 96 + i.
void quant_q4_z128(const float* x, uint8_t* b) {
  float lo = x[0], hi = x[0];
  for (int i = 0; i < 128; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
  const float d = f16r((hi - lo) / 15);
  const int z = d > 0 ? clampi(int(std::lround(-lo / d)), 0, 15) : 0;
  put_f16(b, d);
  b[2] = uint8_t(z), b[3] = 0;
  auto q = [&](int e) { return d > 0 ? clampi(int(std::lround(x[e] / d)) + z, 0, 15) : z; };
  for (int h = 0; h < 2; ++h)
    for (int j = 0; j < 32; ++j) b[4 + 32 * h + j] = uint8_t(q(64 * h + j) | (q(64 * h + 32 + j) << 4));
}
// gguf_fixture.py quantize_q4_k (five = Q5_K): per sub-block scale and min, 6-bit each.
void quant_q45_k(const float* x, uint8_t* b, bool five) {
  const int levels = five ? 31 : 15;
  float scale[8], mins[8], smax = 0, mmax = 0;
  for (int j = 0; j < 8; ++j) {
    float lo = 0, hi = x[32 * j];
    for (int l = 0; l < 32; ++l) lo = std::min(lo, x[32 * j + l]), hi = std::max(hi, x[32 * j + l]);
    scale[j] = (hi - lo) / levels, mins[j] = -lo;
    smax = std::max(smax, scale[j]), mmax = std::max(mmax, mins[j]);
  }
  const float d = f16r(smax / 63), dmin = f16r(mmax / 63);
  put_f16(b, d), put_f16(b + 2, dmin);
  uint8_t sc[8], m[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = uint8_t(d > 0 ? clampi(int(std::lround(scale[j] / d)), 0, 63) : 0);
    m[j] = uint8_t(dmin > 0 ? clampi(int(std::lround(mins[j] / dmin)), 0, 63) : 0);
  }
  uint8_t* s = b + 4;
  for (int j = 0; j < 4; ++j) {
    s[j] = uint8_t((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    s[j + 4] = uint8_t((m[j] & 63) | ((m[j + 4] >> 4) << 6));
    s[j + 8] = uint8_t((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
  }
  uint8_t* qh = b + 16;
  uint8_t* qs = b + (five ? 48 : 16);
  if (five) std::memset(qh, 0, 32);
  std::memset(qs, 0, 128);
  for (int j = 0; j < 8; ++j) {
    const float es = d * sc[j], em = dmin * m[j];
    for (int l = 0; l < 32; ++l) {
      const int q = es > 0 ? clampi(int(std::lround((x[32 * j + l] + em) / es)), 0, levels) : 0;
      qs[32 * (j / 2) + l] |= uint8_t((q & 0xF) << (4 * (j % 2)));
      if (five) qh[l] |= uint8_t(((q >> 4) & 1) << j);
    }
  }
}
// gguf_fixture.py quantize_q6_k.
void quant_q6_k(const float* x, uint8_t* b) {
  float scale[16], smax = 0;
  for (int i = 0; i < 16; ++i) {
    float a = 0;
    for (int l = 0; l < 16; ++l) a = std::max(a, std::fabs(x[16 * i + l]));
    scale[i] = a / 31, smax = std::max(smax, scale[i]);
  }
  const float d = f16r(smax / 127);
  int8_t sc[16];
  uint8_t q[256];
  for (int i = 0; i < 16; ++i) {
    sc[i] = int8_t(d > 0 ? clampi(int(std::lround(scale[i] / d)), -128, 127) : 0);
    const float es = d * sc[i];
    for (int l = 0; l < 16; ++l)
      q[16 * i + l] = uint8_t((es != 0 ? clampi(int(std::lround(x[16 * i + l] / es)), -32, 31) : 0) + 32);
  }
  uint8_t* ql = b;
  uint8_t* qh = b + 128;
  std::memset(b, 0, 192);
  for (int h = 0; h < 2; ++h)
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < 32; ++l) {
        const int v = q[128 * h + 32 * k + l];
        ql[64 * h + 32 * (k % 2) + l] |= uint8_t((v & 0xF) << (4 * (k / 2)));
        qh[32 * h + l] |= uint8_t((v >> 4) << (2 * k));
      }
  std::memcpy(b + 192, sc, 16);
  put_f16(b + 208, d);
}

// [N, K] random floats quantized row by row to wt.
std::vector<uint8_t> quantize_rows(const std::vector<float>& w, WType wt, int64_t N, int64_t K) {
  const int64_t be = wtype_block_elems(wt), bb = wtype_block_bytes(wt);
  std::vector<uint8_t> out(size_t(N * wtype_row_bytes(wt, K)));
  for (int64_t i = 0; i < N * K / be; ++i) {
    const float* x = w.data() + i * be;
    uint8_t* b = out.data() + i * bb;
    switch (wt) {
      case WType::Q8_0: quant_q8_0(x, b); break;
      case WType::Q4_0: quant_q4_0(x, b); break;
      case WType::Q5_0: quant_q5_0(x, b); break;
      case WType::Q4_Z: quant_q4_z(x, b); break;
      case WType::Q4_Z128: quant_q4_z128(x, b); break;
      case WType::Q4_K: quant_q45_k(x, b, false); break;
      case WType::Q5_K: quant_q45_k(x, b, true); break;
      case WType::Q6_K: quant_q6_k(x, b); break;
      default: ADD_FAILURE() << "not quantized";
    }
  }
  return out;
}

// Random bytes with finite scales: every nibble / bit pattern, int8 -128, zero points 0..15.
std::vector<uint8_t> random_blocks(WType wt, int64_t N, int64_t K, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const int64_t bb = wtype_block_bytes(wt), nb = N * K / wtype_block_elems(wt);
  std::vector<uint8_t> b(size_t(nb * bb));
  for (auto& x : b) x = uint8_t(rng());
  for (int64_t i = 0; i < nb; ++i) {
    uint8_t* p = b.data() + i * bb;
    switch (wt) {
      case WType::Q8_0: case WType::Q4_0: case WType::Q5_0: put_f16(p, u(rng) * 0.05f); break;
      case WType::Q4_Z: case WType::Q4_Z128: put_f16(p, std::fabs(u(rng)) * 0.05f), p[2] &= 0x0F, p[3] = 0; break;
      case WType::Q4_K: case WType::Q5_K: put_f16(p, u(rng) * 0.002f), put_f16(p + 2, u(rng) * 0.002f); break;
      case WType::Q6_K: put_f16(p + 208, u(rng) * 0.001f); break;
      default: break;
    }
  }
  return b;
}

// Dequantized weights (the reference's view of them).
std::vector<float> dequant(const std::vector<uint8_t>& w, WType wt, int64_t N, int64_t K) {
  std::vector<float> out(size_t(N * K));
  const size_t rb = size_t(wtype_row_bytes(wt, K));
  for (int64_t n = 0; n < N; ++n) to_f32(w.data() + n * rb, wt, out.data() + n * K, K);
  return out;
}

// The activation-quantization bound of every output (file comment): act = the d/2 term,
// round = the f32 rounding term.
struct Bound {
  std::vector<double> act, round;
};
Bound bound(const std::vector<float>& x, const std::vector<float>& wf, int64_t M, int64_t N, int64_t K) {
  Bound out;
  out.act.resize(size_t(M * N)), out.round.resize(size_t(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double e = 0, mag = 0;
      for (int64_t b = 0; b < K / 32; ++b) {
        double amax = 0, wsum = 0;
        for (int64_t k = 32 * b; k < 32 * b + 32; ++k) {
          amax = std::max(amax, double(std::fabs(x[size_t(m * K + k)])));
          wsum += std::fabs(wf[size_t(n * K + k)]);
          mag += std::fabs(double(x[size_t(m * K + k)]) * wf[size_t(n * K + k)]);
        }
        e += amax / 127 / 2 * wsum;
      }
      out.act[size_t(m * N + n)] = e;
      out.round[size_t(m * N + n)] = 1e-5 * mag + 1e-6;
    }
  return out;
}

struct Case {
  int64_t M, N, K;
};

void check_type(WType wt, bool random_bytes, const std::vector<Case>& cases) {
  IsaGuard guard;
  const int64_t be = wtype_block_elems(wt);
  uint64_t seed = 1000 + uint64_t(wt) * 17 + (random_bytes ? 1 : 0);
  for (const Case& c0 : cases) {
    Case c = c0;
    c.K = (c.K + be - 1) / be * be;  // whole blocks of this type
    const std::vector<float> x = randv(size_t(c.M * c.K), ++seed);
    const std::vector<float> bias = randv(size_t(c.N), ++seed);
    const std::vector<uint8_t> w =
        random_bytes ? random_blocks(wt, c.N, c.K, ++seed) : quantize_rows(randv(size_t(c.N * c.K), ++seed, 0.05f), wt, c.N, c.K);
    const std::vector<float> wf = dequant(w, wt, c.N, c.K);
    const Bound tol = bound(x, wf, c.M, c.N, c.K);
    for (const float* b : {static_cast<const float*>(nullptr), bias.data()}) {
      std::vector<float> ref(size_t(c.M * c.N)), per_isa[3];
      matmul_ref(x.data(), w.data(), wt, b, ref.data(), c.M, c.N, c.K);
      for (Isa isa : isas()) {
        set_active_isa(isa);
        std::vector<float>& y = per_isa[int(isa)];
        y.assign(size_t(c.M * c.N), NAN);
        matmul(x.data(), w.data(), wt, b, y.data(), c.M, c.N, c.K);
        for (int64_t i = 0; i < c.M * c.N; ++i)
          ASSERT_LE(std::fabs(double(y[size_t(i)]) - ref[size_t(i)]), tol.act[size_t(i)] + tol.round[size_t(i)])
              << wtype_name(wt) << (random_bytes ? " random blocks" : " quantized floats") << " isa "
              << isa_name(isa) << " M " << c.M << " N " << c.N << " K " << c.K << " bias " << (b != nullptr)
              << " at " << i << ": " << y[size_t(i)] << " vs " << ref[size_t(i)];
      }
      // Scalar vs vector: the same integer dots below 64 tokens (AVX2's prefill GEMM from 16
      // on, test_quant_gemm.cpp), so only f32 rounding apart; from 64 tokens the scalar path
      // dequantizes to f32 while every AVX2-level GEMM (Q8_0's included, since its sign-trick
      // kernel) stays on int8 activations, so only the bound against the reference applies.
      if (!per_isa[int(Isa::Avx2)].empty() && c.M < 64)
        for (int64_t i = 0; i < c.M * c.N; ++i) {
          const double d = std::fabs(double(per_isa[0][size_t(i)]) - per_isa[int(Isa::Avx2)][size_t(i)]);
          ASSERT_LE(d, 2 * tol.round[size_t(i)])
              << wtype_name(wt) << " scalar vs avx2 at " << i;
        }
    }
  }
}

std::vector<Case> shapes() {
  // M: decode (1), tile remainders (2, 5, 17), full tiles (64); N odd; K several blocks (rounded
  // up to whole blocks of the type), large enough in one case for the parallel paths.
  return {{1, 37, 96},  {1, 129, 2304}, {2, 37, 224}, {5, 33, 256}, {17, 39, 768}, {64, 41, 512},
          {1, 1, 32},   {64, 129, 1024}};
}

}  // namespace

TEST(QuantMatmul, Sizes) {
  EXPECT_EQ(wtype_row_bytes(WType::Q8_0, 64), 68);
  EXPECT_EQ(wtype_row_bytes(WType::Q4_0, 32), 18);
  EXPECT_EQ(wtype_row_bytes(WType::Q4_Z, 64), 40);
  EXPECT_EQ(wtype_row_bytes(WType::Q4_Z128, 896), 476);
  EXPECT_THROW(wtype_row_bytes(WType::Q4_Z128, 96), Error);
  EXPECT_EQ(wtype_row_bytes(WType::Q5_0, 640), 440);
  EXPECT_EQ(wtype_row_bytes(WType::Q4_K, 512), 288);
  EXPECT_EQ(wtype_row_bytes(WType::Q5_K, 256), 176);
  EXPECT_EQ(wtype_row_bytes(WType::Q6_K, 256), 210);
  EXPECT_EQ(wtype_row_bytes(WType::BF16, 3), 6);
  EXPECT_EQ(wtype_size(WType::F32), 4);
  EXPECT_EQ(wtype_size(WType::BF16), 2);
  for (WType t : kQTypes) {
    EXPECT_TRUE(wtype_is_quantized(t));
    EXPECT_THROW(wtype_size(t), Error) << wtype_name(t);
  }
  EXPECT_FALSE(wtype_is_quantized(WType::F16));
  EXPECT_THROW(wtype_row_bytes(WType::Q4_K, 300), Error);
  EXPECT_STREQ(wtype_name(WType::Q4_Z), "Q4_Z");
  EXPECT_STREQ(wtype_name(WType::Q4_Z128), "Q4_Z128");
  EXPECT_STREQ(wtype_name(WType::Q5_0), "Q5_0");
}

TEST(QuantMatmul, Errors) {
  std::vector<uint8_t> w(4096);
  std::vector<float> x(512), y(4);
  EXPECT_THROW(matmul(x.data(), w.data(), WType::Q4_K, nullptr, y.data(), 1, 1, 128), Error);  // K not 256k
  EXPECT_THROW(matmul_ref(x.data(), w.data(), WType::Q8_0, nullptr, y.data(), 1, 1, 40), Error);
  EXPECT_THROW(pack_weight(w.data(), WType::Q8_0, 1, 32), Error);
}

// Q4_Z by hand: d = 0.5, z = 3: element i of 0..15 = 0.5 * ((i % 16) - 3), 16..31 from high nibbles.
TEST(QuantMatmul, Q4ZLayout) {
  uint8_t b[20] = {};
  put_f16(b, 0.5f);
  b[2] = 3;
  for (int j = 0; j < 16; ++j) b[4 + j] = uint8_t(j | ((15 - j) << 4));
  float f[32];
  to_f32(b, WType::Q4_Z, f, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(f[j], 0.5f * float(j - 3));
    EXPECT_EQ(f[16 + j], 0.5f * float(15 - j - 3));
  }
}

// Q4_Z128 by hand: d = 0.25, z = 5; byte j (0..31) = element j (low) | 32 + j (high), byte 32 + j
// = 64 + j | 96 + j.
TEST(QuantMatmul, Q4Z128Layout) {
  uint8_t b[68] = {};
  put_f16(b, 0.25f);
  b[2] = 5;
  for (int j = 0; j < 32; ++j) {
    b[4 + j] = uint8_t((j % 16) | ((15 - j % 16) << 4));
    b[36 + j] = uint8_t(((j + 3) % 16) | ((j / 2) << 4));
  }
  float f[128];
  to_f32(b, WType::Q4_Z128, f, 128);
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(f[j], 0.25f * float(j % 16 - 5)) << j;
    EXPECT_EQ(f[32 + j], 0.25f * float(15 - j % 16 - 5)) << j;
    EXPECT_EQ(f[64 + j], 0.25f * float((j + 3) % 16 - 5)) << j;
    EXPECT_EQ(f[96 + j], 0.25f * float(j / 2 - 5)) << j;
  }
}

// to_f32 of a quantized row (embedding lookup) = the scalar reference dequantization.
TEST(QuantMatmul, ToF32MatchesDequantRef) {
  IsaGuard guard;
  for (WType wt : kQTypes) {
    const int64_t K = 512;
    const std::vector<uint8_t> w = random_blocks(wt, 1, K, 7);
    std::vector<float> y(static_cast<size_t>(K));
    for (Isa isa : isas()) {
      set_active_isa(isa);
      to_f32(w.data(), wt, y.data(), K);
      // matmul_ref with one-hot activations reads the reference dequantization back.
      for (int64_t k = 0; k < K; k += 97) {
        std::vector<float> e(size_t(K), 0.0f);
        e[size_t(k)] = 1.0f;
        float r;
        matmul_ref(e.data(), w.data(), wt, nullptr, &r, 1, 1, K);
        EXPECT_EQ(y[size_t(k)], r) << wtype_name(wt) << " " << k;
      }
    }
  }
}

class QuantMatmulType : public ::testing::TestWithParam<WType> {};

TEST_P(QuantMatmulType, QuantizedFloatsEveryIsa) { check_type(GetParam(), false, shapes()); }
TEST_P(QuantMatmulType, RandomBlocksEveryIsa) { check_type(GetParam(), true, shapes()); }

// Thread counts 1..3 give the same result (row ranges and panels split differently).
TEST_P(QuantMatmulType, ThreadCounts) {
  IsaGuard guard;
  const WType wt = GetParam();
  const int64_t M = 9, N = 301, K = 1024;
  const std::vector<float> x = randv(size_t(M * K), 5);
  const std::vector<uint8_t> w = random_blocks(wt, N, K, 6);
  for (int64_t m : {int64_t(1), M}) {
    std::vector<float> y1(size_t(m * N)), y(size_t(m * N));
    set_num_threads(1);
    matmul(x.data(), w.data(), wt, nullptr, y1.data(), m, N, K);
    for (int t : {2, 3}) {
      set_num_threads(t);
      matmul(x.data(), w.data(), wt, nullptr, y.data(), m, N, K);
      EXPECT_EQ(y, y1) << wtype_name(wt) << " threads " << t << " M " << m;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, QuantMatmulType, ::testing::ValuesIn(kQTypes),
                         [](const ::testing::TestParamInfo<WType>& i) { return std::string(wtype_name(i.param)); });

// ---- kernels::quantize_row (f32 -> blocks at load: the output projection) ----
//
// Per element, the error of dequantize(quantize(x)) is bounded by the format's step: Q8_0
// |d|/2 plus the f16 rounding of d times |q| <= 127 (0.57 |d|); Q4_0 |d| (the largest value maps
// to -8 exactly, values of the other sign up to +8 are clamped to 7); Q4_Z d/2, and 0.507 d for
// the max when the f16-rounded d puts it just past level 15.5; Q6_K 1.5 times its sub-block step d * scale (make_qx_quants may clamp the largest
// value of a sub-block by up to 0.9 step); and the reconstruction's RMS error relative to the
// values' RMS is measured and bounded.
TEST(QuantizeRow, ErrorWithinTheStepAndSmallRms) {
  const WType types[] = {WType::Q8_0, WType::Q4_0, WType::Q6_K, WType::Q4_Z};
  const double max_rel_rms[] = {0.006, 0.11, 0.02, 0.09};  // measured ~0.4%, 8%, 1.4%, 6.5%
  for (int ti = 0; ti < 4; ++ti) {
    const WType wt = types[ti];
    ASSERT_TRUE(quantize_row_supported(wt));
    const int64_t N = 64, K = 512, be = wtype_block_elems(wt), bb = wtype_block_bytes(wt);
    std::vector<float> x = randv(size_t(N * K), 11 + uint64_t(ti), 0.05f);
    for (int64_t k = 0; k < 64; ++k) x[size_t(3 * K + k)] = 0.0f;  // an all-zero block
    std::vector<uint8_t> q(size_t(N * wtype_row_bytes(wt, K)));
    for (int64_t n = 0; n < N; ++n) quantize_row(x.data() + n * K, wt, q.data() + n * wtype_row_bytes(wt, K), K);
    const std::vector<float> y = dequant(q, wt, N, K);
    double se = 0, ss = 0;
    for (int64_t i = 0; i < N * K; ++i) {
      const uint8_t* b = q.data() + (i / be) * bb;
      const int64_t e = i % be;
      double tol = 0;
      switch (wt) {
        case WType::Q8_0: tol = std::fabs(f16_to_f32(uint16_t(b[0] | b[1] << 8))) * 0.57; break;
        case WType::Q4_0: tol = std::fabs(f16_to_f32(uint16_t(b[0] | b[1] << 8))) * 1.01; break;
        case WType::Q4_Z: tol = f16_to_f32(uint16_t(b[0] | b[1] << 8)) * 0.51; break;
        default: tol = std::fabs(f16_to_f32(uint16_t(b[208] | b[209] << 8)) * int8_t(b[192 + e / 16])) * 1.5; break;
      }
      ASSERT_LE(std::fabs(double(y[size_t(i)]) - x[size_t(i)]), tol * (1 + 1e-6) + 1e-12)
          << wtype_name(wt) << " element " << i << ": " << x[size_t(i)] << " -> " << y[size_t(i)];
      se += (double(y[size_t(i)]) - x[size_t(i)]) * (double(y[size_t(i)]) - x[size_t(i)]);
      ss += double(x[size_t(i)]) * x[size_t(i)];
    }
    for (int64_t k = 0; k < 64; ++k) EXPECT_EQ(y[size_t(3 * K + k)], 0.0f) << wtype_name(wt);
    const double rel = std::sqrt(se / ss);
    std::printf("[ measured ] quantize_row %s: RMS error / RMS = %.4f\n", wtype_name(wt), rel);
    EXPECT_LE(rel, max_rel_rms[ti]) << wtype_name(wt);
  }
}

// Q8_0 and Q4_0 are llama.cpp's formulas, which the test's own quantizers (above) also follow:
// the same blocks except where x / d and x * (1 / d) round differently (a tie; rare).
TEST(QuantizeRow, Q8_0AndQ4_0AsLlamaCpp) {
  const int64_t K = 32 * 512;
  const std::vector<float> x = randv(size_t(K), 21, 0.05f);
  for (WType wt : {WType::Q8_0, WType::Q4_0}) {
    std::vector<uint8_t> q(size_t(wtype_row_bytes(wt, K)));
    quantize_row(x.data(), wt, q.data(), K);
    const std::vector<uint8_t> want = quantize_rows(x, wt, 1, K);
    int64_t diff = 0;
    for (size_t i = 0; i < q.size(); ++i) diff += q[i] != want[i];
    EXPECT_LE(diff, int64_t(q.size() / 1000)) << wtype_name(wt);
  }
}

// Blocks written by quantize_row run through the quantized matmul on every ISA path within the
// activation-rounding bound of the reference.
TEST(QuantizeRow, MatmulOverQuantizedRowsEveryIsa) {
  IsaGuard guard;
  for (WType wt : {WType::Q8_0, WType::Q4_0, WType::Q6_K, WType::Q4_Z}) {
    const int64_t M = 3, N = 67, K = 768;
    const std::vector<float> x = randv(size_t(M * K), 31), wf0 = randv(size_t(N * K), 32, 0.05f);
    std::vector<uint8_t> w(size_t(N * wtype_row_bytes(wt, K)));
    quantize_row(wf0.data(), wt, w.data(), N * K);  // rows are whole blocks: one call for all
    const std::vector<float> wf = dequant(w, wt, N, K);
    const Bound tol = bound(x, wf, M, N, K);
    for (int64_t m : {int64_t(1), M}) {
      std::vector<float> ref(size_t(m * N)), y(size_t(m * N));
      matmul_ref(x.data(), w.data(), wt, nullptr, ref.data(), m, N, K);
      for (Isa isa : isas()) {
        set_active_isa(isa);
        matmul(x.data(), w.data(), wt, nullptr, y.data(), m, N, K);
        for (int64_t i = 0; i < m * N; ++i)
          ASSERT_LE(std::fabs(double(y[size_t(i)]) - ref[size_t(i)]), tol.act[size_t(i)] + tol.round[size_t(i)])
              << wtype_name(wt) << " " << isa_name(isa) << " M " << m << " at " << i;
      }
    }
  }
}

TEST(QuantizeRow, Errors) {
  std::vector<float> x(512, 1.0f);
  std::vector<uint8_t> q(4096);
  EXPECT_FALSE(quantize_row_supported(WType::Q4_K));
  EXPECT_FALSE(quantize_row_supported(WType::BF16));
  EXPECT_THROW(quantize_row(x.data(), WType::Q4_K, q.data(), 256), Error);
  EXPECT_THROW(quantize_row(x.data(), WType::F32, q.data(), 256), Error);
  EXPECT_THROW(quantize_row(x.data(), WType::Q8_0, q.data(), 40), Error);   // not whole blocks
  EXPECT_THROW(quantize_row(x.data(), WType::Q6_K, q.data(), 128), Error);  // Q6_K: 256
}
