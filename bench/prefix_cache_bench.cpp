// Prefix-cache TTFT: requests that share a long prompt prefix and differ in a short suffix.
// For each round (its own cache namespace, so the first request is a true miss) it times
//   first:  prefix + suffix A   (cold: the whole prompt is prefilled)
//   second: prefix + suffix B   (warm: the prefix's full blocks come from the cache)
// and prints the medians and the ratio first / second, measured in the same process.
//
//   prefix_cache_bench --model DIR [--prefix 2000] [--suffix 50] [--rounds 3]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>

#include "kvboost/runtime.h"

using namespace kvboost;

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Ordinary (non-special) token ids, deterministic.
std::vector<int32_t> ids(const Tokenizer& tok, int n, uint64_t seed) {
  std::vector<int32_t> out;
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  const int32_t v = std::min<int32_t>(tok.vocab_size(), 100000);
  while (int(out.size()) < n) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    const int32_t id = int32_t(s % uint64_t(v));
    if (!tok.is_special(id)) out.push_back(id);
  }
  return out;
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Time to first token with and without a prefix-cache hit"};
  std::string model;
  int prefix = 2000, suffix = 50, rounds = 3;
  app.add_option("--model", model, "Model directory")->required();
  app.add_option("--prefix", prefix, "Shared prefix length in tokens")->capture_default_str();
  app.add_option("--suffix", suffix, "Distinct suffix length in tokens")->capture_default_str();
  app.add_option("--rounds", rounds, "Rounds (median reported)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    auto e = Engine::load(model);
    const auto pre = ids(e->tokenizer(), prefix, 1);
    std::vector<double> cold, warm;
    std::printf("model %s | prefix %d + suffix %d tokens | threads %d | isa %s\n", model.c_str(), prefix, suffix,
                num_threads(), isa_name(active_isa()));
    std::printf("%-6s %14s %14s %10s %12s\n", "round", "first TTFT ms", "second TTFT ms", "ratio", "reused");
    for (int r = 0; r < rounds; ++r) {
      GenerateOptions opt;
      opt.max_new_tokens = 1;
      opt.cache_namespace = "round-" + std::to_string(r);
      auto a = pre, b = pre;
      auto sa = ids(e->tokenizer(), suffix, 100 + 2 * r), sb = ids(e->tokenizer(), suffix, 101 + 2 * r);
      a.insert(a.end(), sa.begin(), sa.end());
      b.insert(b.end(), sb.begin(), sb.end());
      GenerateResult ra = e->generate_ids(a, opt);
      GenerateResult rb = e->generate_ids(b, opt);
      cold.push_back(ra.ttft_ms);
      warm.push_back(rb.ttft_ms);
      std::printf("%-6d %14.1f %14.1f %9.1fx %6lld/%-5zu\n", r, ra.ttft_ms, rb.ttft_ms, ra.ttft_ms / rb.ttft_ms,
                  (long long)rb.n_cached, rb.prompt_ids.size());
    }
    std::printf("median %14.1f %14.1f %9.1fx\n", median(cold), median(warm), median(cold) / median(warm));
    std::printf("kv cache: %s\n", e->kv_stats().to_string().c_str());
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "prefix_cache_bench: error: %s\n", ex.what());
    return 1;
  }
  return 0;
}
