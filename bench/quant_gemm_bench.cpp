// quant_gemm_bench: the quantized prefill matmul at a Qwen2.5-0.5B MLP shape (gate/up: N = 4864,
// K = 896; down: N = 896, K = 4864), M = 512 tokens, each kernel path interleaved in the same
// run (min of R rounds: robust on a loaded machine), against the bf16 packed GEMM of the same
// shape. Paths: KVBOOST_QUANT_GEMM=off (f32 dequantized panels, the earlier prefill path),
// avx2, avxvnni / avx512vnni where the CPU has them.
//   build/bench/quant_gemm_bench [M] [rounds] [qwen|gemma] [threads]
// gemma: the Gemma 3 270M shapes instead (q 1024x640, gate/up 2048x640, o 640x1024, down 640x2048).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kvboost/common.h"
#include "kvboost/kernels.h"

using namespace kvboost;
using namespace kvboost::kernels;

namespace {
double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::vector<uint8_t> weights(WType wt, int64_t N, int64_t K) {
  std::mt19937_64 rng(1);
  std::normal_distribution<float> g(0.0f, 0.05f);
  std::vector<float> row(static_cast<size_t>(K));
  const int64_t rb = wtype_row_bytes(wt, K);
  std::vector<uint8_t> out(size_t(N * rb));
  const bool quant = quantize_row_supported(wt);
  for (int64_t n = 0; n < N; ++n) {
    for (auto& v : row) v = g(rng);
    uint8_t* o = out.data() + n * rb;
    if (quant) { quantize_row(row.data(), wt, o, K); continue; }
    for (int64_t i = 0; i < rb; ++i) o[i] = uint8_t(rng());  // Q4_K / Q5_0: random, finite scales
    const int64_t bb = wtype_block_bytes(wt);
    for (int64_t b = 0; b < rb / bb; ++b) {
      const uint16_t h = f32_to_f16(0.001f);
      std::memcpy(o + b * bb, &h, 2);
      if (wt == WType::Q4_K || wt == WType::Q5_K) std::memcpy(o + b * bb + 2, &h, 2);
    }
  }
  return out;
}
}  // namespace

int main(int argc, char** argv) {
  const int64_t M = argc > 1 ? std::atoll(argv[1]) : 512;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 5;
  if (argc > 4) set_num_threads(std::atoi(argv[4]));
  std::printf("M = %lld, %d threads, isa %s, best quantized GEMM %s; GFLOP/s (min time of %d rounds)\n",
              (long long)M, num_threads(), isa_name(active_isa()), quant_gemm_name(quant_gemm_path()), rounds);
  std::vector<std::string> paths = {"off", "avx2"};
  // Every VNNI / AMX path this CPU runs (each capped in turn: an AMX host also shows avx512vnni).
  for (const char* q : {"avxvnni", "avx512vnni", "avx512bf16", "amxint8", "amxbf16"}) {
    ::setenv("KVBOOST_QUANT_GEMM", q, 1);
    if (std::string(quant_gemm_name(quant_gemm_path())) == q) paths.push_back(q);
  }
  ::unsetenv("KVBOOST_QUANT_GEMM");
  struct Shape { int64_t N, K; const char* name; };
  const bool gemma = argc > 3 && std::string(argv[3]) == "gemma";
  const std::vector<Shape> shapes = gemma ? std::vector<Shape>{{1024, 640, "q"}, {2048, 640, "gate/up"}, {640, 1024, "o"}, {640, 2048, "down"}}
                                          : std::vector<Shape>{{4864, 896, "gate/up"}, {896, 4864, "down"}};
  std::printf("| shape | type | bf16 packed |");
  for (auto& p : paths) std::printf(" %s |", p.c_str());
  std::printf("\n|---|---|---|");
  for (size_t i = 0; i < paths.size(); ++i) std::printf("---|");
  std::printf("\n");
  for (const Shape& s : shapes) {
    std::vector<float> x(size_t(M * s.K)), y(size_t(M * s.N));
    std::mt19937_64 rng(2);
    std::normal_distribution<float> g(0.0f, 1.0f);
    for (auto& v : x) v = g(rng);
    std::vector<uint16_t> wb(size_t(s.N * s.K));
    for (auto& v : wb) v = f32_to_bf16(g(rng) * 0.05f);
    const PackedWeight pw = pack_weight(wb.data(), WType::BF16, s.N, s.K);
    const double flop = 2.0 * double(M) * double(s.N) * double(s.K);
    for (WType wt : {WType::Q4_0, WType::Q8_0, WType::Q4_K, WType::Q5_0, WType::Q6_K}) {
      if (s.K % wtype_block_elems(wt) != 0) continue;  // K = 896: not whole 256-blocks
      const std::vector<uint8_t> w = weights(wt, s.N, s.K);
      std::vector<double> best(paths.size() + 1, 1e30);
      for (int r = 0; r < rounds; ++r) {
        double t0 = now();
        matmul_packed(x.data(), pw, nullptr, y.data(), M);
        best[0] = std::min(best[0], now() - t0);
        for (size_t p = 0; p < paths.size(); ++p) {
          ::setenv("KVBOOST_QUANT_GEMM", paths[p].c_str(), 1);
          t0 = now();
          matmul(x.data(), w.data(), wt, nullptr, y.data(), M, s.N, s.K);
          best[p + 1] = std::min(best[p + 1], now() - t0);
        }
        ::unsetenv("KVBOOST_QUANT_GEMM");
      }
      std::printf("| %s %lldx%lld | %s |", s.name, (long long)s.N, (long long)s.K, wtype_name(wt));
      for (double b : best) std::printf(" %.1f |", flop / b * 1e-9);
      std::printf("\n");
    }
  }
  return 0;
}
