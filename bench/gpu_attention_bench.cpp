// gpu_attention_bench (CUDA builds): FlashAttention-2-style paged prefill and split-K decode
// (src/kernels/cuda/attention.cu) against the decoder's naive one-block-per-(head, query) kernel
// (cuda::attention over a contiguous f32 cache, all scores of a query in shared memory), at
// --tokens contexts (default 4096 and 16384), Llama-3-8B attention shape (32 query heads, 8 K/V
// heads, head_dim 128), K/V in f32 and bf16, block size 16. Medians of --reps timed runs after a
// warm-up, by CUDA events. Prints one markdown table; also checks flash vs naive agree.
//   gpu_attention_bench [--tokens N ...] [--reps 5] [--heads 32] [--kv-heads 8] [--head-dim 128]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda_kernels.h"
#include "kvboost/common.h"

using namespace kvboost;
using kernels::WType;

namespace {

struct Buf {
  void* p = nullptr;
  explicit Buf(size_t n) { cuda::check(cudaMalloc(&p, std::max<size_t>(n, 4)), "cudaMalloc"); }
  ~Buf() { cudaFree(p); }
  float* f() const { return static_cast<float*>(p); }
};

template <typename F>
double time_ms(int reps, F&& f) {
  cudaEvent_t a, b;
  cudaEventCreate(&a), cudaEventCreate(&b);
  f();  // warm-up
  cuda::check(cudaDeviceSynchronize(), "warm-up");
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    cudaEventRecord(a);
    f();
    cudaEventRecord(b);
    cuda::check(cudaEventSynchronize(b), "run");
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms);
  }
  cudaEventDestroy(a), cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void fill_random(void* dst, size_t n, WType wt, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0, 1);
  std::vector<uint8_t> h(n * (wt == WType::F32 ? 4 : 2));
  for (size_t i = 0; i < n; ++i) {
    const float x = d(g);
    if (wt == WType::F32) std::memcpy(&h[i * 4], &x, 4);
    else {
      const uint16_t v = f32_to_bf16(x);
      std::memcpy(&h[i * 2], &v, 2);
    }
  }
  cuda::check(cudaMemcpy(dst, h.data(), h.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
}

double max_rel_diff(const float* a, const float* b, size_t n) {
  std::vector<float> x(n), y(n);
  cudaMemcpy(x.data(), a, n * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(y.data(), b, n * 4, cudaMemcpyDeviceToHost);
  double worst = 0, scale = 0;
  for (size_t i = 0; i < n; ++i) worst = std::max(worst, double(std::fabs(x[i] - y[i]))), scale = std::max(scale, double(std::fabs(y[i])));
  return worst / std::max(scale, 1e-30);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> tokens;
  int reps = 5;
  int64_t nh = 32, nkv = 8, hd = 128;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "gpu_attention_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--tokens") tokens.push_back(std::atoll(next()));
    else if (a == "--reps") reps = std::atoi(next());
    else if (a == "--heads") nh = std::atoll(next());
    else if (a == "--kv-heads") nkv = std::atoll(next());
    else if (a == "--head-dim") hd = std::atoll(next());
    else {
      std::fprintf(stderr, "gpu_attention_bench: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (tokens.empty()) tokens = {4096, 16384};
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
    std::printf("gpu_attention_bench: no CUDA device\n");
    return 1;
  }
  try {
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, 0);
    std::printf("## Attention on %s: %lld query heads, %lld K/V heads, head_dim %lld, block 16\n\n", prop.name,
                (long long)nh, (long long)nkv, (long long)hd);
    std::printf("| tokens | pass | naive f32 ms | flash f32 ms | flash bf16 ms | speedup (bf16 vs naive) | flash TFLOP/s (bf16) | max rel diff flash vs naive |\n");
    std::printf("|---|---|---|---|---|---|---|---|\n");
    const float scale = 1.0f / std::sqrt(float(hd));
    const int64_t bs = 16;
    for (int64_t N : tokens) {
      const size_t kv_elems = size_t(N * nkv * hd);
      Buf k32(kv_elems * 4), v32(kv_elems * 4), k16(kv_elems * 2), v16(kv_elems * 2);
      fill_random(k32.p, kv_elems, WType::F32, 1), fill_random(v32.p, kv_elems, WType::F32, 2);
      fill_random(k16.p, kv_elems, WType::BF16, 1), fill_random(v16.p, kv_elems, WType::BF16, 2);
      // Identity block table: the contiguous cache is the paged pool with blocks in order.
      std::vector<int32_t> table(size_t((N + bs - 1) / bs));
      for (size_t b = 0; b < table.size(); ++b) table[b] = int32_t(b);
      Buf dt(table.size() * 4);
      cuda::check(cudaMemcpy(dt.p, table.data(), table.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
      const auto* tb = static_cast<const int32_t*>(dt.p);
      // Prefill: N queries over N keys, causal.
      Buf q(size_t(N * nh * hd) * 4), o1(size_t(N * nh * hd) * 4), o2(size_t(N * nh * hd) * 4);
      fill_random(q.p, size_t(N * nh * hd), WType::F32, 3);
      const bool naive_ok = N <= cuda::attention_max_tokens(hd) && N <= 65535;
      const double t_naive = naive_ok ? time_ms(reps, [&] {
        cuda::attention(q.f(), k32.f(), v32.f(), o1.f(), N, 0, N, nh, nkv, hd, 0, scale, nullptr);
      }) : NAN;
      const double t_f32 = time_ms(reps, [&] {
        cuda::flash_attention_paged(q.f(), k32.p, v32.p, WType::F32, tb, o2.f(), N, 0, N, bs, nh, nkv, hd, 0, scale, nullptr);
      });
      const double diff = naive_ok ? max_rel_diff(o2.f(), o1.f(), size_t(N * nh * hd)) : NAN;
      const double t_b16 = time_ms(reps, [&] {
        cuda::flash_attention_paged(q.f(), k16.p, v16.p, WType::BF16, tb, o2.f(), N, 0, N, bs, nh, nkv, hd, 0, scale, nullptr);
      });
      const double flops = 4.0 * double(nh) * double(hd) * double(N) * double(N + 1) / 2;
      std::printf("| %lld | prefill | %.2f | %.2f | %.2f | %.2fx | %.1f | %.1e |\n", (long long)N, t_naive, t_f32, t_b16,
                  t_naive / t_b16, flops / (t_b16 * 1e-3) / 1e12, diff);
      // Decode: one query at position N - 1.
      const int64_t sp = cuda::decode_splits(1, nh, N, 0);
      Buf ws(size_t(cuda::decode_workspace_floats(1, nh, hd, sp)) * 4);
      const float* q1 = q.f() + (N - 1) * nh * hd;
      const double d_naive = naive_ok ? time_ms(reps, [&] {
        cuda::attention(q1, k32.f(), v32.f(), o1.f(), 1, N - 1, N, nh, nkv, hd, 0, scale, nullptr);
      }) : NAN;
      const double d_f32 = time_ms(reps, [&] {
        cuda::decode_attention_paged(q1, k32.p, v32.p, WType::F32, tb, o2.f(), 1, N - 1, N, bs, nh, nkv, hd, 0, scale, sp, ws.f(), nullptr);
      });
      const double ddiff = naive_ok ? max_rel_diff(o2.f(), o1.f(), size_t(nh * hd)) : NAN;
      const double d_b16 = time_ms(reps, [&] {
        cuda::decode_attention_paged(q1, k16.p, v16.p, WType::BF16, tb, o2.f(), 1, N - 1, N, bs, nh, nkv, hd, 0, scale, sp, ws.f(), nullptr);
      });
      const double kv_gbs = double(2 * kv_elems * 2) / (d_b16 * 1e-3) / 1e9;
      std::printf("| %lld | decode (%lld splits) | %.3f | %.3f | %.3f | %.2fx | K/V read %.0f GB/s | %.1e |\n", (long long)N,
                  (long long)sp, d_naive, d_f32, d_b16, d_naive / d_b16, kv_gbs, ddiff);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "gpu_attention_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
