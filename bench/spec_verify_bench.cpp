// spec_verify_bench: what a speculative verification pass of M rows costs against one row, per
// weight matrix of a real GGUF model (docs/speculative.md, "Why a 9-row pass costs more than one
// row"). For each distinct (name pattern, type, shape) of layer 0 and the output head: the median
// of R timed matmuls at M = 1, 2, 4, 9, 16 rows, and the ratio to M = 1.
//   build/bench/spec_verify_bench MODEL.gguf [rounds]
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "kvboost/common.h"
#include "kvboost/kernels.h"
#include "kvboost/model_files.h"

using namespace kvboost;
using kernels::WType;
using kernels::wtype_name;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL.gguf [rounds]\n", argv[0]);
    return 2;
  }
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 7;
  try {
    const WeightFiles w = WeightFiles::open_gguf(argv[1]);
    std::vector<const TensorInfo*> ts;
    for (const auto& [name, t] : w.tensors()) {
      const bool head = name == "lm_head.weight" || (name == "model.embed_tokens.weight" && !w.find("lm_head.weight"));
      if ((name.rfind("model.layers.0.", 0) == 0 && t.shape.size() == 2) || head) ts.push_back(&t);
    }
    const std::vector<int64_t> Ms = {1, 2, 4, 9, 16};
    std::printf("%-44s %-5s %8s %6s", "tensor", "type", "N", "K");
    for (int64_t m : Ms) std::printf("  M=%-2lld ms", (long long)m);
    std::printf("  ratio 9/1\n");
    double tot1 = 0, tot9 = 0;
    for (const TensorInfo* t : ts) {
      WType wt = WType::F32;
      bool found = false;
      for (int i = 0; i <= 10; ++i)
        if (t->dtype == wtype_name(WType(i))) wt = WType(i), found = true;
      if (!found) continue;
      const int64_t N = t->shape[0], K = t->shape[1];
      std::vector<float> x(size_t(16 * K)), y(size_t(16 * N));
      for (size_t i = 0; i < x.size(); ++i) x[i] = float((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
      std::printf("%-44s %-5s %8lld %6lld", t->name.c_str(), t->dtype.c_str(), (long long)N, (long long)K);
      std::vector<double> med;
      for (int64_t M : Ms) {
        std::vector<double> v;
        for (int r = 0; r < rounds; ++r) {
          const double t0 = now_ms();
          kernels::matmul(x.data(), t->data, wt, nullptr, y.data(), M, N, K);
          v.push_back(now_ms() - t0);
        }
        std::sort(v.begin(), v.end());
        med.push_back(v[v.size() / 2]);
        std::printf("  %8.3f", med.back());
      }
      std::printf("  %6.2fx\n", med[3] / med[0]);
      const bool head = t->name.find("layers.") == std::string::npos;
      tot1 += med[0] * (head ? 1 : 18), tot9 += med[3] * (head ? 1 : 18);  // (Gemma 3 270M: 18 layers)
    }
    std::printf("all matmuls of a pass (18 layers + head): M=1 %.1f ms, M=9 %.1f ms, ratio %.2fx\n", tot1, tot9, tot9 / tot1);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "spec_verify_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
