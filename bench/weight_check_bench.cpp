// The cost of the full NaN / Inf scan of every weight matrix at load (src/model/weight_check.h)
// against the load itself: Model::load (page cache warm, median of --reps), then the scan alone
// over every tensor of the same files (median), and the scalar reference once for comparison.
// docs/reliability.md has the numbers.
//   build/bench/weight_check_bench MODEL [REPS]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kvboost/common.h"
#include "kvboost/kernels.h"
#include "kvboost/model.h"
#include "kvboost/model_files.h"
#include "weight_check.h"

using namespace kvboost;

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
kernels::WType wtype(const std::string& d) {
  for (int i = 0; i <= 10; ++i)
    if (d == kernels::wtype_name(kernels::WType(i))) return kernels::WType(i);
  fail("unknown dtype ", d);
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: weight_check_bench MODEL [REPS]\n");
    return 2;
  }
  const int reps = argc > 2 ? std::max(1, std::atoi(argv[2])) : 5;
  try {
    (void)Model::load(argv[1]);  // warm the page cache
    std::vector<double> load_ms, scan_ms;
    for (int r = 0; r < reps; ++r) {
      const double t0 = now_ms();
      auto m = Model::load(argv[1]);
      load_ms.push_back(now_ms() - t0);
    }
    const std::string g = gguf_model_file(argv[1]);
    WeightFiles f = g.empty() ? WeightFiles::open_dir(argv[1]) : WeightFiles::open_gguf(g);
    size_t bytes = 0, tensors = 0;
    auto scan = [&](bool ref) {
      int64_t bad = 0;
      for (const auto& [name, t] : f.tensors()) {
        if (!t.data) continue;
        const kernels::WType wt = wtype(t.dtype);
        const int64_t n = int64_t(t.nbytes / size_t(kernels::wtype_block_bytes(wt))) * kernels::wtype_block_elems(wt);
        bad += (ref ? weight_check::find_nonfinite_ref(t.data, wt, n) : weight_check::find_nonfinite(t.data, wt, n)) >= 0;
      }
      return bad;
    };
    for (const auto& [name, t] : f.tensors()) bytes += t.nbytes, ++tensors;
    int64_t bad = scan(false);
    for (int r = 0; r < reps; ++r) {
      const double t0 = now_ms();
      bad += scan(false);
      scan_ms.push_back(now_ms() - t0);
    }
    const double t0 = now_ms();
    bad += scan(true);
    const double ref_ms = now_ms() - t0;
    const double l = median(load_ms), s = median(scan_ms);
    std::printf("model %s: %zu tensors, %.1f MB; Model::load median %.1f ms (%d reps, page cache warm)\n", argv[1],
                tensors, double(bytes) / 1e6, l, reps);
    std::printf("full scan: median %.2f ms (%.2f GB/s of stored weights), %.1f%% of the load; "
                "scalar reference %.1f ms; tensors with a non-finite value: %lld\n",
                s, double(bytes) / std::max(1e-9, s) / 1e6, 100.0 * s / l, ref_ms, (long long)bad);
    return bad == 0 ? 0 : 1;
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "weight_check_bench: %s\n", ex.what());
    return 1;
  }
}
