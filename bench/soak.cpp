// soak: a bounded soak of a running `kvboost serve`: N streaming clients for D seconds, a share of
// them cancelling mid-stream (closing the connection), some non-streaming requests, and a few
// /health probes. Reports every status, the 5xx other than the deliberate 503 (back-pressure),
// the server's RSS before and after (from /v1/stats), and whether the KV blocks and in-flight
// requests go back to zero once the clients stop. Exits 1 when an unexpected 5xx, a broken stream
// or leaked KV blocks are seen.
//
//   soak --port 8000 --clients 16 --duration 60 --cancel 0.25
#include <CLI/CLI.hpp>

#include <atomic>
#include <cstdio>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "http.h"
#include "kvboost/common.h"

using json = nlohmann::ordered_json;
using namespace kvboost;

namespace {

struct Args {
  std::string host = "127.0.0.1", key;
  int port = 8000, clients = 16, max_tokens = 48;
  double duration_s = 60, cancel = 0.25;
};

json stats(const Args& a) {
  server::Headers h;
  if (!a.key.empty()) h.push_back({"Authorization", "Bearer " + a.key});
  server::HttpResponse r = server::http_request(a.host, a.port, "GET", "/v1/stats", "", h, 10'000);
  if (r.status != 200) return json();
  try {
    return json::parse(r.body);
  } catch (...) {
    return json();
  }
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"Soak test for kvboost serve: streaming clients, some cancelling, for a bounded time"};
  app.add_option("--host", a.host)->capture_default_str();
  app.add_option("--port", a.port)->capture_default_str();
  app.add_option("--api-key", a.key);
  app.add_option("-c,--clients", a.clients)->capture_default_str();
  app.add_option("-d,--duration", a.duration_s, "Seconds")->capture_default_str()->check(CLI::Range(1.0, 3600.0));
  app.add_option("-n,--max-tokens", a.max_tokens, "Largest max_tokens of a request")->capture_default_str();
  app.add_option("--cancel", a.cancel, "Share of streams the client abandons midway")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const json before = stats(a);
  if (before.is_null()) {
    std::fprintf(stderr, "soak: no /v1/stats from %s:%d\n", a.host.c_str(), a.port);
    return 1;
  }
  std::mutex mu;
  std::map<int, int64_t> statuses;  // -1: connection failed, -2: stream broken by the server
  int64_t cancelled = 0, streams_ok = 0, tokens = 0, health_slow = 0;
  const double end = now_ms() + a.duration_s * 1000;
  std::vector<std::thread> th;
  for (int c = 0; c < a.clients; ++c)
    th.emplace_back([&, c] {
      std::mt19937 rng(1234u + unsigned(c));
      server::Headers h;
      if (!a.key.empty()) h.push_back({"Authorization", "Bearer " + a.key});
      for (int seq = 0; now_ms() < end; ++seq) {
        std::string prompt = "Soak client " + std::to_string(c) + " turn " + std::to_string(seq) + ":";
        for (int w = 0, n = 4 + int(rng() % 40); w < n; ++w) prompt += " w" + std::to_string(rng() % 50);
        const bool stream = rng() % 5 != 0;
        const bool cancel = stream && std::uniform_real_distribution<double>(0, 1)(rng) < a.cancel;
        json body{{"prompt", prompt}, {"max_tokens", 1 + int(rng() % unsigned(a.max_tokens))}, {"temperature", 0.8},
                  {"seed", seq}, {"stream", stream}};
        server::HttpStream st;
        int status = -1;
        bool broke = false, did_cancel = false;
        int64_t n_tok = 0;
        if (st.open(a.host, a.port, "POST", "/v1/completions", body.dump(), h, 120'000)) {
          status = st.status();
          if (status == 200 && stream) {
            std::string d;
            bool done = false;
            const int stop_after = 1 + int(rng() % 6);
            for (int ev = 0; st.next_event(d); ++ev) {
              if (d == "[DONE]") {
                done = true;
                break;
              }
              if (d.find("\"error\"") != std::string::npos) status = 500;
              ++n_tok;
              if (cancel && ev >= stop_after) {
                st.close();
                did_cancel = true;
                break;
              }
            }
            broke = !done && !did_cancel;
          } else {
            st.read_all();
          }
        }
        if (seq % 8 == 0) {  // a probe: /health answers promptly under load
          const double t0 = now_ms();
          const server::HttpResponse hr = server::http_request(a.host, a.port, "GET", "/health", "", {}, 10'000);
          std::lock_guard<std::mutex> l(mu);
          ++statuses[hr.status == 200 ? 200 : hr.status];
          if (now_ms() - t0 > 1000) ++health_slow;
        }
        // A client told 503 (Retry-After: 1) backs off a little rather than hammering.
        if (status == 503) std::this_thread::sleep_for(std::chrono::milliseconds(200 + int(rng() % 300)));
        std::lock_guard<std::mutex> l(mu);
        ++statuses[broke ? -2 : status];
        cancelled += did_cancel;
        streams_ok += stream && status == 200 && !broke && !did_cancel;
        tokens += n_tok;
      }
    });
  for (auto& t : th) t.join();
  // The server should be back to idle: nothing in flight, every KV block free.
  json after;
  const double wait_end = now_ms() + 15'000;
  for (;;) {
    after = stats(a);
    if (!after.is_null() && after["queue"]["in_flight"] == 0 && after["kv"]["blocks_used"] == 0) break;
    if (now_ms() > wait_end) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  int64_t bad5xx = 0, n503 = 0, total = 0;
  std::printf("soak: %d clients, %.0f s, cancel share %.2f\n  statuses:", a.clients, a.duration_s, a.cancel);
  for (const auto& [s, n] : statuses) {
    std::printf(" %d:%lld", s, (long long)n);
    total += n;
    if (s == 503) n503 += n;
    else if (s >= 500 || s == -2 || s == -1) bad5xx += n;
  }
  const int64_t rss0 = before["process"]["rss_bytes"].get<int64_t>();
  const int64_t rss1 = after.is_null() ? -1 : after["process"]["rss_bytes"].get<int64_t>();
  const int64_t blocks = after.is_null() ? -1 : after["kv"]["blocks_used"].get<int64_t>();
  const int64_t in_flight = after.is_null() ? -1 : after["queue"]["in_flight"].get<int64_t>();
  std::printf("\n  requests %lld, streams completed %lld, cancelled by the client %lld, tokens streamed %lld\n",
              (long long)total, (long long)streams_ok, (long long)cancelled, (long long)tokens);
  std::printf("  5xx other than 503 (or broken streams / failed connections): %lld; deliberate 503: %lld\n",
              (long long)bad5xx, (long long)n503);
  std::printf("  /health probes slower than 1 s: %lld\n", (long long)health_slow);
  std::printf("  server RSS before %.1f MiB, after %.1f MiB; KV blocks used after %lld, in flight %lld\n",
              double(rss0) / 1048576.0, double(rss1) / 1048576.0, (long long)blocks, (long long)in_flight);
  const bool ok = bad5xx == 0 && blocks == 0 && in_flight == 0;
  std::printf("soak: %s\n", ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}
