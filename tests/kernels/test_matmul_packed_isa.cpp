// The packed-weight GEMM paths above AVX2 (issue 4): ISA levels and KVBOOST_ISA names, the
// Bf16Pairs layout and its reference, dispatch on the layout (a mismatch is an Error), and the
// three kernels — (a) AVX-512 f32 FMA, (b) AVX512-BF16, (c) AMX-BF16 — against the scalar
// reference on shapes with tails (M, N, K not multiples of the tiles):
//   - emulated (SIMDe + amx_emu.h, matmul_packed_isa_emu.cpp) on any AVX2 CPU;
//   - natively through matmul_packed, on CPUs that have each level (skipped elsewhere).
// Plus deliberately broken AMX tile configurations, to show that these checks bite.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernel_test_util.h"
#include "kvboost/common.h"
#include "kvboost/kernels.h"
#ifdef KVB_TEST_SIMDE
#include "amx_emu.h"
#include "matmul_packed_isa_emu.h"
#endif

using namespace kvboost;
using namespace kvboost::kernels;
using namespace kvboost::kernel_test;

namespace {

struct Shape {
  int64_t M, N, K;
};
// Tails everywhere: M around the 12/8/4/2/1 token tiles and AMX's 16/32, N around the 16/32-
// feature panels, K around the 32-k AMX step and odd (a lone k of a pair). The last two split
// into several work items on the thread pool.
const Shape kShapes[] = {{1, 16, 32},   {1, 5, 1},     {2, 17, 3},    {5, 33, 31},  {12, 32, 64},
                         {13, 48, 33},  {16, 16, 96},  {17, 40, 7},   {31, 1, 100}, {33, 100, 65},
                         {47, 70, 130}, {70, 130, 97}, {96, 64, 256}};

std::vector<uint8_t> random_weight(WType wt, int64_t N, int64_t K, uint64_t seed) {
  const std::vector<float> f = randv(size_t(N * K), seed, 0.5f);
  std::vector<uint8_t> out(size_t(N * K) * size_t(wtype_size(wt)));
  for (size_t i = 0; i < f.size(); ++i) {
    if (wt == WType::F32) std::memcpy(out.data() + 4 * i, &f[i], 4);
    else {
      const uint16_t h = wt == WType::F16 ? f32_to_f16(f[i]) : f32_to_bf16(f[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

// sum_k |x[m,k] * w[n,k]| per output, from the reference on |x| and |w|: the scale of the
// rounding errors (f32 sums; bf16 activations).
std::vector<float> abs_scale(const std::vector<float>& x, const std::vector<uint8_t>& w, WType wt,
                             int64_t M, int64_t N, int64_t K) {
  std::vector<float> ax(x.size());
  for (size_t i = 0; i < x.size(); ++i) ax[i] = std::fabs(x[i]);
  std::vector<uint8_t> aw = w;
  const int es = wtype_size(wt);
  for (size_t i = 0; i < size_t(N * K); ++i) aw[i * es + es - 1] &= 0x7f;  // clear the sign bit
  std::vector<float> s(size_t(M * N));
  matmul_ref(ax.data(), aw.data(), wt, nullptr, s.data(), M, N, K);
  return s;
}

std::vector<float> round_bf16(const std::vector<float>& x) {
  std::vector<float> r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = bf16_to_f32(f32_to_bf16(x[i]));
  return r;
}

// max over outputs of |got - want| / (scale * rel + 1e-30); <= 1 passes.
double worst(const std::vector<float>& got, const std::vector<float>& want,
             const std::vector<float>& scale, double rel) {
  double w = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(double(got[i]) - double(want[i]));
    if (!std::isfinite(got[i])) return INFINITY;
    w = std::max(w, e / (double(scale[i]) * rel + 1e-30));
  }
  return w;
}

using Kernel = void (*)(const float*, const PackedWeight&, const float*, float*, int64_t);

// f32 sums over K terms: |error| <= ~K * 2^-24 * sum|x w|; allow 2x.
double f32_rel(int64_t K) { return 2.0 * double(K + 2) * std::ldexp(1.0, -24); }

// (a): against matmul_packed_ref on the same Panel16 weight, f32 activations.
void check_panel16(Kernel kernel, const char* what) {
  uint64_t seed = 100;
  for (WType wt : {WType::F32, WType::F16, WType::BF16})
    for (const Shape& s : kShapes)
      for (bool with_bias : {false, true}) {
        SCOPED_TRACE(testing::Message() << what << " " << wtype_name(wt) << " M=" << s.M
                                        << " N=" << s.N << " K=" << s.K << " bias=" << with_bias);
        const auto w = random_weight(wt, s.N, s.K, ++seed);
        const auto x = randv(size_t(s.M * s.K), ++seed);
        const auto b = randv(size_t(s.N), ++seed);
        const PackedWeight pw = pack_weight(w.data(), wt, s.N, s.K, PackLayout::Panel16);
        std::vector<float> want(size_t(s.M * s.N)), got(want.size(), NAN);
        matmul_packed_ref(x.data(), pw, with_bias ? b.data() : nullptr, want.data(), s.M);
        kernel(x.data(), pw, with_bias ? b.data() : nullptr, got.data(), s.M);
        std::vector<float> scale = abs_scale(x, w, wt, s.M, s.N, s.K);
        if (with_bias)
          for (int64_t i = 0; i < s.M * s.N; ++i) scale[size_t(i)] += std::fabs(b[size_t(i % s.N)]);
        EXPECT_LE(worst(got, want, scale, f32_rel(s.K)), 1.0);
      }
}

// (b), (c): bf16 activations. Against the reference on x rounded to bf16 (only the f32
// summation order differs: any indexing or layout slip shows), and against the f32 reference
// within the bf16 rounding bound 2^-8 * sum|x w| (kernels.h, PackLayout).
void check_pairs(Kernel kernel, const char* what) {
  uint64_t seed = 500;
  for (const Shape& s : kShapes)
    for (bool with_bias : {false, true}) {
      SCOPED_TRACE(testing::Message() << what << " M=" << s.M << " N=" << s.N << " K=" << s.K
                                      << " bias=" << with_bias);
      const auto w = random_weight(WType::BF16, s.N, s.K, ++seed);
      const auto x = randv(size_t(s.M * s.K), ++seed);
      const auto b = randv(size_t(s.N), ++seed);
      const float* bias = with_bias ? b.data() : nullptr;
      const PackedWeight pw = pack_weight(w.data(), WType::BF16, s.N, s.K, PackLayout::Bf16Pairs);
      ASSERT_EQ(pw.layout(), PackLayout::Bf16Pairs);
      const auto xr = round_bf16(x);
      std::vector<float> want_r(size_t(s.M * s.N)), want(want_r.size()), got(want_r.size(), NAN);
      matmul_packed_ref(xr.data(), pw, bias, want_r.data(), s.M);
      matmul_packed_ref(x.data(), pw, bias, want.data(), s.M);
      kernel(x.data(), pw, bias, got.data(), s.M);
      std::vector<float> scale = abs_scale(x, w, WType::BF16, s.M, s.N, s.K);
      if (with_bias)
        for (int64_t i = 0; i < s.M * s.N; ++i) scale[size_t(i)] += std::fabs(b[size_t(i % s.N)]);
      EXPECT_LE(worst(got, want_r, scale, f32_rel(s.K)), 1.0) << "vs the bf16-rounded reference";
      EXPECT_LE(worst(got, want, scale, std::ldexp(1.0, -8) * 1.01 + f32_rel(s.K)), 1.0)
          << "vs the f32 reference";
    }
}

class Emulated : public ::testing::Test {
 protected:
  void SetUp() override {
    const CpuFeatures& f = cpu_features();
    if (!(f.avx2 && f.fma && f.f16c)) GTEST_SKIP() << "the SIMDe build runs on AVX2+FMA+F16C";
  }
  IsaGuard guard;
};

}  // namespace

// ---- ISA levels, names, layouts, dispatch ----

TEST(IsaLevels, NamesRoundTripAndAliases) {
  for (Isa i : {Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Avx512Bf16, Isa::AmxBf16}) {
    Isa back = Isa::Scalar;
    ASSERT_TRUE(parse_isa(isa_name(i), back)) << isa_name(i);
    EXPECT_EQ(back, i);
  }
  Isa v = Isa::Scalar;
  EXPECT_TRUE(parse_isa("amx-bf16", v));
  EXPECT_EQ(v, Isa::AmxBf16);
  EXPECT_TRUE(parse_isa("avx512-bf16", v));
  EXPECT_EQ(v, Isa::Avx512Bf16);
  EXPECT_FALSE(parse_isa("avx1024", v));
  EXPECT_FALSE(parse_isa("", v));
}

TEST(IsaLevels, ForcedLevelIsClampedToTheHardware) {
  IsaGuard guard;
  const CpuFeatures& f = cpu_features();
  set_active_isa(Isa::AmxBf16);
  const Isa hw = active_isa();
  // Each level needs the features of the ones below it.
  if (hw >= Isa::Avx2) { EXPECT_TRUE(f.avx2 && f.fma && f.f16c); }
  if (hw >= Isa::Avx512) { EXPECT_TRUE(f.avx512f && f.avx512bw && f.avx512vl); }
  if (hw >= Isa::Avx512Bf16) { EXPECT_TRUE(f.avx512bf16); }
  if (hw >= Isa::AmxBf16) { EXPECT_TRUE(f.amx_tile && f.amx_bf16 && amx_request_permission()); }
  if (!f.avx512f) { EXPECT_LE(hw, Isa::Avx2); }
  if (!f.amx_tile) { EXPECT_LE(hw, Isa::Avx512Bf16); }
  for (Isa want : {Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Avx512Bf16, Isa::AmxBf16}) {
    set_active_isa(want);
    EXPECT_EQ(active_isa(), std::min(want, hw));
  }
}

TEST(PackedLayouts, LayoutFollowsTheIsaAtPackTime) {
  EXPECT_EQ(pack_layout_for(Isa::Avx2, WType::BF16), PackLayout::Panel16);
  EXPECT_EQ(pack_layout_for(Isa::Avx512, WType::BF16), PackLayout::Panel16);
  EXPECT_EQ(pack_layout_for(Isa::Avx512Bf16, WType::BF16), PackLayout::Bf16Pairs);
  EXPECT_EQ(pack_layout_for(Isa::AmxBf16, WType::BF16), PackLayout::Bf16Pairs);
  EXPECT_EQ(pack_layout_for(Isa::AmxBf16, WType::F16), PackLayout::Panel16);
  EXPECT_EQ(pack_layout_for(Isa::AmxBf16, WType::F32), PackLayout::Panel16);
  IsaGuard guard;
  const auto w = random_weight(WType::BF16, 20, 9, 1);
  set_active_isa(Isa::Avx2);
  EXPECT_EQ(pack_weight(w.data(), WType::BF16, 20, 9).layout(), pack_layout_for(active_isa(), WType::BF16));
  const auto wf = random_weight(WType::F32, 4, 4, 2);
  EXPECT_THROW(pack_weight(wf.data(), WType::F32, 4, 4, PackLayout::Bf16Pairs), Error);
}

// The Bf16Pairs reference is matmul_ref on the raw weight (no f32 rounding of its own: both
// accumulate in double), and the padding is zeros.
TEST(PackedLayouts, PairsReferenceMatchesTheRawReference) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(testing::Message() << "M=" << s.M << " N=" << s.N << " K=" << s.K);
    const auto w = random_weight(WType::BF16, s.N, s.K, 7 + s.K);
    const auto x = randv(size_t(s.M * s.K), 9 + s.N);
    const PackedWeight pw = pack_weight(w.data(), WType::BF16, s.N, s.K, PackLayout::Bf16Pairs);
    const int64_t Kp = (s.K + 31) / 32 * 32, Np = (s.N + 31) / 32 * 32;
    EXPECT_EQ(pw.bytes(), size_t(Np * Kp * 2));
    std::vector<float> a(size_t(s.M * s.N)), b(a.size());
    matmul_ref(x.data(), w.data(), WType::BF16, nullptr, a.data(), s.M, s.N, s.K);
    matmul_packed_ref(x.data(), pw, nullptr, b.data(), s.M);
    EXPECT_EQ(a, b);
    // Every element outside [N] x [K] is zero; every element inside is found where it belongs.
    const uint16_t* p = static_cast<const uint16_t*>(pw.data());
    const uint16_t* src = reinterpret_cast<const uint16_t*>(w.data());
    for (int64_t n = 0; n < Np; ++n)
      for (int64_t k = 0; k < Kp; ++k) {
        const uint16_t got = p[(n / 16) * (Kp * 16) + (k / 2) * 32 + (n % 16) * 2 + (k & 1)];
        ASSERT_EQ(got, n < s.N && k < s.K ? src[n * s.K + k] : uint16_t(0)) << n << "," << k;
      }
  }
}

TEST(PackedLayouts, MismatchedLayoutIsAnError) {
  IsaGuard guard;
  const auto w = random_weight(WType::BF16, 40, 70, 3);
  const auto x = randv(size_t(20 * 70), 4);
  std::vector<float> y(size_t(20 * 40));
  const PackedWeight pairs = pack_weight(w.data(), WType::BF16, 40, 70, PackLayout::Bf16Pairs);
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
    set_active_isa(isa);
    if (active_isa() != isa) continue;
    EXPECT_THROW(matmul_packed(x.data(), pairs, nullptr, y.data(), 20), Error) << isa_name(isa);
    EXPECT_THROW(matmul_packed(x.data(), pairs, nullptr, y.data(), 1), Error) << isa_name(isa);
  }
}

#ifdef KVB_TEST_SIMDE  // tests/kernels/CMakeLists.txt: built where SIMDe (libsimde-dev) is found
// ---- the kernels, emulated ----

TEST_F(Emulated, Avx512Fma) { check_panel16(matmul_packed_avx512_emu, "avx512 (SIMDe)"); }
TEST_F(Emulated, Avx512Bf16) { check_pairs(matmul_packed_avx512bf16_emu, "avx512bf16 (SIMDe)"); }
TEST_F(Emulated, AmxBf16) { check_pairs(matmul_packed_amx_emu, "amx (emulated)"); }

TEST_F(Emulated, SingleThreadedEqualsPooled) {
  const Shape s{70, 130, 97};
  const auto w = random_weight(WType::BF16, s.N, s.K, 11);
  const auto x = randv(size_t(s.M * s.K), 12);
  const PackedWeight pairs = pack_weight(w.data(), WType::BF16, s.N, s.K, PackLayout::Bf16Pairs);
  const PackedWeight p16 = pack_weight(w.data(), WType::BF16, s.N, s.K, PackLayout::Panel16);
  for (Kernel k : {matmul_packed_avx512bf16_emu, matmul_packed_amx_emu}) {
    std::vector<float> a(size_t(s.M * s.N)), b(a.size());
    set_num_threads(1);
    k(x.data(), pairs, nullptr, a.data(), s.M);
    set_num_threads(guard.threads > 1 ? guard.threads : 2);
    k(x.data(), pairs, nullptr, b.data(), s.M);
    EXPECT_EQ(a, b);
  }
  std::vector<float> a(size_t(s.M * s.N)), b(a.size());
  set_num_threads(1);
  matmul_packed_avx512_emu(x.data(), p16, nullptr, a.data(), s.M);
  set_num_threads(guard.threads > 1 ? guard.threads : 2);
  matmul_packed_avx512_emu(x.data(), p16, nullptr, b.data(), s.M);
  EXPECT_EQ(a, b);
}

// (a) sums each output over k in order with one FMA chain, as the AVX2 tiles do, from the same
// f32 weights: from 2 tokens on the two paths agree bit for bit, so dispatch's switch between
// them at 17 tokens keeps FastKernels.PackedMatmulRowsDoNotDependOnBatch true on AVX-512 CPUs.
TEST_F(Emulated, Avx512FmaEqualsAvx2BitForBit) {
  set_active_isa(Isa::Avx2);
  if (active_isa() != Isa::Avx2) GTEST_SKIP() << "needs the AVX2 path";
  const int64_t N = 70, K = 45;
  for (WType wt : {WType::F32, WType::F16, WType::BF16})
    for (int64_t M : {2, 3, 7, 16, 17, 25, 40}) {
      const auto w = random_weight(wt, N, K, 40 + M);
      const auto x = randv(size_t(M * K), 41 + M);
      const auto b = randv(size_t(N), 42);
      const PackedWeight pw = pack_weight(w.data(), wt, N, K, PackLayout::Panel16);
      std::vector<float> a(size_t(M * N)), c(a.size());
      matmul_packed_avx512_emu(x.data(), pw, b.data(), a.data(), M);
      matmul_packed(x.data(), pw, b.data(), c.data(), M);  // the AVX2 kernels here
      ASSERT_EQ(a, c) << wtype_name(wt) << " M=" << M;
    }
}

// Each kernel reads only its own layout.
TEST_F(Emulated, KernelsRejectTheOtherLayout) {
  const auto w = random_weight(WType::BF16, 32, 32, 5);
  const auto x = randv(32 * 32, 6);
  std::vector<float> y(32 * 32);
  const PackedWeight pairs = pack_weight(w.data(), WType::BF16, 32, 32, PackLayout::Bf16Pairs);
  const PackedWeight p16 = pack_weight(w.data(), WType::BF16, 32, 32, PackLayout::Panel16);
  EXPECT_THROW(matmul_packed_avx512_emu(x.data(), pairs, nullptr, y.data(), 32), Error);
  EXPECT_THROW(matmul_packed_avx512bf16_emu(x.data(), p16, nullptr, y.data(), 32), Error);
  EXPECT_THROW(matmul_packed_amx_emu(x.data(), p16, nullptr, y.data(), 32), Error);
}

// ---- the checks bite: broken tile configurations ----

namespace {
struct Problem {
  Shape s;
  std::vector<uint8_t> w;
  std::vector<float> x, want;
  PackedWeight pw;
  explicit Problem(uint64_t seed) : s{40, 48, 64} {
    w = random_weight(WType::BF16, s.N, s.K, seed);
    x = round_bf16(randv(size_t(s.M * s.K), seed + 1));
    pw = pack_weight(w.data(), WType::BF16, s.N, s.K, PackLayout::Bf16Pairs);
    want.resize(size_t(s.M * s.N));
    matmul_packed_ref(x.data(), pw, nullptr, want.data(), s.M);
  }
  double max_err(const std::vector<float>& got) const {
    double e = 0;
    for (size_t i = 0; i < got.size(); ++i) e = std::max(e, double(std::fabs(got[i] - want[i])));
    return std::isfinite(e) ? e : INFINITY;
  }
};
}  // namespace

TEST_F(Emulated, AmxCorrectConfigPasses) {
  const Problem p(900);
  std::vector<float> y(p.want.size());
  matmul_packed_amx_emu(p.x.data(), p.pw, nullptr, y.data(), p.s.M);
  EXPECT_LT(p.max_err(y), 1e-4);
}

// A and C tiles of 8 rows: the shapes agree, so nothing faults, but half of every 16-token tile
// is never computed; the comparison with the reference must catch it.
TEST_F(Emulated, AmxHalfRowConfigGivesWrongResults) {
  const Problem p(901);
  std::vector<float> y(p.want.size(), 0.0f);
  matmul_packed_amx_emu_broken(p.x.data(), p.pw, nullptr, y.data(), p.s.M, AmxBreak::ARowsC8);
  EXPECT_GT(p.max_err(y), 0.1);
}

// GCC 12's dropped configuration stores, as the emulator sees them: only the first 8 bytes
// reach LDTILECFG (palette 1, every tile 0 x 0), every tile instruction does nothing, and the
// output is whatever was on the stack.
TEST_F(Emulated, AmxDroppedConfigStoresGiveWrongResults) {
  const Problem p(902);
  std::vector<float> y(p.want.size(), 0.0f);
  amx_emu::keep_config_bytes = 8;
  set_num_threads(1);  // the emulator's setting is a plain global: no other thread reads it
  matmul_packed_amx_emu(p.x.data(), p.pw, nullptr, y.data(), p.s.M);
  amx_emu::keep_config_bytes = 64;
  EXPECT_GT(p.max_err(y), 0.1);
}

TEST_F(Emulated, AmxShapeMismatchFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const Problem p(903);
  std::vector<float> y(p.want.size());
  EXPECT_DEATH(matmul_packed_amx_emu_broken(p.x.data(), p.pw, nullptr, y.data(), p.s.M, AmxBreak::BRows8),
               "#UD TDPBF16PS: a.colsb / 4 != b.rows");
  EXPECT_DEATH(matmul_packed_amx_emu_broken(p.x.data(), p.pw, nullptr, y.data(), p.s.M, AmxBreak::Palette2),
               "#GP LDTILECFG: unsupported palette");
}

#endif  // KVB_TEST_SIMDE

// ---- the kernels, natively through matmul_packed (only where the CPU has each level) ----

namespace {
Kernel dispatched() {
  return [](const float* x, const PackedWeight& w, const float* b, float* y, int64_t M) {
    matmul_packed(x, w, b, y, M);
  };
}
bool has(Isa level) {
  IsaGuard g;
  set_active_isa(level);
  return active_isa() == level;
}
}  // namespace

TEST(Native, Avx512Fma) {
  if (!has(Isa::Avx512)) GTEST_SKIP() << "no AVX-512 here; the SIMDe build is tested instead";
  IsaGuard guard;
  set_active_isa(Isa::Avx512);
  check_panel16(dispatched(), "avx512 (native, via matmul_packed)");
}

TEST(Native, Avx512Bf16) {
  if (!has(Isa::Avx512Bf16)) GTEST_SKIP() << "no AVX512-BF16 here; the SIMDe build is tested instead";
  IsaGuard guard;
  set_active_isa(Isa::Avx512Bf16);
  check_pairs(dispatched(), "avx512bf16 (native, via matmul_packed)");
  const auto w = random_weight(WType::BF16, 20, 9, 1);
  EXPECT_EQ(pack_weight(w.data(), WType::BF16, 20, 9).layout(), PackLayout::Bf16Pairs);
}

TEST(Native, AmxBf16) {
  if (!has(Isa::AmxBf16)) GTEST_SKIP() << "no AMX-BF16 (or no OS permission) here; the emulated build is tested instead";
  IsaGuard guard;
  set_active_isa(Isa::AmxBf16);
  check_pairs(dispatched(), "amx (native, via matmul_packed)");
}
