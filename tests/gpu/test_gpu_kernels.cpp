// Each CUDA kernel (src/kernels/cuda) against its CPU reference (kvboost/kernels.h), on shapes of
// the tiny fixtures and of Qwen2.5-0.5B. Skips without a device.
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cuda_kernels.h"
#include "kvboost/common.h"
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
