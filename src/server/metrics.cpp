// vLLM's metric names and types under `kvboost:` (vLLM's `vllm:` names with our prefix), next to
// the server's older kvboost_* metrics (server.cpp), which stay as they were.
#include "metrics.h"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <sstream>

namespace kvboost::server {

void Histogram::observe(double v, int64_t times) {
  size_t b = 0;
  while (b < bounds.size() && v > bounds[b]) ++b;
  counts[b] += times;
  sum += v * double(times);
  count += times;
}

namespace {
// vLLM's buckets (vllm/v1/metrics/loggers.py).
const std::vector<double> kTtft = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                   1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
const std::vector<double> kItl = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                                  0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
const std::vector<double> kLatency = {0.3,  0.5,  0.8,  1.0,  1.5,  2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
                                      30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
const std::vector<double> kTokens = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000};

std::string label_value(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '\\' || c == '"') o += '\\', o += c;
    else if (c == '\n') o += "\\n";
    else o += c;
  }
  return o;
}
}  // namespace

VllmMetrics::VllmMetrics()
    : ttft_(kTtft), itl_(kItl), e2e_(kLatency), queue_(kLatency), prefill_(kLatency), decode_(kLatency),
      prompt_tokens_(kTokens), gen_tokens_(kTokens) {}

void VllmMetrics::observe(const GenerateResult& r) {
  std::lock_guard<std::mutex> l(mu_);
  if (r.finish_reason != "error" && !r.output_ids.empty()) ttft_.observe(r.ttft_ms / 1000);
  // Inter-token latency: the request's decode time spread evenly over its token gaps (the engine
  // keeps no per-token timestamps); sum and count are exact, the spread within a request is not.
  if (r.output_ids.size() > 1) itl_.observe(r.decode_ms / 1000 / double(r.output_ids.size() - 1), int64_t(r.output_ids.size() - 1));
  e2e_.observe(r.total_ms / 1000);
  queue_.observe(r.queue_ms / 1000);
  prefill_.observe(r.prefill_ms / 1000);
  decode_.observe(r.decode_ms / 1000);
  prompt_tokens_.observe(double(r.n_prompt()));
  gen_tokens_.observe(double(r.output_ids.size()));
  preemptions_ += r.n_preempted;
  prompt_total_ += r.n_prompt();
  gen_total_ += int64_t(r.output_ids.size());
  const std::string reason = r.finish_reason.empty() ? "unknown" : r.finish_reason;
  for (auto& [name, n] : finished_)
    if (name == reason) return void(++n);
  finished_.emplace_back(reason, 1);
}

std::string VllmMetrics::text(const std::string& model_name, const kv::KvStats& kv, const kv::ChunkStats* chunks,
                              int64_t n_running, int64_t n_waiting) const {
  std::ostringstream o;
  o.precision(10);
  const std::string lab = "model_name=\"" + label_value(model_name) + "\"";
  auto head = [&](const std::string& name, const char* type, const char* help) {
    o << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
  };
  auto one = [&](const std::string& name, const char* type, const char* help, double v) {
    head(name, type, help);
    o << name << '{' << lab << "} " << v << '\n';
  };
  auto hist = [&](const std::string& name, const char* help, const Histogram& h) {
    head(name, "histogram", help);
    int64_t cum = 0;
    for (size_t b = 0; b <= h.bounds.size(); ++b) {
      cum += h.counts[b];
      o << name << "_bucket{" << lab << ",le=\"";
      if (b < h.bounds.size()) o << h.bounds[b];
      else o << "+Inf";
      o << "\"} " << cum << '\n';
    }
    o << name << "_sum{" << lab << "} " << h.sum << '\n' << name << "_count{" << lab << "} " << h.count << '\n';
  };
  std::lock_guard<std::mutex> l(mu_);
  one("kvboost:num_requests_running", "gauge", "Requests in the running batch.", double(n_running));
  one("kvboost:num_requests_waiting", "gauge", "Requests waiting for admission.", double(n_waiting));
  one("kvboost:kv_cache_usage_perc", "gauge", "KV-cache usage: 1 means 100 percent (used blocks / all blocks).",
      kv.n_blocks ? double(kv.blocks_used) / double(kv.n_blocks) : 0.0);
  one("kvboost:num_preemptions_total", "counter", "Cumulative preemptions of finished requests.", double(preemptions_));
  one("kvboost:prefix_cache_queries_total", "counter", "Prefix cache queries, in queried tokens.", double(kv.query_tokens));
  one("kvboost:prefix_cache_hits_total", "counter", "Prefix cache hits, in cached tokens.", double(kv.hit_tokens));
  one("kvboost:prompt_tokens_total", "counter", "Prompt tokens of finished requests.", double(prompt_total_));
  one("kvboost:generation_tokens_total", "counter", "Generated tokens of finished requests.", double(gen_total_));
  head("kvboost:request_success_total", "counter", "Finished requests by finish reason.");
  for (const auto& [reason, n] : finished_)
    o << "kvboost:request_success_total{" << lab << ",finished_reason=\"" << label_value(reason) << "\"} " << n << '\n';
  if (chunks) {
    // Chunk hits by the tier they came from: RAM, disk (loaded back), remote (--chunk-remote).
    const int64_t hits = chunks->prefix_hits + chunks->content_hits;
    head("kvboost:chunk_store_hits_total", "counter", "Chunk-store hits by tier.");
    o << "kvboost:chunk_store_hits_total{" << lab << ",tier=\"ram\"} " << std::max<int64_t>(0, hits - chunks->disk_loads) << '\n'
      << "kvboost:chunk_store_hits_total{" << lab << ",tier=\"disk\"} " << chunks->disk_loads << '\n'
      << "kvboost:chunk_store_hits_total{" << lab << ",tier=\"remote\"} " << chunks->remote.hits << '\n';
    one("kvboost:chunk_store_queries_total", "counter", "Chunk-store lookups.", double(chunks->lookups));
  }
  hist("kvboost:time_to_first_token_seconds", "Time to first token, seconds.", ttft_);
  hist("kvboost:inter_token_latency_seconds", "Time between output tokens, seconds (a request's mean gap).", itl_);
  hist("kvboost:e2e_request_latency_seconds", "Submit-to-finish latency of finished requests, seconds.", e2e_);
  hist("kvboost:request_queue_time_seconds", "Time waiting for admission, seconds.", queue_);
  hist("kvboost:request_prefill_time_seconds", "Prefill time, seconds.", prefill_);
  hist("kvboost:request_decode_time_seconds", "Decode time (after the first token), seconds.", decode_);
  hist("kvboost:request_prompt_tokens", "Prompt tokens per finished request.", prompt_tokens_);
  hist("kvboost:request_generation_tokens", "Generated tokens per finished request.", gen_tokens_);
  return o.str();
}

std::string request_log_line(const std::string& method, const std::string& route, int status, int64_t prompt_tokens,
                             int64_t cached_tokens, int64_t completion_tokens, double ttft_ms, double total_ms) {
  char ts[32];
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", &tm);
  char line[512];
  std::snprintf(line, sizeof line,
                "%s kvboost serve: status=%d %s %s prompt_tokens=%lld cached_tokens=%lld completion_tokens=%lld "
                "ttft_ms=%.1f total_ms=%.1f",
                ts, status, method.c_str(), route.c_str(), (long long)prompt_tokens, (long long)cached_tokens,
                (long long)completion_tokens, ttft_ms, total_ms);
  return line;
}

}  // namespace kvboost::server
