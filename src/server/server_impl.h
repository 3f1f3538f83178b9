// Internal to kvboost_server: the server's state (Server::Impl) shared by its files:
//   server.cpp           construction, start/stop, the scheduler thread;
//   server_routes.cpp    one HTTP request: CORS, auth, routing, the small endpoints;
//   server_generate.cpp  one generation request (completions, chat, warm), streamed or not;
//   server_multi.cpp     n > 1 and prompt lists;
//   server_stats.cpp     /v1/stats and /metrics.
//
// Threads and what they share:
//   event loop       accepts and reads every connection, parses requests (http_server.cpp);
//   handler thds     validate complete requests, Engine::submit, then stream from the Channel;
//   scheduler thread the only caller of Engine::step(); the engine's on_text callback (run inside
//                    step) appends text to the request's Channel; after each step the scheduler
//                    marks finished requests' channels done and records their statistics.
// A connection thread that sees its client gone, or its deadline pass, calls Request::cancel();
// the next step frees the request's KV blocks.
#pragma once

#include <atomic>
#include <condition_variable>
#include <ctime>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "api.h"
#include "http.h"
#include "kvboost/server.h"
#include "metrics.h"

namespace kvboost {

namespace server_detail {

using server::ApiError;
using server::HttpConn;
using server::HttpRequest;
using server::ojson;

// Text the engine produced for one request and not yet sent, and whether it has finished.
struct Channel {
  std::mutex mu;
  std::condition_variable cv;
  std::string pending;
  std::vector<TokenLogprob> pending_lp;  // logprobs of tokens not yet sent (streaming)
  bool done = false;
};

struct Active {
  std::shared_ptr<Request> req;
  std::shared_ptr<Channel> ch;
  bool warm = false;
};

int64_t process_rss_bytes();
std::string lower_ascii(std::string s);
std::string json_text(const ojson& j);
// Constant-time comparison (API keys).
bool same_secret(const std::string& a, const std::string& b);

// Per-second buckets of engine work for recent-throughput figures.
struct RateWindow {
  static constexpr int kSeconds = 10;
  int64_t sec[kSeconds + 1] = {};
  int64_t decode[kSeconds + 1] = {}, prefill[kSeconds + 1] = {};
  void add(int64_t now_s, int64_t n_decode, int64_t n_prefill) {
    const int i = int(now_s % (kSeconds + 1));
    if (sec[i] != now_s) {
      sec[i] = now_s;
      decode[i] = prefill[i] = 0;
    }
    decode[i] += n_decode;
    prefill[i] += n_prefill;
  }
  // Tokens per second over the last kSeconds complete seconds.
  std::pair<double, double> rates(int64_t now_s) const {
    int64_t d = 0, p = 0;
    for (int i = 0; i <= kSeconds; ++i)
      if (sec[i] < now_s && sec[i] >= now_s - kSeconds) {
        d += decode[i];
        p += prefill[i];
      }
    return {double(d) / kSeconds, double(p) / kSeconds};
  }
};

// What the request log line (--log-requests) reports about the request this handler thread
// answered: the last status counted, and the engine's token counts and TTFT (generation only).
struct LogInfo {
  int status = 0;
  int64_t prompt = 0, cached = 0, completion = 0;
  double ttft_ms = 0;
};
extern thread_local LogInfo t_log;
void log_result(const GenerateResult& r);

}  // namespace server_detail

struct Server::Impl {
  using ApiError = server::ApiError;
  using HttpConn = server::HttpConn;
  using HttpRequest = server::HttpRequest;
  using ojson = server::ojson;
  using Channel = server_detail::Channel;
  using Active = server_detail::Active;

  Engine& engine;
  ServerOptions opt;
  server::ApiContext ctx;
  std::unique_ptr<server::HttpServer> http;
  double t_start = now_ms();
  int64_t created = int64_t(std::time(nullptr));

  std::thread sched_thread;
  std::atomic<bool> draining{false}, stopped{false}, started{false};

  // Scheduler.
  std::mutex sched_mu;
  std::condition_variable sched_cv;
  bool sched_wake = false, sched_stop = false;
  std::mutex active_mu;
  std::vector<Active> active;
  std::atomic<int64_t> in_flight{0};   // generation requests submitted and not yet finished
  std::atomic<int64_t> n_running{0}, n_waiting{0};

  // Statistics.
  std::mutex stats_mu;
  std::map<std::pair<std::string, int>, int64_t> responses;  // (endpoint, status) -> count
  int64_t n_finished = 0, prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
  std::map<std::string, int64_t> finish_reasons;
  int64_t cancel_disconnect = 0, cancel_timeout = 0, cancel_shutdown = 0, rejected_overload = 0;
  double ttft_sum_s = 0, queue_sum_s = 0, e2e_sum_s = 0;
  int64_t n_steps = 0, step_decode_tokens = 0, step_prefill_tokens = 0;
  server_detail::RateWindow window;
  server::VllmMetrics vllm;  // kvboost:* (vLLM's names), metrics.cpp

  Impl(Engine& e, ServerOptions o) : engine(e), opt(std::move(o)) {}

  void wake_scheduler();
  void count(const std::string& endpoint, int status);

  // scheduler (server.cpp)
  void scheduler_loop();
  // Marks finished requests' channels done and records them.
  void reap();

  // connections (server_routes.cpp)
  void send_error(HttpConn& c, const std::string& endpoint, const ApiError& e);
  void send_json(HttpConn& c, const std::string& endpoint, int status, const ojson& body);
  // The tenant of the request: "anon" without keys, else the matching key's identity.
  std::string authenticate(const HttpRequest& r);
  bool origin_allowed(const std::string& origin) const;
  void serve_request(HttpConn& c, HttpRequest& r);
  ojson model_object() const;

  // generation (server_generate.cpp, server_multi.cpp)
  void generate(HttpConn& c, const std::string& endpoint, server::ParsedRequest& p, const std::string& tenant,
                double t_arrival, bool warm);
  bool send_event(HttpConn& c, const ojson& j) { return c.send_chunk("data: " + server_detail::json_text(j) + "\n\n"); }
  // Ends a request that failed after admission: on a stream the error event, [DONE] and the end of
  // the stream (the status line went out already); otherwise an error response. Counted either way.
  void finish_with_error(HttpConn& c, const std::string& endpoint, const ApiError& e, bool stream) {
    if (!stream) return send_error(c, endpoint, e);
    send_event(c, ojson::parse(server::error_body(e)));
    c.send_chunk("data: [DONE]\n\n");
    c.end_stream();
    count(endpoint, e.status);
  }
  void generate_multi(HttpConn& c, const std::string& endpoint, server::ParsedRequest& p, const std::string& tenant,
                      double t_arrival);

  // statistics (server_stats.cpp)
  ojson stats_json();
  std::string metrics_text();
};

}  // namespace kvboost
