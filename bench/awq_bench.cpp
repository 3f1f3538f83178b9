// AWQ 4-bit vs a baseline checkpoint of the same shape, in one process: decode tokens/s (one
// token at a time after a prompt) and prefill tokens/s, measured alternately (A, B, A, B, ...)
// so that load changes on a shared machine hit both alike; medians of --runs and their ratio.
//
//   kvboost-fixture --preset qwen2.5-0.5b --dtype bf16 --out /tmp/q05
//   kvboost-fixture --preset qwen2.5-0.5b --dtype bf16 --quant awq --group-size 128 --out /tmp/q05-awq
//   awq_bench --awq /tmp/q05-awq --base /tmp/q05 [--runs 5] [--decode-tokens 16]
//             [--context 128] [--prefill 128,512] [--threads N]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kvboost/common.h"
#include "kvboost/kernels.h"
#include "kvboost/model.h"

using namespace kvboost;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<int32_t> random_ids(int64_t vocab, int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> d(std::min<int64_t>(1000, vocab / 4), std::max<int64_t>(vocab / 2, 2) - 1);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& t : ids) t = int32_t(d(rng));
  return ids;
}

// Decode tokens/s: prompt of `context` tokens, then n_tokens single-token forwards (greedy).
double decode_tps(const Model& m, int context, int n_tokens, uint64_t seed) {
  const ModelConfig& c = m.config();
  KvCache kv(c, context + n_tokens + 1);
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  const std::vector<int32_t> prompt = random_ids(c.vocab_size, context, seed);
  m.forward(prompt.data(), context, kv, logits.data());
  const double t0 = now_ms();
  for (int i = 0; i < n_tokens; ++i) {
    const int32_t t = int32_t(kernels::argmax(logits.data(), c.vocab_size));
    m.forward(&t, 1, kv, logits.data());
  }
  return n_tokens * 1000.0 / (now_ms() - t0);
}

double prefill_tps(const Model& m, int n, uint64_t seed) {
  const ModelConfig& c = m.config();
  KvCache kv(c, n);
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  const std::vector<int32_t> prompt = random_ids(c.vocab_size, n, seed);
  const double t0 = now_ms();
  m.forward(prompt.data(), n, kv, logits.data());
  return n * 1000.0 / (now_ms() - t0);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"AWQ vs baseline decode and prefill tokens/s, measured alternately in one process"};
  std::string awq_dir, base_dir;
  int runs = 5, decode_tokens = 16, context = 128, threads = 0;
  std::vector<int> prefill{128, 512};
  app.add_option("--awq", awq_dir, "AWQ model directory")->required();
  app.add_option("--base", base_dir, "Baseline model directory of the same shape (e.g. bf16)")->required();
  app.add_option("--runs", runs, "Runs per measurement (median)")->capture_default_str();
  app.add_option("--decode-tokens", decode_tokens, "Tokens per decode run")->capture_default_str();
  app.add_option("--context", context, "Prompt length before decode")->capture_default_str();
  app.add_option("--prefill", prefill, "Prompt lengths for prefill")->delimiter(',');
  app.add_option("--threads", threads, "Threads (default: all)");
  CLI11_PARSE(app, argc, argv);
  try {
    if (threads > 0) set_num_threads(threads);
    auto a = Model::load(awq_dir);
    auto b = Model::load(base_dir);
    const double bytes_a = double(a->decode_weight_bytes()), bytes_b = double(b->decode_weight_bytes());
    std::printf("# awq_bench: %s vs %s, path %s, %d threads, medians of %d alternating runs\n",
                awq_dir.c_str(), base_dir.c_str(), isa_name(active_isa()), num_threads(), runs);
    std::printf("# weights read per decoded token: awq %.0f MB, base %.0f MB (%.2fx)\n\n",
                bytes_a / 1e6, bytes_b / 1e6, bytes_b / bytes_a);
    std::printf("| what | awq tok/s | base tok/s | awq / base |\n|---|---|---|---|\n");
    // warm-up: one short decode each (page faults, thread pool)
    decode_tps(*a, 8, 2, 1);
    decode_tps(*b, 8, 2, 1);
    std::vector<double> da, db;
    for (int r = 0; r < runs; ++r) {
      da.push_back(decode_tps(*a, context, decode_tokens, 100 + r));
      db.push_back(decode_tps(*b, context, decode_tokens, 100 + r));
    }
    std::printf("| decode at context %d (%d tokens) | %.2f | %.2f | %.2fx |\n", context, decode_tokens, median(da),
                median(db), median(da) / median(db));
    std::fflush(stdout);
    for (int L : prefill) {
      std::vector<double> pa, pb;
      for (int r = 0; r < runs; ++r) {
        pa.push_back(prefill_tps(*a, L, 200 + r));
        pb.push_back(prefill_tps(*b, L, 200 + r));
      }
      std::printf("| prefill %d tokens | %.1f | %.1f | %.2fx |\n", L, median(pa), median(pb), median(pa) / median(pb));
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "awq_bench: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
