// Logit error of the bf16-activation GEMM paths (AMX-BF16 from 16 tokens, AVX512-BF16 below;
// kernels.h PackLayout::Bf16Pairs) against the f32 scalar reference, on a small generated bf16
// model (issue 4: "measure the logit error against the f32 reference and state it"). This CPU
// has neither path, so the model's matmuls over bf16 weights are routed to the emulated builds
// of the same kernel source (tests/kernels/matmul_packed_isa_emu.cpp: SIMDe + amx_emu.h) by the
// linker (-Wl,--wrap on kernels::matmul and kernels::matmul_packed, this program only); every
// other op runs the AVX2 path. On a host with the real paths, `kvboost bench logits` measures
// the same thing natively (scripts/native_isa_check.sh).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <vector>

#include "../kernels/kernel_test_util.h"
#include "../kernels/matmul_packed_isa_emu.h"
#include "kvboost/common.h"
#include "kvboost/kernels.h"
#include "kvboost/model.h"
#include "kvboost/runtime.h"
#include "testing/fixture.h"
#include "test_util.h"

using namespace kvboost;
using kernels::PackedWeight;
using kernels::PackLayout;
using kernels::WType;

// ---- the linker's wrap of the two matmul entry points ----
void real_matmul(const float* x, const void* w, WType wt, const float* bias, float* y, int64_t M,
                 int64_t N, int64_t K) __asm__("__real__ZN7kvboost7kernels6matmulEPKfPKvNS0_5WTypeES2_Pflll");
void real_matmul_packed(const float* x, const PackedWeight& w, const float* bias, float* y,
                        int64_t M) __asm__("__real__ZN7kvboost7kernels13matmul_packedEPKfRKNS0_12PackedWeightES2_Pfl");

namespace {
enum class Route { Off, Bf16Emu, Avx512Bf16EmuOnly };
Route g_route = Route::Off;
std::atomic<int64_t> g_routed{0};
std::mutex g_mu;
std::map<const void*, std::unique_ptr<PackedWeight>> g_pairs;  // source -> Bf16Pairs copy

// A Panel16 BF16 weight back to [N, K] (kernels.h: word i of a 16-feature k row holds features
// i and 8 + i).
std::vector<uint16_t> unpack_panel16(const PackedWeight& w) {
  const int64_t N = w.n(), K = w.k();
  std::vector<uint16_t> out(size_t(N * K));
  const uint16_t* p = static_cast<const uint16_t*>(w.data());
  for (int64_t n = 0; n < N; ++n) {
    const int i = int(n % 16), pos = i < 8 ? 2 * i : 2 * (i - 8) + 1;
    for (int64_t k = 0; k < K; ++k) out[size_t(n * K + k)] = p[((n / 16) * K + k) * 16 + pos];
  }
  return out;
}

const PackedWeight& pairs_of(const void* key, const uint16_t* raw, int64_t N, int64_t K) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto& slot = g_pairs[key];
  if (!slot) slot = std::make_unique<PackedWeight>(kernels::pack_weight(raw, WType::BF16, N, K, PackLayout::Bf16Pairs));
  return *slot;
}

void run_emulated(const float* x, const PackedWeight& pw, const float* bias, float* y, int64_t M) {
  ++g_routed;
  if (g_route == Route::Bf16Emu && M >= 16) kernel_test::matmul_packed_amx_emu(x, pw, bias, y, M);
  else kernel_test::matmul_packed_avx512bf16_emu(x, pw, bias, y, M);
}
}  // namespace

void wrap_matmul(const float* x, const void* w, WType wt, const float* bias, float* y, int64_t M,
                 int64_t N, int64_t K) __asm__("__wrap__ZN7kvboost7kernels6matmulEPKfPKvNS0_5WTypeES2_Pflll");
void wrap_matmul(const float* x, const void* w, WType wt, const float* bias, float* y, int64_t M,
                 int64_t N, int64_t K) {
  if (g_route == Route::Off || wt != WType::BF16) return real_matmul(x, w, wt, bias, y, M, N, K);
  run_emulated(x, pairs_of(w, static_cast<const uint16_t*>(w), N, K), bias, y, M);
}

void wrap_matmul_packed(const float* x, const PackedWeight& w, const float* bias, float* y,
                        int64_t M) __asm__("__wrap__ZN7kvboost7kernels13matmul_packedEPKfRKNS0_12PackedWeightES2_Pfl");
void wrap_matmul_packed(const float* x, const PackedWeight& w, const float* bias, float* y,
                        int64_t M) {
  if (g_route == Route::Off || w.wt() != WType::BF16) return real_matmul_packed(x, w, bias, y, M);
  if (w.layout() == PackLayout::Bf16Pairs) return run_emulated(x, w, bias, y, M);
  const PackedWeight* pw;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_pairs.find(w.data());
    pw = it != g_pairs.end() ? it->second.get() : nullptr;
  }
  if (!pw) {
    const std::vector<uint16_t> raw = unpack_panel16(w);
    pw = &pairs_of(w.data(), raw.data(), w.n(), w.k());
  }
  run_emulated(x, *pw, bias, y, M);
}

namespace {

// Logits of the prompt (every position: the prefill GEMMs) and of `greedy` forced decode steps
// (M = 1: the GEMV side), as bench logits computes them.
std::vector<float> logits_of(const Model& m, const std::vector<int32_t>& ids,
                             const std::vector<int32_t>& forced) {
  const int64_t n = int64_t(ids.size()), V = m.config().vocab_size;
  KvCache kv(m.config(), n + int64_t(forced.size()) + 1);
  std::vector<float> all(size_t((n + int64_t(forced.size())) * V));
  m.forward(ids.data(), n, kv, all.data(), /*all_logits=*/true);
  for (size_t i = 0; i < forced.size(); ++i) m.forward(&forced[i], 1, kv, all.data() + (n + int64_t(i)) * V);
  return all;
}

struct Err {
  double max_abs = 0, max_rel = 0, mean_kl = 0;
  int64_t agree = 0, rows = 0;
};

Err compare(const std::vector<float>& ref, const std::vector<float>& got, int64_t V) {
  Err e;
  e.rows = int64_t(ref.size()) / V;
  for (int64_t r = 0; r < e.rows; ++r) {
    const float* p = ref.data() + r * V;
    const float* q = got.data() + r * V;
    double mean = 0, var = 0, row_max = 0;
    for (int64_t i = 0; i < V; ++i) mean += p[i];
    mean /= double(V);
    for (int64_t i = 0; i < V; ++i) var += (p[i] - mean) * (p[i] - mean);
    const double sd = std::sqrt(var / double(V));
    for (int64_t i = 0; i < V; ++i) row_max = std::max(row_max, double(std::fabs(p[i] - q[i])));
    e.max_abs = std::max(e.max_abs, row_max);
    if (sd > 0) e.max_rel = std::max(e.max_rel, row_max / sd);
    const LogitAgreement g = compare_logits(p, q, V);  // KL(softmax(p) || softmax(q)), top-1
    e.mean_kl += g.kl / double(e.rows);
    e.agree += g.top1;
  }
  return e;
}

}  // namespace

TEST(Bf16ActivationLogits, EmulatedAmxAndAvx512Bf16AgainstTheScalarReference) {
  const CpuFeatures& f = cpu_features();
  if (!(f.avx2 && f.fma && f.f16c)) GTEST_SKIP() << "the emulated kernels need AVX2+FMA+F16C";
  kernel_test::IsaGuard guard;
  const std::string dir = test::make_temp_dir("bf16_act_logits");
  FixtureSpec spec;
  spec.dtype = "bf16";
  spec.hidden = 256, spec.intermediate = 688, spec.layers = 4, spec.heads = 8, spec.kv_heads = 4;
  spec.vocab = 512;
  spec.tokenizer_kind = "";
  spec.init_std = 0.05f;  // logits with some spread (0.02 leaves them nearly uniform)
  write_fixture_model(dir, spec);

  std::mt19937 rng(3);
  std::vector<int32_t> ids(64);
  for (auto& t : ids) t = int32_t(rng() % 512);

  set_active_isa(Isa::Scalar);
  auto ref_model = Model::load(dir);
  const int64_t V = ref_model->config().vocab_size;
  std::vector<int32_t> forced;
  {
    KvCache kv(ref_model->config(), 80);
    std::vector<float> last(static_cast<size_t>(V));
    ref_model->forward(ids.data(), int64_t(ids.size()), kv, last.data());
    for (int i = 0; i < 4; ++i) {
      forced.push_back(int32_t(kernels::argmax(last.data(), V)));
      ref_model->forward(&forced.back(), 1, kv, last.data());
    }
  }
  const std::vector<float> ref = logits_of(*ref_model, ids, forced);

  set_active_isa(Isa::Avx2);
  auto model = Model::load(dir);
  const std::vector<float> f32 = logits_of(*model, ids, forced);
  g_route = Route::Bf16Emu;
  const std::vector<float> amx = logits_of(*model, ids, forced);
  const int64_t routed_amx = g_routed.exchange(0);
  g_route = Route::Avx512Bf16EmuOnly;
  const std::vector<float> bf16 = logits_of(*model, ids, forced);
  const int64_t routed_bf16 = g_routed.exchange(0);
  g_route = Route::Off;
  EXPECT_GT(routed_amx, 0) << "no matmul went to the emulated kernels: the wrap is not in place";
  EXPECT_GT(routed_bf16, 0);

  std::printf("| path (64 prompt tokens + 4 decode steps, %lld logit rows) | max abs error | max error / logit std | mean KL(ref||path) | top-1 agreement |\n|---|---|---|---|---|\n",
              (long long)(ref.size() / size_t(V)));
  const struct {
    const char* name;
    const std::vector<float>* got;
  } rows[] = {{"avx2 (f32 activations)", &f32},
              {"amx, emulated (bf16 activations; M < 16: avx512bf16)", &amx},
              {"avx512bf16, emulated (bf16 activations)", &bf16}};
  for (const auto& r : rows) {
    const Err e = compare(ref, *r.got, V);
    std::printf("| %s | %.3g | %.3g | %.3g | %lld/%lld |\n", r.name, e.max_abs, e.max_rel, e.mean_kl,
                (long long)e.agree, (long long)e.rows);
    // Loose bounds: bf16 activations (8 significant bits) should cost well under a tenth of a
    // logit standard deviation here and keep almost every argmax.
    EXPECT_LT(e.max_rel, 0.1) << r.name;
    EXPECT_GE(e.agree, e.rows - 3) << r.name;
  }
  std::fflush(stdout);
}
