// Each CUDA kernel (src/kernels/cuda) against its CPU reference (kvboost/kernels.h), on shapes of
// the tiny fixtures and of Qwen2.5-0.5B. Skips without a device.
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cuda_kernels.h"
#include "kvboost/common.h"
#include "kvboost/model.h"
#include "test_util.h"

using namespace kvboost;
using kernels::WType;

namespace {

bool have_device() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}
#define REQUIRE_DEVICE() \
  if (!have_device()) GTEST_SKIP() << "no CUDA device (GPU tests always skip on a machine without a CUDA device, as in CI: they run only where scripts/gpu_check.sh runs them)"

std::vector<float> randv(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

uint16_t to_bf16(float f) { return kvboost::f32_to_bf16(f); }
uint16_t to_f16(float f) { return kvboost::f32_to_f16(f); }

// Device copy of a host vector, freed at scope exit.
struct Dev {
  void* p = nullptr;
  size_t n = 0;
  template <typename T>
  explicit Dev(const std::vector<T>& v) : n(v.size() * sizeof(T)) {
    cuda::check(cudaMalloc(&p, std::max<size_t>(n, 4)), "cudaMalloc");
    cuda::check(cudaMemcpy(p, v.data(), n, cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  explicit Dev(size_t bytes) : n(bytes) { cuda::check(cudaMalloc(&p, std::max<size_t>(n, 4)), "cudaMalloc"); }
  ~Dev() { cudaFree(p); }
  float* f() const { return static_cast<float*>(p); }
  std::vector<float> get(size_t count) const {
    std::vector<float> out(count);
    cuda::check(cudaDeviceSynchronize(), "sync");
    cuda::check(cudaMemcpy(out.data(), p, count * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
    return out;
  }
};

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  double worst = 0, scale = 0;
  for (size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, double(std::fabs(got[i] - want[i]))), scale = std::max(scale, double(std::fabs(want[i])));
  EXPECT_LE(worst, tol * std::max(scale, 1.0)) << what << ": max abs error " << worst << " (max |ref| " << scale << ")";
}

}  // namespace

TEST(CudaKernels, RmsNorm) {
  REQUIRE_DEVICE();
  for (int64_t dim : {8, 64, 896, 1536}) {
    const int64_t rows = 7;
    auto x = randv(size_t(rows * dim), 1), w = randv(size_t(dim), 2);
    std::vector<float> want(x.size());
    kernels::rms_norm_ref(x.data(), w.data(), want.data(), rows, dim, 1e-6f);
    Dev dx(x), dw(w), dy(x.size() * 4);
    cuda::rms_norm(dx.f(), dw.f(), dy.f(), rows, dim, 1e-6f, nullptr);
    expect_close(dy.get(x.size()), want, 1e-5, "rms_norm");
    cuda::rms_norm(dx.f(), dw.f(), dx.f(), rows, dim, 1e-6f, nullptr);  // in place
    expect_close(dx.get(x.size()), want, 1e-5, "rms_norm in place");
  }
}

TEST(CudaKernels, RopeRotateHalf) {
  REQUIRE_DEVICE();
  const int64_t n = 5, heads = 3, hd = 64, half = hd / 2;
  auto x = randv(size_t(n * heads * hd), 3);
  std::vector<float> cs(size_t(n * half)), sn(cs.size());
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const double a = double(t + 17) * std::pow(10000.0, -2.0 * double(i) / double(hd));
      cs[size_t(t * half + i)] = float(std::cos(a)), sn[size_t(t * half + i)] = float(std::sin(a));
    }
  auto want = x;
  kernels::rope_rotate_half(want.data(), cs.data(), sn.data(), n, heads, hd);
  Dev dx(x), dc(cs), ds(sn);
  cuda::rope_rotate_half(dx.f(), dc.f(), ds.f(), n, heads, hd, nullptr);
  expect_close(dx.get(x.size()), want, 1e-6, "rope");
}

TEST(CudaKernels, SiluMulAddBias) {
  REQUIRE_DEVICE();
  const int64_t n = 4864 * 3;
  auto g = randv(size_t(n), 4), u = randv(size_t(n), 5);
  std::vector<float> want(static_cast<size_t>(n));
  kernels::silu_mul_ref(g.data(), u.data(), want.data(), n);
  Dev dg(g), du(u);
  cuda::silu_mul(dg.f(), du.f(), dg.f(), n, nullptr);
  expect_close(dg.get(size_t(n)), want, 1e-6, "silu_mul");
  auto b = randv(4864, 6);
  for (int64_t i = 0; i < n; ++i) want[size_t(i)] += b[size_t(i % 4864)];
  Dev db(b);
  cuda::add_bias(dg.f(), db.f(), 3, 4864, nullptr);
  expect_close(dg.get(size_t(n)), want, 1e-6, "add_bias");
  for (int64_t i = 0; i < n; ++i) want[size_t(i)] += u[size_t(i)];
  cuda::add_inplace(dg.f(), du.f(), n, nullptr);
  expect_close(dg.get(size_t(n)), want, 1e-6, "add_inplace");
}

TEST(CudaKernels, Embed) {
  REQUIRE_DEVICE();
  const int64_t V = 100, H = 72;
  auto t = randv(size_t(V * H), 7);
  std::vector<uint16_t> tb(t.size());
  for (size_t i = 0; i < t.size(); ++i) tb[i] = to_bf16(t[i]);
  std::vector<int32_t> ids = {3, 99, 0, 42};
  std::vector<float> want(ids.size() * size_t(H));
  for (size_t r = 0; r < ids.size(); ++r) kernels::to_f32(&tb[size_t(ids[r] * H)], WType::BF16, &want[r * size_t(H)], H);
  Dev dt(tb), di(ids), dx(want.size() * 4);
  cuda::embed(static_cast<int32_t*>(di.p), dt.p, WType::BF16, dx.f(), int64_t(ids.size()), H, nullptr);
  expect_close(dx.get(want.size()), want, 0, "embed");
}

// GEMV (decode): f32 activations, bf16/f16 weights, M = 1..8, vector and scalar (K % 8 != 0) paths.
TEST(CudaKernels, GemvMatchesMatmulRef) {
  REQUIRE_DEVICE();
  for (WType wt : {WType::BF16, WType::F16})
    for (int64_t K : {int64_t(896), int64_t(70), int64_t(4864)})
      for (int64_t M : {1, 3, 8}) {
        const int64_t N = 333;
        auto x = randv(size_t(M * K), 8), wf = randv(size_t(N * K), 9, 0.05f), b = randv(size_t(N), 10);
        std::vector<uint16_t> w(wf.size());
        for (size_t i = 0; i < wf.size(); ++i) w[i] = wt == WType::BF16 ? to_bf16(wf[i]) : to_f16(wf[i]);
        std::vector<float> want(size_t(M * N));
        kernels::matmul_ref(x.data(), w.data(), wt, b.data(), want.data(), M, N, K);
        Dev dx(x), dw(w), db(b), dy(want.size() * 4);
        cuda::gemv(dx.f(), dw.p, wt, db.f(), dy.f(), M, N, K, nullptr);
        expect_close(dy.get(want.size()), want, 1e-5, "gemv");
      }
}

// matmul through cuBLAS: SGEMM on f32 weights; GemmEx on bf16/f16 weights with activations
// rounded to the weight type (the reference gets the same rounded activations).
TEST(CudaKernels, MatmulMatchesMatmulRef) {
  REQUIRE_DEVICE();
  cublasHandle_t h;
  cuda::check(cublasCreate(&h), "cublasCreate");
  for (WType wt : {WType::F32, WType::BF16, WType::F16})
    for (int64_t M : {1, 9, 40}) {
      const int64_t N = 200, K = 896;
      auto x = randv(size_t(M * K), 11), wf = randv(size_t(N * K), 12, 0.05f), b = randv(size_t(N), 13);
      std::vector<uint16_t> w16(wf.size());
      for (size_t i = 0; i < wf.size(); ++i) w16[i] = wt == WType::BF16 ? to_bf16(wf[i]) : to_f16(wf[i]);
      const void* w_host = wt == WType::F32 ? static_cast<const void*>(wf.data()) : w16.data();
      auto xr = x;  // what cuBLAS sees for 16-bit weights at M > 8
      if (wt != WType::F32 && M > cuda::kGemvMaxM)
        for (auto& v : xr)
          v = wt == WType::BF16 ? kvboost::bf16_to_f32(to_bf16(v)) : kvboost::f16_to_f32(to_f16(v));
      std::vector<float> want(size_t(M * N));
      kernels::matmul_ref(xr.data(), w_host, wt, b.data(), want.data(), M, N, K);
      Dev dx(x), db(b), dy(want.size() * 4), dxh(size_t(M * K) * 2);
      Dev dw = wt == WType::F32 ? Dev(wf) : Dev(w16);
      cuda::matmul(h, dx.f(), dw.p, wt, db.f(), dy.f(), M, N, K, dxh.p, nullptr);
      expect_close(dy.get(want.size()), want, 1e-5, kernels::wtype_name(wt));
    }
  cublasDestroy(h);
}

TEST(CudaKernels, AttentionMatchesRef) {
  REQUIRE_DEVICE();
  struct Case {
    int64_t n_q, q_pos0, n_kv, heads, kv_heads, hd, window;
  };
  const Case cases[] = {{5, 11, 16, 8, 2, 64, 0},  {5, 11, 16, 8, 2, 64, 6}, {1, 99, 100, 14, 2, 64, 0},
                        {1, 99, 100, 8, 4, 8, 0},  {3, 0, 3, 4, 4, 256, 0}, {40, 0, 40, 12, 2, 128, 0},
                        {1, 511, 512, 14, 2, 64, 32}};
  for (const Case& c : cases) {
    auto q = randv(size_t(c.n_q * c.heads * c.hd), 14), k = randv(size_t(c.n_kv * c.kv_heads * c.hd), 15),
         v = randv(size_t(c.n_kv * c.kv_heads * c.hd), 16);
    const float scale = 1.0f / std::sqrt(float(c.hd));
    std::vector<float> want(q.size());
    kernels::attention_ref(q.data(), k.data(), v.data(), want.data(), c.n_q, c.q_pos0, c.n_kv, c.heads, c.kv_heads,
                           c.hd, c.window, scale);
    Dev dq(q), dk(k), dv(v), dout(q.size() * 4);
    cuda::attention(dq.f(), dk.f(), dv.f(), dout.f(), c.n_q, c.q_pos0, c.n_kv, c.heads, c.kv_heads, c.hd, c.window,
                    scale, nullptr);
    expect_close(dout.get(q.size()), want, 2e-5, "attention");
  }
}

// ---- paged attention (attention.cu) and 4-bit weights (quant.cu), issue 29 ----

namespace {

// Pools [n_blocks][bs][n_kv][hd] in kv_type (bytes) plus their f32 image (the values as stored:
// the CPU reference sees exactly what the device reads).
struct Pools {
  std::vector<uint8_t> k, v;
  std::vector<float> kf, vf;
  std::vector<int32_t> table;
};

Pools make_pools(WType kt, int64_t n_tokens, int64_t bs, int64_t nkv, int64_t hd, uint32_t seed) {
  const int64_t n_blocks = (n_tokens + bs - 1) / bs + 3;  // spare blocks: the table is a permutation
  const size_t n = size_t(n_blocks * bs * nkv * hd);
  Pools p;
  p.kf = randv(n, seed), p.vf = randv(n, seed + 1);
  const size_t es = kt == WType::F32 ? 4 : 2;
  p.k.resize(n * es), p.v.resize(n * es);
  for (size_t i = 0; i < n; ++i) {
    for (auto [src, dst] : {std::pair{&p.kf, &p.k}, std::pair{&p.vf, &p.v}}) {
      float& x = (*src)[i];
      if (kt == WType::F32) {
        std::memcpy(dst->data() + i * 4, &x, 4);
      } else {
        const uint16_t h = kt == WType::BF16 ? to_bf16(x) : to_f16(x);
        std::memcpy(dst->data() + i * 2, &h, 2);
        x = kt == WType::BF16 ? kvboost::bf16_to_f32(h) : kvboost::f16_to_f32(h);
      }
    }
  }
  for (int64_t b = 0; b < (n_tokens + bs - 1) / bs; ++b) p.table.push_back(int32_t((b * 7 + 2) % n_blocks));
  std::vector<bool> used(static_cast<size_t>(n_blocks), false);
  for (int32_t b : p.table) {
    EXPECT_FALSE(used[size_t(b)]);
    used[size_t(b)] = true;
  }
  return p;
}

struct AttnCase {
  WType kt;
  int64_t hd, nh, nkv, n_q, q_pos0, window, bs;
};

std::vector<float> attn_ref(const AttnCase& c, const Pools& p, const std::vector<float>& q, int64_t n_kv_tokens) {
  std::vector<float> out(static_cast<size_t>(c.n_q * c.nh * c.hd));
  kernels::paged_attention_ref(q.data(), p.kf.data(), p.vf.data(), p.table.data(), out.data(), c.n_q, c.q_pos0,
                               n_kv_tokens, c.bs, c.nh, c.nkv, c.hd, c.window, 1.0f / std::sqrt(float(c.hd)));
  return out;
}

std::vector<AttnCase> attn_cases(int64_t n_q, int64_t q_pos0) {
  std::vector<AttnCase> v;
  for (WType kt : {WType::F32, WType::F16, WType::BF16})
    for (int64_t hd : {64, 96, 128, 256})
      for (int64_t window : {int64_t(0), int64_t(37)}) v.push_back({kt, hd, 8, 2, n_q, q_pos0, window, 16});
  v.push_back({WType::BF16, 128, 4, 4, n_q, q_pos0, 0, 32});  // MHA, larger blocks
  return v;
}

}  // namespace

// Prefill over paged K/V (causal, GQA 8/2, sliding window, f32/f16/bf16 K/V, head dims 64..256)
// against the scalar reference; 70 queries after 25 cached tokens (several 16-query CTAs, a
// partial last one, and key tiles that start before the window).
TEST(CudaKernels, FlashAttentionPagedMatchesReference) {
  REQUIRE_DEVICE();
  for (const AttnCase& c : attn_cases(70, 25)) {
    const int64_t n_kv = c.q_pos0 + c.n_q;
    const Pools p = make_pools(c.kt, n_kv, c.bs, c.nkv, c.hd, 11);
    const auto q = randv(size_t(c.n_q * c.nh * c.hd), 12);
    const auto want = attn_ref(c, p, q, n_kv);
    Dev dq(q), dk(p.k), dv(p.v), dt(p.table), dout(want.size() * 4);
    cuda::flash_attention_paged(dq.f(), dk.p, dv.p, c.kt, static_cast<const int32_t*>(dt.p), dout.f(), c.n_q, c.q_pos0,
                                n_kv, c.bs, c.nh, c.nkv, c.hd, c.window, 1.0f / std::sqrt(float(c.hd)), nullptr);
    const std::string what = std::string("flash ") + kernels::wtype_name(c.kt) + " hd " + std::to_string(c.hd) +
                             " window " + std::to_string(c.window);
    expect_close(dout.get(want.size()), want, 2e-5, what.c_str());
  }
}

// Split-K decode: 1 and 3 queries at the end of a 1000-token context, 1, 4 and automatic splits.
TEST(CudaKernels, DecodeAttentionSplitKMatchesReference) {
  REQUIRE_DEVICE();
  for (int64_t n_q : {1, 3})
    for (const AttnCase& c : attn_cases(n_q, 1000 - n_q))
      for (int64_t splits : {1, 4, 0}) {
        const int64_t n_kv = 1000;
        const Pools p = make_pools(c.kt, n_kv, c.bs, c.nkv, c.hd, 21);
        const auto q = randv(size_t(c.n_q * c.nh * c.hd), 22);
        const auto want = attn_ref(c, p, q, n_kv);
        const int64_t sp = cuda::decode_splits(c.n_q, c.nh, n_kv, splits);
        Dev dq(q), dk(p.k), dv(p.v), dt(p.table), dout(want.size() * 4);
        Dev ws(size_t(cuda::decode_workspace_floats(c.n_q, c.nh, c.hd, sp)) * 4);
        cuda::decode_attention_paged(dq.f(), dk.p, dv.p, c.kt, static_cast<const int32_t*>(dt.p), dout.f(), c.n_q,
                                     c.q_pos0, n_kv, c.bs, c.nh, c.nkv, c.hd, c.window, 1.0f / std::sqrt(float(c.hd)),
                                     sp, ws.f(), nullptr);
        const std::string what = std::string("decode ") + kernels::wtype_name(c.kt) + " hd " + std::to_string(c.hd) +
                                 " splits " + std::to_string(sp);
        expect_close(dout.get(want.size()), want, 2e-5, what.c_str());
      }
}

TEST(CudaKernels, AttentionRejectsBadShapes) {
  REQUIRE_DEVICE();
  auto err = [](auto f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(err([] { cuda::flash_attention_paged(nullptr, nullptr, nullptr, WType::F32, nullptr, nullptr, 1, 0, 1, 16, 8, 2, 80, 0, 1, nullptr); })
                .find("head_dim 80"),
            std::string::npos);
  EXPECT_NE(err([] { cuda::decode_attention_paged(nullptr, nullptr, nullptr, WType::Q8_0, nullptr, nullptr, 1, 0, 1, 16, 8, 2, 64, 0, 1, 1, nullptr, nullptr); })
                .find("K/V type Q8_0"),
            std::string::npos);
}

namespace {
// Random Q4_Z / Q4_Z128 blocks (d, z, nibbles), row-major [N, K].
std::vector<uint8_t> random_q4(WType wt, int64_t N, int64_t K, uint32_t seed) {
  const int64_t be = wt == WType::Q4_Z ? 32 : 128, bb = wt == WType::Q4_Z ? 20 : 68;
  std::vector<uint8_t> w(static_cast<size_t>(N * (K / be) * bb));
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> dd(0.002f, 0.03f);
  for (size_t b = 0; b < w.size(); b += size_t(bb)) {
    const uint16_t d = to_f16(dd(g));
    std::memcpy(&w[b], &d, 2);
    w[b + 2] = uint8_t(g() % 16);
    w[b + 3] = 0;
    for (int64_t i = 4; i < bb; ++i) w[b + size_t(i)] = uint8_t(g() & 0xff);
  }
  return w;
}
}  // namespace

// Decode GEMV on packed 4-bit rows (M = 1..8) against matmul_ref on the same blocks, with bias,
// at a fixture shape and at Qwen2.5-0.5B's gate/down shapes.
TEST(CudaKernels, GemvQ4MatchesReference) {
  REQUIRE_DEVICE();
  struct S { int64_t N, K; };
  for (WType wt : {WType::Q4_Z, WType::Q4_Z128})
    for (S sh : {S{96, 256}, S{4864, 896}, S{896, 4864}})
      for (int64_t M : {1, 3, 8}) {
        if (sh.K % (wt == WType::Q4_Z ? 32 : 128)) continue;
        const auto w = random_q4(wt, sh.N, sh.K, 5);
        const auto x = randv(size_t(M * sh.K), 6), b = randv(size_t(sh.N), 7);
        std::vector<float> want(static_cast<size_t>(M * sh.N));
        kernels::matmul_ref(x.data(), w.data(), wt, b.data(), want.data(), M, sh.N, sh.K);
        Dev dx(x), dw(w), db(b), dy(want.size() * 4);
        cuda::gemv_q4(dx.f(), dw.p, wt, db.f(), dy.f(), M, sh.N, sh.K, nullptr);
        expect_close(dy.get(want.size()), want, 1e-4, kernels::wtype_name(wt));
      }
}

// Dequantization to bf16 (each element d * (q - z) rounded once) and the prefill path
// (dequant + cuBLAS bf16 GEMM, M = 64) against the reference.
TEST(CudaKernels, DequantQ4AndPrefillMatmulMatchReference) {
  REQUIRE_DEVICE();
  const int64_t N = 384, K = 512, M = 64;
  for (WType wt : {WType::Q4_Z, WType::Q4_Z128}) {
    const auto w = random_q4(wt, N, K, 9);
    std::vector<float> wf(static_cast<size_t>(N * K));
    const size_t row = size_t(kernels::wtype_row_bytes(wt, K));
    for (int64_t n = 0; n < N; ++n) kernels::to_f32(w.data() + size_t(n) * row, wt, &wf[size_t(n * K)], K);
    Dev dw(w), dout(size_t(N * K) * 2);
    cuda::dequant_q4(dw.p, wt, dout.p, WType::BF16, N, K, nullptr);
    std::vector<uint16_t> got(static_cast<size_t>(N * K));
    cuda::check(cudaMemcpy(got.data(), dout.p, got.size() * 2, cudaMemcpyDeviceToHost), "cudaMemcpy");
    for (size_t i = 0; i < got.size(); ++i)  // one bf16 rounding of the reference's value (8 bits of mantissa)
      ASSERT_LE(std::fabs(kvboost::bf16_to_f32(got[i]) - wf[i]), std::fabs(wf[i]) * (1.0f / 256) + 1e-12f)
          << kernels::wtype_name(wt) << " element " << i;
    const auto x = randv(size_t(M * K), 10);
    std::vector<float> want(static_cast<size_t>(M * N));
    kernels::matmul_ref(x.data(), w.data(), wt, nullptr, want.data(), M, N, K);
    cublasHandle_t h;
    cuda::check(cublasCreate(&h), "cublasCreate");
    Dev dx(x), dy(want.size() * 4), scratch(size_t(N * K) * 2), xh(size_t(M * K) * 2);
    cuda::matmul_q4(h, dx.f(), dw.p, wt, nullptr, dy.f(), M, N, K, scratch.p, xh.p, nullptr);
    expect_close(dy.get(want.size()), want, 2e-2, "matmul_q4 (bf16 activations)");
    cublasDestroy(h);
  }
}

// ---- the engine's paged K/V on the device (paged_kv.cu) ----

// The plain paged attention (head dims the tiled kernels do not take: stories260K's 8, 48, and
// 64 as a cross-check) against the scalar reference, f32 pools: a prefill of 40 queries after 9
// cached tokens and one decode query, windows 0 and 5.
TEST(CudaKernels, PagedAttentionSimpleMatchesReference) {
  REQUIRE_DEVICE();
  for (int64_t hd : {8, 48, 64})
    for (int64_t window : {int64_t(0), int64_t(5)})
      for (auto [n_q, q_pos0] : {std::pair<int64_t, int64_t>{40, 9}, std::pair<int64_t, int64_t>{1, 77}}) {
        const AttnCase c{WType::F32, hd, 8, 4, n_q, q_pos0, window, 4};
        const int64_t n_kv = q_pos0 + n_q;
        const Pools p = make_pools(WType::F32, n_kv, c.bs, c.nkv, hd, 31);
        const auto q = randv(size_t(n_q * c.nh * hd), 32);
        const auto want = attn_ref(c, p, q, n_kv);
        Dev dq(q), dk(p.kf), dv(p.vf), dt(p.table), dout(want.size() * 4);
        cuda::paged_attention_simple(dq.f(), dk.f(), dv.f(), static_cast<const int32_t*>(dt.p), dout.f(), n_q, q_pos0,
                                     n_kv, c.bs, c.nh, c.nkv, hd, window, 1.0f / std::sqrt(float(hd)), nullptr);
        const std::string what = "simple hd " + std::to_string(hd) + " window " + std::to_string(window) + " n_q " +
                                 std::to_string(n_q);
        expect_close(dout.get(want.size()), want, 2e-5, what.c_str());
      }
}

// The K/V write into scattered slots, the row gather, and key re-rotation against
// kernels::rope_shift (the cos / sin table computed as the runner does).
// CacheBlend's measure: each fresh row against the pool row its slot holds, as
// BlendSchedule::deviation computes it on the CPU (rows of 48 floats: lanes stride past 32).
TEST(CudaKernels, KvDeviationMatchesBlendSchedule) {
  REQUIRE_DEVICE();
  const int64_t row = 48, n = 11, pool_rows = 16;
  const auto k = randv(size_t(n * row), 51), v = randv(size_t(n * row), 52);
  const auto kp = randv(size_t(pool_rows * row), 53), vp = randv(size_t(pool_rows * row), 54);
  const std::vector<int64_t> slots = {15, 0, 3, 9, 2, 7, 1, 4, 12, 5, 8};
  Dev dk(k), dv(v), ds(slots), dkp(kp), dvp(vp), dout(size_t(n) * 4);
  cuda::kv_deviation(dk.f(), dv.f(), static_cast<const int64_t*>(ds.p), dkp.f(), dvp.f(), dout.f(), n, row, nullptr);
  std::vector<float> want(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t sl = slots[size_t(i)];
    want[size_t(i)] = BlendSchedule::deviation(k.data() + i * row, v.data() + i * row, kp.data() + sl * row,
                                               vp.data() + sl * row, row);
  }
  expect_close(dout.get(size_t(n)), want, 1e-5, "kv_deviation");
}

TEST(CudaKernels, KvWriteGatherAndRopeShift) {
  REQUIRE_DEVICE();
  const int64_t row = 2 * 16, n = 5, pool_rows = 12;
  const auto k = randv(size_t(n * row), 41), v = randv(size_t(n * row), 42);
  const std::vector<int64_t> slots = {7, 0, 11, 3, 4};
  std::vector<float> kp(size_t(pool_rows * row), -1.0f), vp = kp;
  Dev dk(k), dv(v), ds(slots), dkp(kp), dvp(vp);
  cuda::kv_write_slots(dk.f(), dv.f(), static_cast<const int64_t*>(ds.p), dkp.f(), dvp.f(), n, row, nullptr);
  std::vector<float> want_k = kp, want_v = vp;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < row; ++j)
      want_k[size_t(slots[size_t(i)] * row + j)] = k[size_t(i * row + j)], want_v[size_t(slots[size_t(i)] * row + j)] = v[size_t(i * row + j)];
  EXPECT_EQ(dkp.get(kp.size()), want_k);
  EXPECT_EQ(dvp.get(vp.size()), want_v);
  // gather the written rows back in order
  Dev dout(size_t(n * row) * 4);
  cuda::gather_rows(dkp.f(), static_cast<const int64_t*>(ds.p), dout.f(), n, row, nullptr);
  EXPECT_EQ(dout.get(size_t(n * row)), k);
  // rotate pool rows 3..7 by delta 13 (2 heads of 16)
  std::vector<float> inv(8);
  for (int64_t i = 0; i < 8; ++i) inv[size_t(i)] = float(std::pow(10000.0, -double(2 * i) / 16.0));
  std::vector<float> cs(16);
  for (int64_t i = 0; i < 8; ++i)
    cs[size_t(i)] = float(std::cos(13.0 * double(inv[size_t(i)]))), cs[size_t(8 + i)] = float(std::sin(13.0 * double(inv[size_t(i)])));
  Dev dcs(cs);
  cuda::rope_shift(dkp.f() + 3 * row, dcs.f(), dcs.f() + 8, 5, 2, 16, nullptr);
  kernels::rope_shift(want_k.data() + 3 * row, 5, 2, 16, inv.data(), 13);
  expect_close(dkp.get(kp.size()), want_k, 1e-6, "rope_shift");
}
