// Internal to kvboost_server: vLLM-compatible Prometheus metrics under a `kvboost:` prefix
// (histograms with vLLM's buckets, a model_name label). Thread-safe.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "kvboost/kv.h"
#include "kvboost/runtime.h"

namespace kvboost::server {

struct Histogram {
  std::vector<double> bounds;      // upper bounds, +Inf implied
  std::vector<int64_t> counts;     // per bucket (not cumulative), bounds.size() + 1
  double sum = 0;
  int64_t count = 0;
  explicit Histogram(std::vector<double> b) : bounds(std::move(b)), counts(bounds.size() + 1, 0) {}
  void observe(double v, int64_t times = 1);
};

class VllmMetrics {
 public:
  VllmMetrics();
  // A finished generation request (its engine result).
  void observe(const GenerateResult& r);
  // The exposition text: histograms, counters and gauges, each sample labelled model_name.
  std::string text(const std::string& model_name, const kv::KvStats& kv, const kv::ChunkStats* chunks,
                   int64_t n_running, int64_t n_waiting) const;

 private:
  mutable std::mutex mu_;
  Histogram ttft_, itl_, e2e_, queue_, prefill_, decode_, prompt_tokens_, gen_tokens_;
  int64_t preemptions_ = 0, prompt_total_ = 0, gen_total_ = 0;
  std::vector<std::pair<std::string, int64_t>> finished_;  // finished_reason -> count
};

// One request log line (--log-requests): timestamp, status, method and route, tokens, timings.
std::string request_log_line(const std::string& method, const std::string& route, int status, int64_t prompt_tokens,
                             int64_t cached_tokens, int64_t completion_tokens, double ttft_ms, double total_ms);

}  // namespace kvboost::server
