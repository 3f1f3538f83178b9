// kernels_bench: Google Benchmark micro-benchmarks of the matmul kernels at the GEMV (decode,
// M = 1) and GEMM (prefill, M = 128 / 512) shapes of Qwen2.5-0.5B and Llama-3.2-1B, plus the
// machine's read bandwidth for reference.
//
// Weights are bf16 by default (the models' checkpoint type); f16/f32 variants too. A GEMV walks
// through enough copies of its weight matrix (>= 256 MiB in all) that every call reads from
// DRAM, as decode does (a whole model does not fit the L3); GEMM uses one copy (it is compute
// bound and a panel stays in cache anyway). Counters: bytes_per_second = weight bytes read
// (GEMV), FLOPS = 2·M·N·K per second (GEMM).
//
//   build-perf/bench/kernels_bench                         # all
//   build-perf/bench/kernels_bench --benchmark_filter=Gemv # decode shapes only
//   KVBOOST_ISA=scalar build-perf/bench/kernels_bench ...  # another kernel path
//   KVBOOST_THREADS=1 ...                                  # one thread (default: all cores)
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "kvboost/common.h"
#include "kvboost/kernels.h"

#ifdef KVBOOST_HAVE_OPENBLAS
#include <cblas.h>
#endif
#ifdef KVBOOST_HAVE_DNNL
#include <dnnl.h>
#endif

using namespace kvboost;
using namespace kvboost::kernels;
using kvboost::bench::apply_env;
using kvboost::bench::make_weights;
using kvboost::bench::randv;

namespace {

struct Shape {
  const char* name;
  int64_t N, K;
};
// [N, K] of each linear layer (nn.Linear: out_features x in_features).
const Shape kShapes[] = {
    {"q05.q_proj", 896, 896},        {"q05.kv_proj", 128, 896},     {"q05.gate_up", 4864, 896},
    {"q05.down", 896, 4864},         {"q05.lm_head", 151936, 896},  {"l1b.q_proj", 2048, 2048},
    {"l1b.kv_proj", 512, 2048},      {"l1b.gate_up", 8192, 2048},   {"l1b.down", 2048, 8192},
    {"l1b.lm_head", 128256, 2048},
};

void BM_Gemv(benchmark::State& st, Shape s, WType wt) {
  apply_env();
  const size_t one = size_t(s.N * s.K) * wtype_size(wt);
  const int n_copies = int(std::max<size_t>(1, (256u << 20) / one + 1));
  const auto w = make_weights(wt, s.N, s.K, n_copies);
  const auto x = randv(size_t(s.K), 1, 1.0f);
  std::vector<float> y(size_t(s.N));
  int c = 0;
  for (auto _ : st) {
    matmul(x.data(), w.data() + one * c, wt, nullptr, y.data(), 1, s.N, s.K);
    benchmark::DoNotOptimize(y.data());
    c = (c + 1) % n_copies;
  }
  st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(one));
  st.SetLabel(kvboost::bench::label());
}

void BM_Gemm(benchmark::State& st, Shape s, WType wt, int64_t M) {
  apply_env();
  const auto w = make_weights(wt, s.N, s.K, 1);
  const auto x = randv(size_t(M * s.K), 1, 1.0f);
  std::vector<float> y(size_t(M * s.N));
  for (auto _ : st) {
    matmul(x.data(), w.data(), wt, nullptr, y.data(), M, s.N, s.K);
    benchmark::DoNotOptimize(y.data());
  }
  st.counters["FLOPS"] = benchmark::Counter(2.0 * double(M) * double(s.N) * double(s.K),
                                            benchmark::Counter::kIsIterationInvariantRate);
  st.SetLabel(kvboost::bench::label());
}

void BM_GemvPacked(benchmark::State& st, Shape s, WType wt) {
  apply_env();
  const size_t one = size_t(s.N * s.K) * wtype_size(wt);
  const int n_copies = int(std::max<size_t>(1, (256u << 20) / one + 1));
  std::vector<PackedWeight> pw;
  {
    const auto w = make_weights(wt, s.N, s.K, 1);
    for (int c = 0; c < n_copies; ++c) pw.push_back(pack_weight(w.data(), wt, s.N, s.K));
  }
  const auto x = randv(size_t(s.K), 1, 1.0f);
  std::vector<float> y(size_t(s.N));
  int c = 0;
  for (auto _ : st) {
    matmul_packed(x.data(), pw[size_t(c)], nullptr, y.data(), 1);
    benchmark::DoNotOptimize(y.data());
    c = (c + 1) % n_copies;
  }
  st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(one));
  st.SetLabel(kvboost::bench::label());
}

void BM_GemmPacked(benchmark::State& st, Shape s, WType wt, int64_t M) {
  apply_env();
  const auto w = make_weights(wt, s.N, s.K, 1);
  const PackedWeight pw = pack_weight(w.data(), wt, s.N, s.K);
  const auto x = randv(size_t(M * s.K), 1, 1.0f);
  std::vector<float> y(size_t(M * s.N));
  for (auto _ : st) {
    matmul_packed(x.data(), pw, nullptr, y.data(), M);
    benchmark::DoNotOptimize(y.data());
  }
  st.counters["FLOPS"] = benchmark::Counter(2.0 * double(M) * double(s.N) * double(s.K),
                                            benchmark::Counter::kIsIterationInvariantRate);
  st.SetLabel(kvboost::bench::label());
}

// Library baselines: f32 SGEMM y = x·Wᵀ with W [N, K] f32 (they have no bf16-weight GEMM on
// AVX2 CPUs).
enum class Lib { OpenBlas, OneDnn };
void BM_GemmLib(benchmark::State& st, Shape s, int64_t M, Lib lib) {
  apply_env();
  const auto w = randv(size_t(s.N * s.K), 7, 0.05f);
  const auto x = randv(size_t(M * s.K), 1, 1.0f);
  std::vector<float> y(size_t(M * s.N));
  for (auto _ : st) {
    if (lib == Lib::OpenBlas) {
#ifdef KVBOOST_HAVE_OPENBLAS
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(M), int(s.N), int(s.K), 1.0f,
                  x.data(), int(s.K), w.data(), int(s.K), 0.0f, y.data(), int(s.N));
#endif
    } else {
#ifdef KVBOOST_HAVE_DNNL
      dnnl_sgemm('N', 'T', M, s.N, s.K, 1.0f, x.data(), s.K, w.data(), s.K, 0.0f, y.data(), s.N);
#endif
    }
    benchmark::DoNotOptimize(y.data());
  }
  st.counters["FLOPS"] = benchmark::Counter(2.0 * double(M) * double(s.N) * double(s.K),
                                            benchmark::Counter::kIsIterationInvariantRate);
}

// Read bandwidth: sum a 512 MiB buffer, split evenly over n threads.
void BM_ReadBandwidth(benchmark::State& st) {
  apply_env();
  const int nt = int(st.range(0));
  const size_t n = (512u << 20) / sizeof(uint64_t);
  std::vector<uint64_t> buf(n, 1);
  for (auto _ : st) {
    std::vector<uint64_t> part(size_t(nt) * 8);
    parallel_run(nt, [&](int tid, int nth) {
      const size_t b = n * tid / nth, e = n * (tid + 1) / nth;
      uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (size_t i = b; i + 4 <= e; i += 4) {
        s0 += buf[i];
        s1 += buf[i + 1];
        s2 += buf[i + 2];
        s3 += buf[i + 3];
      }
      part[size_t(tid) * 8] = s0 + s1 + s2 + s3;
    });
    benchmark::DoNotOptimize(part.data());
  }
  st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(n * sizeof(uint64_t)));
}

int register_all() {
  for (const Shape& s : kShapes) {
    for (WType wt : {WType::BF16, WType::F16, WType::F32}) {
      benchmark::RegisterBenchmark(
          (std::string("Gemv/") + wtype_name(wt) + "/" + s.name).c_str(),
          [s, wt](benchmark::State& st) { BM_Gemv(st, s, wt); })
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
  }
  for (const Shape& s : kShapes) {
    for (WType wt : {WType::BF16, WType::F16, WType::F32}) {
      benchmark::RegisterBenchmark(
          (std::string("GemvPacked/") + wtype_name(wt) + "/" + s.name).c_str(),
          [s, wt](benchmark::State& st) { BM_GemvPacked(st, s, wt); })
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
  }
  for (int64_t M : {128, 512}) {
    for (const Shape& s : kShapes) {
      if (s.N > 10000) continue;
      for (WType wt : {WType::BF16, WType::F32}) {
        benchmark::RegisterBenchmark(
            (std::string("GemmPacked/") + wtype_name(wt) + "/M" + std::to_string(M) + "/" + s.name).c_str(),
            [s, wt, M](benchmark::State& st) { BM_GemmPacked(st, s, wt, M); })
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
      }
#ifdef KVBOOST_HAVE_OPENBLAS
      benchmark::RegisterBenchmark(
          (std::string("GemmOpenBLAS/F32/M") + std::to_string(M) + "/" + s.name).c_str(),
          [s, M](benchmark::State& st) { BM_GemmLib(st, s, M, Lib::OpenBlas); })
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
#endif
#ifdef KVBOOST_HAVE_DNNL
      benchmark::RegisterBenchmark(
          (std::string("GemmOneDNN/F32/M") + std::to_string(M) + "/" + s.name).c_str(),
          [s, M](benchmark::State& st) { BM_GemmLib(st, s, M, Lib::OneDnn); })
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
#endif
    }
  }
  for (int64_t M : {16, 64, 128, 512}) {
    for (const Shape& s : kShapes) {
      if (s.N > 10000) continue;  // lm_head runs only for the last prompt token
      for (WType wt : {WType::BF16, WType::F32}) {
        benchmark::RegisterBenchmark(
            (std::string("Gemm/") + wtype_name(wt) + "/M" + std::to_string(M) + "/" + s.name).c_str(),
            [s, wt, M](benchmark::State& st) { BM_Gemm(st, s, wt, M); })
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
      }
    }
  }
  benchmark::RegisterBenchmark("ReadBandwidth", BM_ReadBandwidth)
      ->Arg(1)
      ->Arg(2)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  return 0;
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
