// kernels_gbench: Google Benchmark micro-benchmarks of every kernel a forward pass runs, at the
// shapes of Qwen2.5-0.5B (hidden 896, intermediate 4864, 14 q / 2 kv heads of 64, vocab
// 151,936) and Llama-3.2-1B (2048, 8192, 32 / 8 heads of 64, vocab 128,256), per kernel path
// this CPU can run (the scalar reference on a small subset only; KVBOOST_ISA=... limits the
// run to that one path).
//
//   Matmul/<isa>/<weights>/<model>.<layer>/M<tokens>
//       weights: BF16packed (pack_weight + matmul_packed, the prepacked layout), BF16raw
//       (matmul over the [N, K] checkpoint layout, what the decoder calls), Q8_0 / Q4_0 / Q4_K
//       (the integer-dot matmul over GGUF blocks); layer: q, k_v, o, gate_up (each of gate
//       and up), down, lm_head; tokens: 1 (decode), 8 (batched decode), 64, 512 (prefill;
//       lm_head only at 1 and 8: prefill needs it for the last token only). Q4_K needs rows of
//       whole 256-blocks, so at the 0.5B shape (896 columns) only down runs.
//       With 1 and 8 tokens the call cycles through copies of its weights (>= 256 MiB in all)
//       so that every call reads them from DRAM, as decode does; from 64 tokens on, one copy.
//   Attention/<isa>/<model>/{decode,prefill}/ctx<n>   paged FlashAttention-2, blocks of 16
//       (decode: one query at the end of n keys; prefill: n causal queries from position 0)
//   RMSNorm|SwiGLU|GeluTanh|RoPE/<isa>/<model>/M<tokens>   element-wise kernels (RoPE: q and k)
//   ResidualNorm/<isa>/<model>/M<tokens>/{unfused,fused}   `x += d; h = rms_norm(x)` as a loop
//       plus rms_norm, or as add_rms_norm (one pass)
//
// Counters (rates, per second of wall time): bytes/s = the bytes a call must move at least
// (weights + activations in and out; attention: K/V once), FLOP/s = 2 * M * N * K for a matmul
// (attention: 4 * heads * head_dim per visible key and query). Threads: all cores unless
// KVBOOST_THREADS=n.
//
//   build-gb/bench/kernels_gbench --benchmark_filter='Matmul/avx2/BF16packed/q05'
//   build-gb/bench/kernels_gbench --benchmark_filter='/M1/' --benchmark_repetitions=3
//       (add --benchmark_report_aggregates_only=true for medians only)
//   KVBOOST_THREADS=1 build-gb/bench/kernels_gbench --benchmark_filter=Attention
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "kvboost/common.h"
#include "kvboost/kernels.h"

using namespace kvboost;
using namespace kvboost::kernels;
using kvboost::bench::apply_env;

namespace {

struct ModelShape {
  const char* name;
  int64_t H, I, n_heads, n_kv_heads, hd, vocab;
};
const ModelShape kModels[] = {
    {"q05", 896, 4864, 14, 2, 64, 151936},
    {"l1b", 2048, 8192, 32, 8, 64, 128256},
};

struct Linear {
  std::string name;
  int64_t N, K;  // nn.Linear [out_features, in_features]
};
std::vector<Linear> linears(const ModelShape& m) {
  const int64_t nq = m.n_heads * m.hd, nkv = m.n_kv_heads * m.hd;
  return {{"q", nq, m.H},     {"k_v", nkv, m.H}, {"o", m.H, nq},
          {"gate_up", m.I, m.H}, {"down", m.H, m.I}, {"lm_head", m.vocab, m.H}};
}

// Runs a benchmark on one kernel path and restores the previous one.
struct IsaScope {
  Isa saved = active_isa();
  explicit IsaScope(Isa isa) { set_active_isa(isa); }
  ~IsaScope() { set_active_isa(saved); }
};

std::string isa_str(Isa isa) { return isa_name(isa); }

void rate_counters(benchmark::State& st, double bytes, double flops) {
  st.counters["bytes/s"] = benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate);
  if (flops > 0)
    st.counters["FLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
  st.SetLabel(bench::label());
}

// ---- matmul ----
enum class Path { Packed, Raw, Quant };

struct MatCase {
  Linear lin;
  WType wt;
  Path path;
  int64_t M;
  Isa isa;
};

void BM_Matmul(benchmark::State& st, const MatCase& c) {
  apply_env();
  IsaScope scope(c.isa);
  const int64_t N = c.lin.N, K = c.lin.K, M = c.M;
  const size_t one = size_t(N) * size_t(wtype_row_bytes(c.wt, K));
  const int n_copies = M <= 8 ? int(std::max<size_t>(1, (size_t(256) << 20) / one + 1)) : 1;
  std::vector<uint8_t> raw;
  std::vector<PackedWeight> packed;
  if (c.path == Path::Packed) {
    const auto w = bench::make_weights(c.wt, N, K, 1);
    for (int i = 0; i < n_copies; ++i) packed.push_back(pack_weight(w.data(), c.wt, N, K));
  } else if (c.path == Path::Raw) {
    raw = bench::make_weights(c.wt, N, K, n_copies);
  } else {
    raw = bench::make_quant_weights(c.wt, N, K);
    raw.resize(one * size_t(n_copies));
    for (int i = 1; i < n_copies; ++i) std::copy_n(raw.begin(), one, raw.begin() + ptrdiff_t(one) * i);
  }
  const auto x = bench::randv(size_t(M * K), 1, 1.0f);
  std::vector<float> y(size_t(M * N));
  int i = 0;
  for (auto _ : st) {
    if (c.path == Path::Packed)
      matmul_packed(x.data(), packed[size_t(i)], nullptr, y.data(), M);
    else
      matmul(x.data(), raw.data() + one * size_t(i), c.wt, nullptr, y.data(), M, N, K);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
    i = (i + 1) % n_copies;
  }
  rate_counters(st, double(one) + 4.0 * double(M) * double(N + K), 2.0 * double(M) * double(N) * double(K));
}

// ---- attention ----
void BM_Attention(benchmark::State& st, const ModelShape& m, int64_t ctx, bool prefill, Isa isa) {
  apply_env();
  IsaScope scope(isa);
  const int64_t bs = 16, n_blocks = (ctx + bs - 1) / bs, nkv = m.n_kv_heads * m.hd, nq = m.n_heads * m.hd;
  const int64_t n_q = prefill ? ctx : 1, q_pos0 = prefill ? 0 : ctx - 1;
  // Blocks in a shuffled order, as a pool that has served other sequences holds them.
  std::vector<int32_t> table(static_cast<size_t>(n_blocks));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937(3));
  const auto k = bench::randv(size_t(n_blocks * bs * nkv), 4, 1.0f);
  const auto v = bench::randv(size_t(n_blocks * bs * nkv), 5, 1.0f);
  const auto q = bench::randv(size_t(n_q * nq), 6, 1.0f);
  std::vector<float> out(size_t(n_q * nq));
  const float scale = 1.0f / std::sqrt(float(m.hd));
  for (auto _ : st) {
    paged_attention(q.data(), k.data(), v.data(), table.data(), out.data(), n_q, q_pos0, ctx, bs, m.n_heads,
                    m.n_kv_heads, m.hd, 0, scale);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  // Query at position p sees p + 1 keys.
  const double pairs = prefill ? double(ctx) * double(ctx + 1) / 2.0 : double(ctx);
  rate_counters(st, 4.0 * (2.0 * double(ctx) * double(nkv) + 2.0 * double(n_q) * double(nq)),
                4.0 * double(m.n_heads) * double(m.hd) * pairs);
}

// ---- element-wise ----
void BM_RMSNorm(benchmark::State& st, const ModelShape& m, int64_t M, Isa isa) {
  apply_env();
  IsaScope scope(isa);
  const auto x = bench::randv(size_t(M * m.H), 1, 1.0f), w = bench::randv(size_t(m.H), 2, 1.0f);
  std::vector<float> y(x.size());
  for (auto _ : st) {
    rms_norm(x.data(), w.data(), y.data(), M, m.H, 1e-6f);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  rate_counters(st, 4.0 * double(2 * M * m.H + m.H), 4.0 * double(M * m.H));
}

// GELU(tanh) * up (Gemma's MLP): the scalar path is the tanhf loop the AVX2 build also ran
// before the vector version.
void BM_GeluTanh(benchmark::State& st, const ModelShape& m, int64_t M, Isa isa) {
  apply_env();
  IsaScope scope(isa);
  const auto g = bench::randv(size_t(M * m.I), 1, 2.0f), u = bench::randv(size_t(M * m.I), 2, 1.0f);
  std::vector<float> y(g.size());
  for (auto _ : st) {
    gelu_tanh_mul(g.data(), u.data(), y.data(), M * m.I);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  rate_counters(st, 4.0 * 3.0 * double(M * m.I), 0);
}

void BM_SwiGLU(benchmark::State& st, const ModelShape& m, int64_t M, Isa isa) {
  apply_env();
  IsaScope scope(isa);
  const auto g = bench::randv(size_t(M * m.I), 1, 2.0f), u = bench::randv(size_t(M * m.I), 2, 1.0f);
  std::vector<float> y(g.size());
  for (auto _ : st) {
    silu_mul(g.data(), u.data(), y.data(), M * m.I);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  rate_counters(st, 4.0 * 3.0 * double(M * m.I), 0);
}

// RoPE on q and k of M tokens (the decoder's two calls).
void BM_RoPE(benchmark::State& st, const ModelShape& m, int64_t M, Isa isa) {
  apply_env();
  IsaScope scope(isa);
  const int64_t half = m.hd / 2;
  auto q = bench::randv(size_t(M * m.n_heads * m.hd), 1, 1.0f), k = bench::randv(size_t(M * m.n_kv_heads * m.hd), 2, 1.0f);
  std::vector<float> cos(size_t(M * half)), sin(cos.size());
  for (int64_t t = 0; t < M; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const double a = double(t + 100) * std::pow(1e6, -double(2 * i) / double(m.hd));
      cos[size_t(t * half + i)] = float(std::cos(a)), sin[size_t(t * half + i)] = float(std::sin(a));
    }
  for (auto _ : st) {
    rope_rotate_half(q.data(), cos.data(), sin.data(), M, m.n_heads, m.hd);
    rope_rotate_half(k.data(), cos.data(), sin.data(), M, m.n_kv_heads, m.hd);
    benchmark::DoNotOptimize(q.data());
    benchmark::DoNotOptimize(k.data());
    benchmark::ClobberMemory();
  }
  rate_counters(st, 4.0 * (2.0 * double(M * (m.n_heads + m.n_kv_heads) * m.hd) + 2.0 * double(M * half)),
                6.0 * double(M * (m.n_heads + m.n_kv_heads) * half));
}

// The residual add and the RMSNorm after it: fused (add_rms_norm, one pass) or as the decoder
// ran them before (a loop `x += d`, then rms_norm reading x again).
void BM_ResidualNorm(benchmark::State& st, const ModelShape& m, int64_t M, bool fused, Isa isa) {
  apply_env();
  IsaScope scope(isa);
  const int64_t n = M * m.H;
  auto x = bench::randv(size_t(n), 1, 1.0f);
  const auto d = bench::randv(size_t(n), 2, 1e-3f), w = bench::randv(size_t(m.H), 3, 1.0f);
  std::vector<float> y(static_cast<size_t>(n));
  for (auto _ : st) {
    if (fused) {
      add_rms_norm(x.data(), d.data(), w.data(), y.data(), M, m.H, 1e-6f);
    } else {
      for (int64_t i = 0; i < n; ++i) x[size_t(i)] += d[size_t(i)];
      rms_norm(x.data(), w.data(), y.data(), M, m.H, 1e-6f);
    }
    benchmark::DoNotOptimize(x.data());
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  rate_counters(st, 4.0 * double(4 * n + m.H), 0);  // x in and out, d in, y out
}

// ---- registration ----
template <typename F>
void reg(const std::string& name, F f, benchmark::TimeUnit unit = benchmark::kMicrosecond) {
  benchmark::RegisterBenchmark(name.c_str(), f)->UseRealTime()->Unit(unit);
}

std::string mat_name(Isa isa, const std::string& w, const ModelShape& m, const Linear& l, int64_t M) {
  return "Matmul/" + isa_str(isa) + "/" + w + "/" + m.name + "." + l.name + "/M" + std::to_string(M);
}

void register_all() {
  // The paths to run: the one KVBOOST_ISA names, else the scalar reference (a subset) and the
  // best vector path this CPU has (every dispatch above scalar runs the AVX2 kernels).
  std::vector<Isa> isas;
  if (const char* e = std::getenv("KVBOOST_ISA"); e && *e) {
    isas.push_back(active_isa());
  } else {
    isas.push_back(Isa::Scalar);
    set_active_isa(Isa::Avx2);
    if (active_isa() >= Isa::Avx2) isas.push_back(Isa::Avx2);
  }
  for (Isa isa : isas) {
    const bool full = isa != Isa::Scalar;
    for (const ModelShape& m : kModels) {
      const bool small = std::string(m.name) == "q05";
      // bf16 weights, packed and raw.
      for (Path path : {Path::Packed, Path::Raw}) {
        const std::string w = path == Path::Packed ? "BF16packed" : "BF16raw";
        for (int64_t M : {1, 8, 64, 512}) {
          for (const Linear& l : linears(m)) {
            if (l.name == "lm_head" && M > 8) continue;
            // Scalar: the double-accumulating reference; a few small cases show its cost.
            if (!full && !(small && M <= 64 && (l.name == "q" || l.name == "gate_up"))) continue;
            if (!full && M == 64 && l.name != "q") continue;
            const MatCase c{l, WType::BF16, path, M, isa};
            reg(mat_name(isa, w, m, l, M), [c](benchmark::State& st) { BM_Matmul(st, c); },
                M >= 64 ? benchmark::kMillisecond : benchmark::kMicrosecond);
          }
        }
      }
      // Quantized weights.
      for (WType wt : {WType::Q8_0, WType::Q4_0, WType::Q4_K}) {
        for (int64_t M : {1, 512}) {
          for (const Linear& l : linears(m)) {
            if (l.name == "lm_head" && M > 8) continue;
            if (l.K % wtype_block_elems(wt) != 0) continue;  // Q4_K at 896 columns
            if (!full && !(small && M == 1 && l.name == "gate_up" && wt == WType::Q8_0)) continue;
            const MatCase c{l, wt, Path::Quant, M, isa};
            reg(mat_name(isa, wtype_name(wt), m, l, M), [c](benchmark::State& st) { BM_Matmul(st, c); },
                M >= 64 ? benchmark::kMillisecond : benchmark::kMicrosecond);
          }
        }
      }
      // Attention.
      for (bool prefill : {false, true}) {
        for (int64_t ctx : {512, 4096}) {
          if (!full && !(small && ctx == 512)) continue;
          reg("Attention/" + isa_str(isa) + "/" + m.name + (prefill ? "/prefill" : "/decode") + "/ctx" + std::to_string(ctx),
              [&m, ctx, prefill, isa](benchmark::State& st) { BM_Attention(st, m, ctx, prefill, isa); },
              prefill ? benchmark::kMillisecond : benchmark::kMicrosecond);
        }
      }
      // Element-wise (cheap: every path).
      for (int64_t M : {1, 512}) {
        std::string tail = "/";
        tail += isa_str(isa) + "/" + m.name + "/M" + std::to_string(M);
        reg(std::string("RMSNorm") + tail, [&m, M, isa](benchmark::State& st) { BM_RMSNorm(st, m, M, isa); });
        reg(std::string("SwiGLU") + tail, [&m, M, isa](benchmark::State& st) { BM_SwiGLU(st, m, M, isa); });
        reg(std::string("GeluTanh") + tail, [&m, M, isa](benchmark::State& st) { BM_GeluTanh(st, m, M, isa); });
        reg(std::string("RoPE") + tail, [&m, M, isa](benchmark::State& st) { BM_RoPE(st, m, M, isa); });
        for (bool fused : {false, true})
          reg(std::string("ResidualNorm") + tail + (fused ? "/fused" : "/unfused"),
              [&m, M, fused, isa](benchmark::State& st) { BM_ResidualNorm(st, m, M, fused, isa); });
      }
    }
  }
  set_active_isa(isas.back());
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
