// The quantized prefill GEMMs (src/kernels/cpu/matmul_qgemm_impl.h: AVX2 maddubs, AVX-VNNI;
// matmul_qgemm_avx512_impl.h: AVX512-VNNI 512-bit, AMX-INT8) against their scalar reference cpu::matmul_q_int_ref (the same activation
// quantization and exact integer block dots), for every quantized weight type, on shapes with
// tails: M around the 6- and 4-token tiles, N around the 8-row panels, K of one and several
// blocks. Their only difference from the reference is the order of the f32 scaling and sums,
// so the tolerance is f32 rounding: 2e-5 * sum_k |x w| (+ 1e-6).
//   - AVX2: natively (every CPU this project runs on has it);
//   - VNNI: emulated through SIMDe (matmul_qgemm_emu.cpp) on any AVX2 CPU, and natively
//     (Native.*) where the CPU has AVX-VNNI / AVX512-VNNI (skipped elsewhere);
//   - AVX512-VNNI (512-bit) and AMX-INT8: emulated through SIMDe and the scalar AMX emulator
//     (matmul_qgemm_avx512_emu.cpp), natively where the CPU has them;
// plus the dispatch: matmul picks these from kQGemmMinM tokens, KVBOOST_QUANT_GEMM caps them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/cpu_kernels.h"
#include "kernel_test_util.h"
#include "kvboost/common.h"
#include "kvboost/kernels.h"

namespace kvboost::kernel_test {
void matmul_qgemm_vnni_emu(const float* x, const void* w, kernels::WType wt, const float* bias, float* y,
                           int64_t M, int64_t N, int64_t K);
void matmul_qgemm_avx512vnni_emu(const float* x, const void* w, kernels::WType wt, const float* bias, float* y,
                                 int64_t M, int64_t N, int64_t K);
void matmul_qgemm_amx_emu(const float* x, const void* w, kernels::WType wt, const float* bias, float* y, int64_t M,
                          int64_t N, int64_t K);
void matmul_qbf16_amx_emu(const float* x, const void* w, kernels::WType wt, const float* bias, float* y, int64_t M,
                          int64_t N, int64_t K);
void gemv_q_avx512vnni_emu(const float* x, const void* w, kernels::WType wt, const float* bias, float* y, int64_t M,
                           int64_t N, int64_t K);
void matmul_qbf16_avx512bf16_emu(const float* x, const void* w, kernels::WType wt, const float* bias, float* y,
                                 int64_t M, int64_t N, int64_t K);
}

using namespace kvboost;
using namespace kvboost::kernels;
using namespace kvboost::kernel_test;

namespace {

const WType kTypes[] = {WType::Q8_0, WType::Q4_0, WType::Q5_0, WType::Q4_K, WType::Q5_K,
                        WType::Q6_K, WType::Q4_Z, WType::Q4_Z128};

void put_f16(uint8_t* p, float f) {
  const uint16_t h = f32_to_f16(f);
  std::memcpy(p, &h, 2);
}

// Random block bytes (every nibble / bit pattern, Q8_0's -128, zero points 0..15, Q6_K's
// negative scales) with finite f16 scales.
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

// sum_k |x w| per output (the f32 rounding scale), from the dequantized weights.
std::vector<double> magnitudes(const std::vector<float>& x, const std::vector<uint8_t>& w, WType wt, int64_t M,
                               int64_t N, int64_t K) {
  std::vector<float> wf(size_t(N * K));
  const size_t rb = size_t(wtype_row_bytes(wt, K));
  for (int64_t n = 0; n < N; ++n) to_f32(w.data() + n * rb, wt, wf.data() + n * K, K);
  std::vector<double> mag(size_t(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += std::fabs(double(x[size_t(m * K + k)]) * wf[size_t(n * K + k)]);
      mag[size_t(m * N + n)] = s;
    }
  return mag;
}

using Kernel = void (*)(const float*, const void*, WType, const float*, float*, int64_t, int64_t, int64_t);

struct Shape {
  int64_t M, N, K;  // K: elements; rounded up to the type's block below
};
const Shape kShapes[] = {{1, 8, 256}, {3, 5, 256}, {7, 9, 512}, {16, 16, 256}, {23, 17, 768},
                         {25, 31, 512}, {48, 40, 256}, {70, 13, 1024}};

// One case of the shape sweep: random blocks, activations (with an all-zero row from M = 3 on
// when zero_row), bias values; the same seeds for every kernel checked.
struct Case {
  WType wt;
  int64_t M, N, K;
  bool with_bias;
  std::vector<uint8_t> w;
  std::vector<float> x, bias;
  const float* b() const { return with_bias ? bias.data() : nullptr; }
};

template <typename F>
void for_each_case(bool zero_row, F&& f) {
  for (WType wt : kTypes)
    for (const Shape& s : kShapes)
      for (bool with_bias : {false, true}) {
        const int64_t be = wtype_block_elems(wt), K = (s.K + be - 1) / be * be, M = s.M, N = s.N;
        const uint64_t seed = uint64_t(int(wt)) * 1000 + uint64_t(M * 31 + N * 7 + K);
        Case c{wt, M, N, K, with_bias, random_blocks(wt, N, K, seed), randv(size_t(M * K), seed + 1, 1.0f),
               randv(size_t(N), seed + 2, 0.1f)};
        if (zero_row && M > 2) std::fill(c.x.begin() + K, c.x.begin() + 2 * K, 0.0f);
        f(c);
      }
}

void check_kernel(Kernel fast, const char* name) {
  for_each_case(/*zero_row=*/true, [&](const Case& c) {
    const int64_t M = c.M, N = c.N, K = c.K;
    std::vector<float> ref(size_t(M * N)), got(size_t(M * N), -1.0f);
    cpu::matmul_q_int_ref(c.x.data(), c.w.data(), c.wt, c.b(), ref.data(), M, N, K);
    fast(c.x.data(), c.w.data(), c.wt, c.b(), got.data(), M, N, K);
    const std::vector<double> mag = magnitudes(c.x, c.w, c.wt, M, N, K);
    int bad = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const double tol = 2e-5 * mag[i] + 1e-6;
      if (!(std::fabs(double(got[i]) - ref[i]) <= tol) && bad++ < 3)
        ADD_FAILURE() << name << " " << wtype_name(c.wt) << " M=" << M << " N=" << N << " K=" << K
                      << " bias=" << c.with_bias << " out " << i << ": got " << got[i] << " want " << ref[i]
                      << " (tol " << tol << ")";
    }
  });
}

// The AMX-BF16 quantized prefill (matmul_qbf16_impl.h) computes with bf16-rounded activations and
// bf16-rounded dequantized weights: its reference is that product summed in double, and the only
// difference left is the f32 accumulation in the tiles: 1e-4 * sum_k |x w| (+ 1e-6). A layout or
// tail error is off by whole products, far outside it.
void check_bf16_kernel(Kernel fast, const char* name) {
  for_each_case(/*zero_row=*/false, [&](const Case& c) {
    const int64_t M = c.M, N = c.N, K = c.K;
    std::vector<float> wf(size_t(N * K));
    const size_t rb = size_t(wtype_row_bytes(c.wt, K));
    for (int64_t n = 0; n < N; ++n) to_f32(c.w.data() + n * rb, c.wt, wf.data() + n * K, K);
    auto r16 = [](float v) { return bf16_to_f32(f32_to_bf16(v)); };
    std::vector<float> got(size_t(M * N), -1.0f);
    fast(c.x.data(), c.w.data(), c.wt, c.b(), got.data(), M, N, K);
    int bad = 0;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double ref = c.with_bias ? c.bias[size_t(n)] : 0.0, mag = 0.0;
        for (int64_t k = 0; k < K; ++k) {
          const double p = double(r16(c.x[size_t(m * K + k)])) * r16(wf[size_t(n * K + k)]);
          ref += p, mag += std::fabs(p);
        }
        const double g = got[size_t(m * N + n)], tol = 1e-4 * mag + 1e-6;
        if (!(std::fabs(g - ref) <= tol) && bad++ < 3)
          ADD_FAILURE() << name << " " << wtype_name(c.wt) << " M=" << M << " N=" << N << " K=" << K
                        << " bias=" << c.with_bias << " out " << m << "," << n << ": got " << g << " want " << ref
                        << " (tol " << tol << ")";
      }
  });
}

// The 512-bit VNNI decode GEMV (gemv_q_avx512_impl.h: Q8_0, Q4_0, Q5_0, Q4_K, Q6_K; 1..15 tokens) against the
// integer reference: M around its 6-token tiles, N around its 4-row steps and the threads' 16-row
// boundaries, K of 1..40 blocks.
void check_gemv(Kernel fast, const char* name) {
  for (WType wt : {WType::Q8_0, WType::Q4_0, WType::Q5_0, WType::Q4_K, WType::Q6_K})
    for (int64_t M : {1, 2, 4, 5, 6, 7, 9, 15})
    for (int64_t N : {1, 3, 4, 5, 17, 40, 333})
      for (int64_t K : {32, 96, 256, 640, 1280})
        for (bool with_bias : {false, true}) {
          if (K % wtype_block_elems(wt) != 0) continue;
          if (M > 2 && N > 40 && K > 96) continue;  // the long cases once per type
          const uint64_t seed = uint64_t(int(wt)) * 77 + uint64_t(M * 1001 + N * 13 + K);
          const std::vector<uint8_t> w = random_blocks(wt, N, K, seed);
          const std::vector<float> x = randv(size_t(M * K), seed + 1, 1.0f);
          const std::vector<float> bias = randv(size_t(N), seed + 2, 0.1f);
          const float* b = with_bias ? bias.data() : nullptr;
          std::vector<float> ref(static_cast<size_t>(M * N)), got(static_cast<size_t>(M * N), -1.0f);
          cpu::matmul_q_int_ref(x.data(), w.data(), wt, b, ref.data(), M, N, K);
          fast(x.data(), w.data(), wt, b, got.data(), M, N, K);
          const std::vector<double> mag = magnitudes(x, w, wt, M, N, K);
          int bad = 0;
          for (size_t i = 0; i < ref.size(); ++i) {
            const double tol = 2e-5 * mag[i] + 1e-6;
            if (!(std::fabs(double(got[i]) - ref[i]) <= tol) && bad++ < 3)
              ADD_FAILURE() << name << " " << wtype_name(wt) << " M=" << M << " N=" << N << " K=" << K
                            << " bias=" << with_bias << " out " << i << ": got " << got[i] << " want " << ref[i];
          }
        }
}

// The word-at-a-time unpacking of the K-quant 6-bit scales and mins the fast GEMVs use, against
// k_scale_min byte by byte, over random and all-ones scale bytes.
TEST(QuantGemm, KScalesMins8MatchesKScaleMin) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    uint8_t q[12];
    for (uint8_t& b : q) b = trial == 0 ? 0xFF : uint8_t(rng());
    uint32_t w[4];
    kvboost::kernels::cpu::k_scales_mins8(q, w);
    for (int j = 0; j < 8; ++j) {
      uint8_t s, m;
      kvboost::kernels::cpu::k_scale_min(q, j, s, m);
      EXPECT_EQ((w[j / 4] >> (8 * (j % 4))) & 0xFF, s) << "trial " << trial << " scale " << j;
      EXPECT_EQ((w[2 + j / 4] >> (8 * (j % 4))) & 0xFF, m) << "trial " << trial << " min " << j;
    }
  }
}

TEST(QuantGemm, Avx2MatchesIntReference) {
  if (!(cpu_features().avx2 && cpu_features().fma && cpu_features().f16c)) GTEST_SKIP() << "no AVX2";
  IsaGuard g;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    check_kernel(cpu::matmul_qgemm_avx2, "avx2");
  }
}

// The int16 pair bound of AVX2's Q8_0 (|w| times the xor-flipped activation, matmul_qgemm_impl.h):
// weights of -128 and 127 next to activations that quantize to +127 and -127 reach pairs of
// exactly -32768 and 32512; a saturating or overflowing pair would be off by thousands of units.
TEST(QuantGemm, Avx2Q8_0ExtremePairsExact) {
  if (!(cpu_features().avx2 && cpu_features().fma && cpu_features().f16c)) GTEST_SKIP() << "no AVX2";
  IsaGuard g;
  const int64_t M = 6, N = 9, K = 256, nb = K / 32;
  std::vector<uint8_t> w(size_t(N * nb * 34));
  const int8_t pats[4][2] = {{-128, -128}, {127, 127}, {-128, 127}, {-127, -128}};
  for (int64_t n = 0; n < N; ++n)
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* p = w.data() + (n * nb + b) * 34;
      put_f16(p, 0.01f * float(1 + (n + b) % 3));
      for (int k = 0; k < 32; ++k) p[2 + k] = uint8_t(pats[(n + b + k / 2) % 4][k % 2]);
    }
  std::vector<float> x(size_t(M * K));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) x[size_t(m * K + k)] = (m % 3 == 0) ? 1.0f : (m % 3 == 1) ? -1.0f : ((k / 2) % 2 ? 1.0f : -1.0f);
  std::vector<float> ref(size_t(M * N)), got(size_t(M * N));
  cpu::matmul_q_int_ref(x.data(), w.data(), WType::Q8_0, nullptr, ref.data(), M, N, K);
  const std::vector<double> mag = magnitudes(x, w, WType::Q8_0, M, N, K);
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    std::fill(got.begin(), got.end(), -1.0f);
    cpu::matmul_qgemm_avx2(x.data(), w.data(), WType::Q8_0, nullptr, got.data(), M, N, K);
    for (size_t i = 0; i < ref.size(); ++i)
      EXPECT_NEAR(got[i], ref[i], 2e-5 * mag[i] + 1e-6) << "out " << i << ", " << threads << " threads";
  }
}

#ifdef KVB_TEST_SIMDE
TEST(QuantGemm, VnniEmulatedMatchesIntReference) {
  if (!(cpu_features().avx2 && cpu_features().fma && cpu_features().f16c)) GTEST_SKIP() << "no AVX2";
  IsaGuard g;
  set_num_threads(2);
  check_kernel(matmul_qgemm_vnni_emu, "vnni (SIMDe)");
}

TEST(QuantGemm, Avx512VnniEmulatedMatchesIntReference) {
  if (!(cpu_features().avx2 && cpu_features().fma && cpu_features().f16c)) GTEST_SKIP() << "no AVX2";
  IsaGuard g;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    check_kernel(matmul_qgemm_avx512vnni_emu, "avx512vnni 512-bit (SIMDe)");
  }
}

TEST(QuantGemm, AmxInt8EmulatedMatchesIntReference) {
  if (!(cpu_features().avx2 && cpu_features().fma && cpu_features().f16c)) GTEST_SKIP() << "no AVX2";
  IsaGuard g;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    check_kernel(matmul_qgemm_amx_emu, "amx-int8 (SIMDe + AMX emulator)");
  }
}

TEST(QuantGemm, AmxBf16EmulatedMatchesBf16Reference) {
  if (!(cpu_features().avx2 && cpu_features().fma && cpu_features().f16c)) GTEST_SKIP() << "no AVX2";
  IsaGuard g;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    check_bf16_kernel(matmul_qbf16_amx_emu, "amx-bf16 quantized (SIMDe + AMX emulator)");
    check_bf16_kernel(matmul_qbf16_avx512bf16_emu, "avx512bf16 quantized (SIMDe)");
  }
}

TEST(QuantGemm, Avx512VnniGemvEmulatedMatchesIntReference) {
  if (!(cpu_features().avx2 && cpu_features().fma && cpu_features().f16c)) GTEST_SKIP() << "no AVX2";
  IsaGuard g;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    check_gemv(gemv_q_avx512vnni_emu, "avx512vnni gemv (SIMDe)");
  }
}
#endif

TEST(Native, AvxVnniMatchesIntReference) {
  if (!(cpu_features().avxvnni && cpu_features().avx2)) GTEST_SKIP() << "CPU has no AVX-VNNI";
  check_kernel(cpu::matmul_qgemm_avxvnni, "avxvnni");
}

TEST(Native, Avx512VnniMatchesIntReference) {
  const CpuFeatures& f = cpu_features();
  if (!(f.avx512vnni && f.avx512vl && f.avx512bw && f.avx512f)) GTEST_SKIP() << "CPU has no AVX512-VNNI";
  check_kernel(cpu::matmul_qgemm_avx512vnni, "avx512vnni");
}

TEST(Native, Avx512VnniGemvMatchesIntReference) {
  const CpuFeatures& f = cpu_features();
  if (!(f.avx512vnni && f.avx512vl && f.avx512bw && f.avx512f)) GTEST_SKIP() << "CPU has no AVX512-VNNI";
  IsaGuard g;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    check_gemv(cpu::gemv_q_avx512vnni, "avx512vnni gemv");
  }
}

TEST(Native, AmxInt8MatchesIntReference) {
  const CpuFeatures& f = cpu_features();
  if (!(f.amx_tile && f.amx_int8 && f.avx512vnni && f.avx512bw && f.avx512vl)) GTEST_SKIP() << "CPU has no AMX-INT8";
  if (!amx_request_permission()) GTEST_SKIP() << "the OS refused the AMX tile state";
  check_kernel(cpu::matmul_qgemm_amx, "amxint8");
}

TEST(Native, AmxBf16QuantMatchesBf16Reference) {
  const CpuFeatures& f = cpu_features();
  if (!(f.amx_tile && f.amx_bf16 && f.avx512bf16 && f.avx512bw && f.avx512vl)) GTEST_SKIP() << "CPU has no AMX-BF16";
  if (!amx_request_permission()) GTEST_SKIP() << "the OS refused the AMX tile state";
  IsaGuard g;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    check_bf16_kernel(cpu::matmul_qbf16_amx, "amxbf16 quantized");
  }
}

TEST(Native, Avx512Bf16QuantMatchesBf16Reference) {
  const CpuFeatures& f = cpu_features();
  if (!(f.avx512bf16 && f.avx512bw && f.avx512vl && f.avx512f)) GTEST_SKIP() << "CPU has no AVX512-BF16";
  IsaGuard g;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    check_bf16_kernel(cpu::matmul_qbf16_avx512bf16, "avx512bf16 quantized");
  }
}

// The kernel-path spellings: each names a float level and a quantized-GEMM cap; unknown ones
// are refused with the accepted list; set_kernel_path clamps to the CPU.
TEST(QuantGemm, KernelPathSpellings) {
  struct Case {
    const char* s;
    Isa isa;
    QuantGemm q;
  };
  const Case cases[] = {{"scalar", Isa::Scalar, QuantGemm::Scalar},     {"avx2", Isa::Avx2, QuantGemm::Avx2},
                        {"avxvnni", Isa::Avx2, QuantGemm::AvxVnni},     {"avx512", Isa::Avx512, QuantGemm::Avx512Vnni},
                        {"avx512vnni", Isa::Avx512, QuantGemm::Avx512Vnni},
                        {"avx512bf16", Isa::Avx512Bf16, QuantGemm::Avx512Bf16},
                        {"amx", Isa::AmxBf16, QuantGemm::AmxBf16},      {"amxbf16", Isa::AmxBf16, QuantGemm::AmxBf16},
                        {"amxint8", Isa::AmxBf16, QuantGemm::AmxInt8},  {"amx-int8", Isa::AmxBf16, QuantGemm::AmxInt8}};
  for (const Case& c : cases) {
    Isa isa = Isa::Scalar;
    QuantGemm q = QuantGemm::Scalar;
    ASSERT_TRUE(parse_kernel_path(c.s, isa, q)) << c.s;
    EXPECT_EQ(isa, c.isa) << c.s;
    EXPECT_EQ(q, c.q) << c.s;
    Isa common_isa = Isa::Scalar;
    ASSERT_TRUE(parse_isa(c.s, common_isa)) << c.s << ": KVBOOST_ISA must accept every kernel path";
    EXPECT_EQ(common_isa, c.isa) << c.s;
  }
  Isa isa;
  QuantGemm q;
  EXPECT_FALSE(parse_kernel_path("avx1024", isa, q));
  IsaGuard g;
  try {
    set_kernel_path("avx1024");
    ADD_FAILURE() << "no error for an unknown path";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("avx1024"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("amxint8"), std::string::npos) << e.what();
  }
  if (active_isa() < Isa::Avx2) GTEST_SKIP() << "no AVX2";
  set_kernel_path("avx2");  // no VNNI even where the CPU has it
  EXPECT_EQ(quant_gemm_path(), QuantGemm::Avx2);
  set_kernel_path("amxint8");  // clamped to the best this CPU has
  const CpuFeatures& f = cpu_features();
  const QuantGemm best = quant_gemm_path();
  if (!f.avxvnni && !f.avx512vnni) {
    EXPECT_EQ(best, QuantGemm::Avx2);
  }
  if (!(f.amx_tile && f.amx_int8)) {
    EXPECT_NE(best, QuantGemm::AmxInt8);
  }
  EXPECT_NE(best, QuantGemm::AmxBf16);  // amxint8 caps below amxbf16
  set_kernel_path("scalar");
  EXPECT_EQ(quant_gemm_path(), QuantGemm::Scalar);
  set_kernel_path("amx");  // back to the best (IsaGuard restores the float level)
}

// Through kernels::matmul: from kQGemmMinM tokens the GEMM (within the reference's f32
// rounding); below, the decode/small-batch tiles (the same integer dots); KVBOOST_QUANT_GEMM.
TEST(QuantGemm, DispatchAndEnvCap) {
  IsaGuard g;
  set_active_isa(Isa::Avx512);
  if (active_isa() < Isa::Avx2) GTEST_SKIP() << "no AVX2";
  const QuantGemm best = quant_gemm_path();
  EXPECT_GE(int(best), int(QuantGemm::Avx2));
  ::setenv("KVBOOST_QUANT_GEMM", "avx2", 1);
  EXPECT_EQ(quant_gemm_path(), QuantGemm::Avx2);
  ::setenv("KVBOOST_QUANT_GEMM", "bogus", 1);
  EXPECT_THROW(quant_gemm_path(), Error);
  ::unsetenv("KVBOOST_QUANT_GEMM");
  EXPECT_EQ(quant_gemm_path(), best);
  EXPECT_NE(best, QuantGemm::Avx512Bf16);  // the Avx512 level caps it out
  {
    // At the AVX512-BF16 level the bf16-panel path is never the default: only by name.
    IsaGuard g2;
    set_active_isa(Isa::Avx512Bf16);
    const QuantGemm dflt = quant_gemm_path();
    EXPECT_NE(dflt, QuantGemm::Avx512Bf16) << quant_gemm_name(dflt);
    const CpuFeatures& f = cpu_features();
    if (active_isa() == Isa::Avx512Bf16 && f.avx512vnni) {
      EXPECT_EQ(dflt, QuantGemm::Avx512Vnni);
    }
  }
  {
    IsaGuard g2;
    set_active_isa(Isa::Avx512Bf16);
    ::setenv("KVBOOST_QUANT_GEMM", "avx512bf16", 1);
    const QuantGemm named = quant_gemm_path();
    ::unsetenv("KVBOOST_QUANT_GEMM");
    if (active_isa() >= Isa::Avx512Bf16) EXPECT_EQ(named, QuantGemm::Avx512Bf16);
    else EXPECT_NE(named, QuantGemm::Avx512Bf16);
  }
  set_active_isa(Isa::Scalar);
  EXPECT_EQ(quant_gemm_path(), QuantGemm::Scalar);
  set_active_isa(Isa::Avx2);
  for (WType wt : {WType::Q4_0, WType::Q6_K})
    for (int64_t M : {cpu::kQGemmMinM - 1, cpu::kQGemmMinM, int64_t(100)}) {
      const int64_t N = 20, K = 512;
      const std::vector<uint8_t> w = random_blocks(wt, N, K, 7);
      const std::vector<float> x = randv(size_t(M * K), 8);
      std::vector<float> ref(size_t(M * N)), got(size_t(M * N));
      cpu::matmul_q_int_ref(x.data(), w.data(), wt, nullptr, ref.data(), M, N, K);
      matmul(x.data(), w.data(), wt, nullptr, got.data(), M, N, K);
      const std::vector<double> mag = magnitudes(x, w, wt, M, N, K);
      for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(got[i], ref[i], 2e-5 * mag[i] + 1e-6) << wtype_name(wt) << " M=" << M << " " << i;
    }
}

}  // namespace

// A token's output should not depend on the other tokens of the call (batch invariance): the
// engine splits prompts into steps (prefill_chunk), serves prefixes from the cache and batches
// requests together, and an exact prefix hit should give the cold prefill's logits. Every
// quantized path, for every type, against the rows of one 200-token call: sub-batches of 1..100
// tokens at several offsets (across kQGemmMinM and the token tiles). The int8 paths (avx2,
// avxvnni, avx512vnni, amxint8) quantize activations per token and block at every M, so their
// rows agree up to f32 summation order (1e-5 of sum |x w|). The paths that round to bf16
// (avx512bf16, amxbf16) from kQGemmMinM tokens, or dequantize to f32 panels from kDequantMinM
// (off), give another rounding to the same token in a smaller call: bounded here
// (measured 2026-12-04: 1.2e-3 to 2.0e-3 of sum |x w|), and why an exact prefix-cache hit can
// move a near-tie token on those paths (docs/chunk-reuse.md, "Batch invariance").
TEST(QuantGemm, TokenRowsDoNotDependOnTheBatch) {
  IsaGuard g;
  if (active_isa() < Isa::Avx2) GTEST_SKIP() << "no AVX2";
  const int64_t M = 200, N0 = 48, K0 = 512;
  const std::pair<int64_t, int64_t> subs[] = {{0, 1}, {3, 2}, {5, 7}, {16, 15}, {16, 16}, {37, 97}, {100, 100}, {150, 50}};
  for (const char* path : {"", "avx2", "avxvnni", "avx512vnni", "avx512bf16", "amxint8", "amxbf16", "off"}) {
    if (*path) ::setenv("KVBOOST_QUANT_GEMM", path, 1);
    const QuantGemm q = quant_gemm_path();
    if (*path && std::string(quant_gemm_name(q)) != path && !(std::string(path) == "off" && q == QuantGemm::Scalar)) {
      ::unsetenv("KVBOOST_QUANT_GEMM");
      continue;  // this CPU lacks it
    }
    // Every type at one shape, then Gemma 3 270M's (hidden 640 = 20 blocks of 32: q/k/v/gate/up
    // are 640 wide, o 1,024, down 2,048).
    struct Shape {
      WType wt;
      int64_t N, K;
    };
    std::vector<Shape> shapes;
    for (WType wt : kTypes) shapes.push_back({wt, N0, K0});
    for (Shape sh : {Shape{WType::Q5_0, 1024, 640}, Shape{WType::Q5_0, 256, 640}, Shape{WType::Q8_0, 256, 640}, Shape{WType::Q4_K, 640, 1024},
                     Shape{WType::Q6_K, 640, 2048}, Shape{WType::Q5_0, 2048, 640}})
      shapes.push_back(sh);
    for (const Shape& sh : shapes) {
      const WType wt = sh.wt;
      const int64_t N = sh.N, K = sh.K;
      const std::vector<uint8_t> w = random_blocks(wt, N, K, 11);
      const std::vector<float> x = randv(size_t(M * K), 12);
      const std::vector<double> mag = magnitudes(x, w, wt, M, N, K);
      std::vector<float> full(size_t(M * N));
      matmul(x.data(), w.data(), wt, nullptr, full.data(), M, N, K);
      double worst = 0;
      int64_t worst_m = -1, worst_len = 0;
      for (auto [m0, len] : subs) {
        std::vector<float> y(size_t(len * N));
        matmul(x.data() + m0 * K, w.data(), wt, nullptr, y.data(), len, N, K);
        for (int64_t i = 0; i < len; ++i)
          for (int64_t n = 0; n < N; ++n) {
            const double e = std::fabs(double(y[size_t(i * N + n)]) - full[size_t((m0 + i) * N + n)]) /
                             std::max(mag[size_t((m0 + i) * N + n)], 1e-30);
            if (e > worst) worst = e, worst_m = m0 + i, worst_len = len;
          }
      }
      const bool int8_path = q == QuantGemm::Avx2 || q == QuantGemm::AvxVnni ||
                             q == QuantGemm::Avx512Vnni || q == QuantGemm::AmxInt8;
      EXPECT_LT(worst, int8_path ? 1e-5 : 5e-3) << "path " << quant_gemm_name(q) << ", " << wtype_name(wt) << " " << N << "x" << K << ": token " << worst_m
                             << " in a call of " << worst_len << " tokens differs from the same token in a call of "
                             << M << " by " << worst << " of sum |x w|";
    }
    ::unsetenv("KVBOOST_QUANT_GEMM");
  }
}
