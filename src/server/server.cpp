// The server: HTTP on an event loop with a bounded pool of handler threads (http.h), one
// scheduler thread stepping the engine.
//
// Threads and what they share:
//   event loop       accepts and reads every connection, parses requests (http_server.cpp);
//   handler thds     validate complete requests, Engine::submit, then stream from the Channel;
//   scheduler thread the only caller of Engine::step(); the engine's on_text callback (run inside
//                    step) appends text to the request's Channel; after each step the scheduler
//                    marks finished requests' channels done and records their statistics.
// A connection thread that sees its client gone, or its deadline pass, calls Request::cancel();
// the next step frees the request's KV blocks.
#include "kvboost/server.h"

#include <sys/socket.h>
#include <sys/time.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "api.h"
#include "kvboost/chat.h"
#include "http.h"
#include "metrics.h"

namespace kvboost {

using server::ApiError;
using server::HttpConn;
using server::HttpRequest;
using server::ojson;

namespace {

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

int64_t process_rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
  return 0;
}

std::string lower_ascii(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string json_text(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

// Constant-time comparison (API keys).
bool same_secret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= (unsigned char)(a[i] ^ b[i % (b.empty() ? 1 : b.size())]);
  return diff == 0 && !b.empty();
}

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
thread_local LogInfo t_log;

void log_result(const GenerateResult& r) {
  t_log.prompt += r.n_prompt();
  t_log.cached += std::max<int64_t>(0, std::max(r.n_cached, r.n_reused - r.n_recomputed));
  t_log.completion += int64_t(r.output_ids.size());
  if (t_log.ttft_ms == 0) t_log.ttft_ms = r.ttft_ms;
}

}  // namespace

struct Server::Impl {
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
  RateWindow window;
  server::VllmMetrics vllm;  // kvboost:* (vLLM's names), metrics.cpp

  Impl(Engine& e, ServerOptions o) : engine(e), opt(std::move(o)) {}

  void wake_scheduler() {
    {
      std::lock_guard<std::mutex> l(sched_mu);
      sched_wake = true;
    }
    sched_cv.notify_one();
  }

  void count(const std::string& endpoint, int status) {
    t_log.status = status;
    std::lock_guard<std::mutex> l(stats_mu);
    ++responses[{endpoint, status}];
  }

  // ---- scheduler -------------------------------------------------------------------------------

  void scheduler_loop() {
    for (;;) {
      {
        std::unique_lock<std::mutex> l(sched_mu);
        // The timeout is a safety net: a request finished by another thread's step (Engine::generate
        // callers) is still reaped.
        sched_cv.wait_for(l, std::chrono::milliseconds(50), [&] { return sched_stop || sched_wake || engine.has_work(); });
        sched_wake = false;
        if (sched_stop && !engine.has_work()) {
          l.unlock();
          reap();
          return;
        }
      }
      bool stepped = false;
      if (engine.has_work()) {
        stepped = true;
        try {
          const StepStats ss = engine.step();
          n_running = ss.n_running;
          n_waiting = ss.n_waiting;
          std::lock_guard<std::mutex> l(stats_mu);
          ++n_steps;
          step_decode_tokens += ss.n_decode;
          step_prefill_tokens += ss.n_prefill_tokens;
          window.add(int64_t(now_ms() / 1000), ss.n_decode, ss.n_prefill_tokens);
        } catch (const std::exception& e) {
          // step() fails requests itself; anything escaping is logged and the loop goes on.
          std::fprintf(stderr, "kvboost serve: engine step failed: %s\n", e.what());
        }
      }
      reap();
      if (stepped && opt.step_delay_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(opt.step_delay_ms));
    }
  }

  // Marks finished requests' channels done and records them.
  void reap() {
    std::vector<Active> finished;
    {
      std::lock_guard<std::mutex> l(active_mu);
      for (size_t i = 0; i < active.size();) {
        if (active[i].req->done()) {
          finished.push_back(std::move(active[i]));
          active[i] = std::move(active.back());
          active.pop_back();
        } else {
          ++i;
        }
      }
    }
    for (Active& a : finished) {
      const GenerateResult r = a.req->result();
      {
        std::lock_guard<std::mutex> l(stats_mu);
        ++n_finished;
        ++finish_reasons[r.finish_reason];
        prompt_tokens += r.n_prompt();
        cached_tokens += std::max(r.n_cached, r.n_reused - r.n_recomputed);
        completion_tokens += int64_t(r.output_ids.size());
        ttft_sum_s += r.ttft_ms / 1000;
        queue_sum_s += r.queue_ms / 1000;
        e2e_sum_s += r.total_ms / 1000;
      }
      vllm.observe(r);
      in_flight.fetch_sub(1);
      {
        std::lock_guard<std::mutex> l(a.ch->mu);
        a.ch->done = true;
      }
      a.ch->cv.notify_all();
    }
  }

  // ---- connections -----------------------------------------------------------------------------

  void send_error(HttpConn& c, const std::string& endpoint, const ApiError& e) {
    server::Headers h;
    if (e.status == 503) h.push_back({"Retry-After", "1"});
    if (e.status == 401) h.push_back({"WWW-Authenticate", "Bearer"});
    c.send_response(e.status, "application/json", server::error_body(e), h);
    count(endpoint, e.status);
  }

  void send_json(HttpConn& c, const std::string& endpoint, int status, const ojson& body) {
    c.send_response(status, "application/json", json_text(body));
    count(endpoint, status);
  }

  // The tenant of the request: "anon" without keys, else the matching key's identity.
  std::string authenticate(const HttpRequest& r) {
    if (opt.api_keys.empty()) return "anon";
    const std::string auth = r.header("authorization");
    if (auth.empty())
      throw ApiError(401, "missing API key: send 'Authorization: Bearer <key>'", "", "missing_api_key");
    const std::string prefix = "Bearer ";
    if (auth.size() <= prefix.size() || auth.compare(0, prefix.size(), prefix) != 0)
      throw ApiError(401, "the Authorization header must be 'Bearer <key>'", "", "invalid_api_key");
    const std::string key = auth.substr(prefix.size());
    int match = -1;
    for (size_t i = 0; i < opt.api_keys.size(); ++i)
      if (same_secret(key, opt.api_keys[i])) match = int(i);
    if (match < 0) throw ApiError(401, "incorrect API key provided", "", "invalid_api_key");
    return "key" + std::to_string(match);
  }

  bool origin_allowed(const std::string& origin) const {
    for (const std::string& o : opt.allowed_origins)
      if (o == "*" || o == origin) return true;
    return false;
  }

  // One complete request (the HTTP layer read it). Keep-alive while both sides want it (HTTP/1.1's
  // default; HTTP/1.0 only with "Connection: keep-alive"); an idle connection is closed after
  // keep_alive_s by the layer.
  void serve_request(HttpConn& c, HttpRequest& r) {
    {
      const std::string conn = lower_ascii(r.header("connection"));
      const bool ka = r.version == "HTTP/1.1" ? conn.find("close") == std::string::npos
                                              : conn.find("keep-alive") != std::string::npos;
      c.set_keep_alive(ka && opt.keep_alive_s > 0 && !draining);
    }
    // CORS (--allowed-origins): the allowed origin is echoed on every response to it.
    const std::string origin = r.header("origin");
    const bool cors = !origin.empty() && origin_allowed(origin);
    if (cors) c.set_extra_headers({{"Access-Control-Allow-Origin", origin}, {"Vary", "Origin"}});
    if (r.method == "OPTIONS") {
      if (!origin.empty() && !cors) {
        send_error(c, "preflight", ApiError(403, "origin '" + origin + "' is not allowed (see --allowed-origins)", "",
                                            "origin_not_allowed"));
        return;
      }
      server::Headers h{{"Allow", "GET, POST, OPTIONS"}};
      if (cors) {
        const std::string req_headers = r.header("access-control-request-headers");
        h.push_back({"Access-Control-Allow-Methods", "GET, POST, OPTIONS"});
        h.push_back({"Access-Control-Allow-Headers", req_headers.empty() ? "Authorization, Content-Type" : req_headers});
        h.push_back({"Access-Control-Max-Age", "600"});
      }
      c.send_response(204, "", "", h);
      count("preflight", 204);
      return;
    }
    const double t_arrival = now_ms();
    t_log = LogInfo{};
    const std::string& path = r.path;
    std::string endpoint = path;
    try {
      if (path == "/health") {
        if (r.method != "GET") throw ApiError(405, "use GET " + path, "", "method_not_allowed");
        ojson h;
        h["status"] = draining ? "shutting_down" : "ok";
        send_json(c, endpoint, draining ? 503 : 200, h);
        return;
      }
      struct Route {
        const char* path;
        const char* method;
      };
      static const Route routes[] = {{"/v1/completions", "POST"}, {"/v1/chat/completions", "POST"}, {"/v1/warm", "POST"},
                                     {"/v1/models", "GET"},       {"/v1/stats", "GET"},             {"/metrics", "GET"},
                                     {"/tokenize", "POST"},       {"/detokenize", "POST"},          {"/v1/embeddings", "POST"}};
      const Route* route = nullptr;
      for (const Route& rt : routes)
        if (path == rt.path) route = &rt;
      const bool model_path = path.rfind("/v1/models/", 0) == 0;
      if (!route && !model_path) {
        endpoint = "unknown";
        throw ApiError(404, "no such endpoint: " + r.method + " " + path, "", "unknown_url");
      }
      if (model_path) endpoint = "/v1/models/{id}";
      const char* method = route ? route->method : "GET";
      if (r.method != method)
        throw ApiError(405, std::string("use ") + method + " " + path + " (got " + r.method + ")", "", "method_not_allowed");
      // --metrics-no-auth: /metrics without the API key (for a scraper on a private port).
      const std::string tenant = path == "/metrics" && opt.metrics_no_auth ? "anon" : authenticate(r);
      if (path == "/v1/models") {
        ojson list;
        list["object"] = "list";
        list["data"] = ojson::array({model_object()});
        send_json(c, endpoint, 200, list);
      } else if (model_path) {
        if (path.substr(11) != ctx.model_name)
          throw ApiError(404, "The model '" + path.substr(11) + "' does not exist", "model", "model_not_found");
        send_json(c, endpoint, 200, model_object());
      } else if (path == "/v1/stats") {
        send_json(c, endpoint, 200, stats_json());
      } else if (path == "/tokenize" || path == "/detokenize") {
        const ojson body = server::parse_body(r.body);
        send_json(c, endpoint, 200, path == "/tokenize" ? server::tokenize_json(body, ctx) : server::detokenize_json(body, ctx));
      } else if (path == "/v1/embeddings") {
        throw server::embeddings_error();
      } else if (path == "/metrics") {
        c.send_response(200, "text/plain; version=0.0.4; charset=utf-8", metrics_text());
        count(endpoint, 200);
      } else {
        const ojson body = server::parse_body(r.body);
        server::ParsedRequest p = path == "/v1/completions"        ? server::parse_completion(body, ctx)
                                  : path == "/v1/chat/completions" ? server::parse_chat(body, ctx)
                                                                   : server::parse_warm(body, ctx);
        generate(c, endpoint, p, tenant, t_arrival, path == "/v1/warm");
      }
    } catch (const ApiError& e) {
      send_error(c, endpoint, e);
    } catch (const std::exception& e) {
      send_error(c, endpoint, ApiError(500, std::string("internal error: ") + e.what(), "", "internal_error"));
    }
    if (opt.log_requests)
      std::fprintf(stderr, "%s\n",
                   server::request_log_line(r.method, endpoint, t_log.status, t_log.prompt, t_log.cached, t_log.completion,
                                            t_log.ttft_ms, now_ms() - t_arrival)
                       .c_str());
  }

  ojson model_object() const {
    ojson m;
    m["id"] = ctx.model_name;
    m["object"] = "model";
    m["created"] = created;
    m["owned_by"] = "kvboost";
    m["max_model_len"] = ctx.context_length;
    return m;
  }

  // ---- generation ------------------------------------------------------------------------------

  void generate(HttpConn& c, const std::string& endpoint, server::ParsedRequest& p, const std::string& tenant,
                double t_arrival, bool warm) {
    if (draining) throw ApiError(503, "the server is shutting down", "", "shutting_down");
    if (warm) {
      // Pinned chunks are bounded (--chunk-ram in all, --max-pinned-per-tenant each): a tenant at
      // its share is told so before any work is done.
      p.opt.reuse.pin_owner = tenant;
      if (const kv::ChunkStore* cs = engine.chunk_store()) {
        const size_t cap = cs->options().max_pinned_per_owner, have = cs->pinned_bytes(tenant);
        if (cap > 0 && have >= cap)
          throw ApiError(507,
                         "warm: this tenant's budget for pinned chunks is full (" + std::to_string(have) + " of " +
                             std::to_string(cap) + " bytes, --max-pinned-per-tenant); nothing more is pinned",
                         "", "pinned_budget_exceeded");
      }
    }
    if (p.n > 1 || !p.more_prompt_ids.empty()) return generate_multi(c, endpoint, p, tenant, t_arrival);
    // Admission control: running (max_batch) + waiting (max_queue) requests at most.
    const int64_t limit = engine.options().max_batch + opt.max_queue;
    if (in_flight.fetch_add(1) >= limit) {
      in_flight.fetch_sub(1);
      {
        std::lock_guard<std::mutex> l(stats_mu);
        ++rejected_overload;
      }
      throw ApiError(503, "the server is at capacity (" + std::to_string(limit) + " requests in flight); retry later",
                     "", "server_overloaded");
    }
    auto ch = std::make_shared<Channel>();
    p.opt.on_text = [ch](std::string_view s) {
      {
        std::lock_guard<std::mutex> l(ch->mu);
        ch->pending.append(s);
      }
      ch->cv.notify_all();
      return true;
    };
    if (p.stream && p.opt.logprobs >= 0)
      p.opt.on_logprob = [ch](const TokenLogprob& lp) {
        std::lock_guard<std::mutex> l(ch->mu);
        ch->pending_lp.push_back(lp);
      };
    // Tenants never share cache entries: the namespace is the key identity plus the client's salt.
    p.opt.cache_namespace = tenant + '\x1f' + p.cache_salt;
    std::shared_ptr<Request> req;
    try {
      req = engine.submit(p.prompt_ids, p.opt);
    } catch (const Error& e) {
      in_flight.fetch_sub(1);
      throw ApiError(400, e.what(), "", "invalid_request");
    }
    {
      std::lock_guard<std::mutex> l(active_mu);
      active.push_back({req, ch, warm});
    }
    wake_scheduler();

    const std::string id = server::make_id(p.chat ? "chatcmpl-" : "cmpl-");
    const int64_t created_s = int64_t(std::time(nullptr));
    const std::string& model = ctx.model_name;
    const double deadline = t_arrival + opt.timeout_s * 1000;
    bool streaming_ok = true;
    if (p.stream) {
      streaming_ok = c.begin_stream(200, "text/event-stream", {{"Cache-Control", "no-cache"}});
      if (streaming_ok && p.chat) {
        ojson delta;
        delta["role"] = "assistant";
        delta["content"] = "";
        streaming_ok = send_event(c, server::chat_chunk(id, created_s, model, delta, ""));
      }
      if (streaming_ok && p.echo && !p.prompt_text.empty())
        streaming_ok = send_event(c, server::completion_chunk(id, created_s, model, p.prompt_text, ""));
    }
    // Wait for text, forwarding it when streaming; watch the client and the deadline.
    const char* cancel_why = nullptr;
    std::vector<TokenLogprob> lps;  // streamed logprobs waiting for their text
    size_t text_offset = 0;
    std::optional<server::ToolCallStream> tools;  // chat with tools: content / tool_calls deltas
    if (p.chat && p.parse_tools) tools.emplace();
    for (;;) {
      std::string piece;
      bool done;
      {
        std::unique_lock<std::mutex> l(ch->mu);
        ch->cv.wait_for(l, std::chrono::milliseconds(25), [&] { return !ch->pending.empty() || ch->done; });
        piece.swap(ch->pending);
        lps.insert(lps.end(), std::make_move_iterator(ch->pending_lp.begin()), std::make_move_iterator(ch->pending_lp.end()));
        ch->pending_lp.clear();
        done = ch->done;
      }
      // Logprobs travel with the text their tokens produced; tokens whose text is still held back
      // (part of a UTF-8 character, a possible stop string) wait, and the rest goes out at the end.
      if (p.stream && streaming_ok && (!piece.empty() || (done && (!lps.empty() || tools)))) {
        ojson lp = nullptr;
        if (!lps.empty()) {
          lp = server::logprobs_json(lps, p.chat, *ctx.tok, text_offset);
          for (const TokenLogprob& t : lps) text_offset += ctx.tok->decode({t.id}, false).size();
          lps.clear();
        }
        if (tools) {
          for (const ojson& d : tools->push(piece, done)) {
            streaming_ok = streaming_ok && send_event(c, server::chat_chunk(id, created_s, model, d, "", lp));
            lp = nullptr;
          }
        } else {
          const ojson chunk = p.chat ? server::chat_chunk(id, created_s, model, ojson{{"content", piece}}, "", lp)
                                     : server::completion_chunk(id, created_s, model, piece, "", lp);
          streaming_ok = send_event(c, chunk);
        }
      }
      if (done) break;
      if (!streaming_ok || c.peer_closed()) {
        cancel_why = "disconnect";
        break;
      }
      if (now_ms() > deadline) {
        cancel_why = "timeout";
        break;
      }
      // Shutdown past its grace period. The scheduler counts a request out of in_flight just
      // before it marks the channel done, so stop() may get here first for a request that
      // finished: that one loops once more and ends normally.
      if (stopped && !req->done()) {
        cancel_why = "shutdown";
        break;
      }
    }
    GenerateResult res;
    if (!cancel_why) {
      res = req->result();
      log_result(res);
      if (res.finish_reason == "cancelled") cancel_why = "shutdown";  // cancelled by stop()
    }
    if (cancel_why) {
      req->cancel();
      wake_scheduler();
      {
        std::lock_guard<std::mutex> l(stats_mu);
        if (cancel_why[0] == 'd') ++cancel_disconnect;
        else if (cancel_why[0] == 't') ++cancel_timeout;
        else ++cancel_shutdown;
      }
      if (cancel_why[0] == 'd') {
        count(endpoint, 499);  // nginx's "client closed request"
        c.set_keep_alive(false);
        return;
      }
      const ApiError e = cancel_why[0] == 't'
                             ? ApiError(504, "the request did not finish within the server's timeout of " +
                                                 std::to_string(opt.timeout_s) + " s and was cancelled",
                                        "", "timeout")
                             : ApiError(503, "the server shut down before the request finished", "", "shutting_down");
      if (p.stream) {
        send_event(c, ojson::parse(server::error_body(e)));
        c.send_chunk("data: [DONE]\n\n");
        c.end_stream();
        count(endpoint, e.status);
      } else {
        send_error(c, endpoint, e);
      }
      return;
    }
    if (res.finish_reason == "error") {
      const ApiError e(500, "generation failed: " + res.error, "", "generation_error");
      if (p.stream) {
        send_event(c, ojson::parse(server::error_body(e)));
        c.send_chunk("data: [DONE]\n\n");
        c.end_stream();
        count(endpoint, 500);
      } else {
        send_error(c, endpoint, e);
      }
      return;
    }
    if (warm && res.n_pin_refused > 0) {
      const kv::ChunkStore* cs = engine.chunk_store();
      std::string why = "warm: " + std::to_string(res.n_pin_refused) + " chunk(s) could not be pinned: the pin budget is full";
      if (cs) {
        const size_t cap = cs->options().max_pinned_per_owner;
        why += " (this tenant " + std::to_string(cs->pinned_bytes(tenant)) + " bytes pinned";
        if (cap) why += " of " + std::to_string(cap) + " (--max-pinned-per-tenant)";
        why += "; the server " + std::to_string(cs->stats().pinned_bytes) + " of " + std::to_string(cs->options().ram_bytes) +
               " (--chunk-ram)); the chunks are cached unpinned";
      }
      send_error(c, endpoint, ApiError(507, why, "", "pinned_budget_exceeded"));
      return;
    }
    if (warm) {
      if (kv::ChunkStore* cs = engine.chunk_store()) cs->flush();  // disk tier written before we answer
      ojson w;
      w["object"] = "warm";
      w["model"] = model;
      w["prompt_tokens"] = res.n_prompt();
      w["cached_tokens"] = server::usage_json(res)["prompt_tokens_details"]["cached_tokens"];
      w["prefill_ms"] = res.prefill_ms;
      w["kvboost"] = server::kvboost_json(res);
      send_json(c, endpoint, 200, w);
      return;
    }
    if (!p.stream) {
      send_json(c, endpoint, 200, server::completion_body(id, created_s, model, p, res, ctx.tok));
      return;
    }
    const std::string fr = tools && tools->n_calls() ? "tool_calls" : server::finish_reason_of(res);
    send_event(c, p.chat ? server::chat_chunk(id, created_s, model, ojson::object(), fr)
                         : server::completion_chunk(id, created_s, model, "", fr));
    if (p.include_usage) send_event(c, server::usage_chunk(id, created_s, model, p.chat, res));
    c.send_chunk("data: [DONE]\n\n");
    c.end_stream();
    count(endpoint, 200);
  }

  bool send_event(HttpConn& c, const ojson& j) { return c.send_chunk("data: " + json_text(j) + "\n\n"); }

  void generate_multi(HttpConn& c, const std::string& endpoint, server::ParsedRequest& p, const std::string& tenant,
                      double t_arrival);

  // ---- statistics ------------------------------------------------------------------------------

  ojson stats_json() {
    const kv::KvStats kv = engine.kv_stats();
    ojson s;
    s["model"] = ctx.model_name;
    s["uptime_s"] = (now_ms() - t_start) / 1000;
    ojson q;
    q["in_flight"] = in_flight.load();
    q["running"] = n_running.load();
    q["waiting"] = n_waiting.load();
    q["max_batch"] = engine.options().max_batch;
    q["max_queue"] = opt.max_queue;
    s["queue"] = q;
    ojson k;
    k["block_size"] = engine.kv_block_size();
    k["blocks_total"] = kv.n_blocks;
    k["blocks_used"] = kv.blocks_used;
    k["blocks_free"] = kv.blocks_free;
    k["blocks_cached"] = kv.blocks_cached;
    k["blocks_cold"] = kv.blocks_cold;
    k["prefix_queries"] = kv.n_queries;
    k["prefix_query_tokens"] = kv.query_tokens;
    k["prefix_hit_tokens"] = kv.hit_tokens;
    k["prefix_hit_rate"] = kv.hit_rate();
    k["evictions"] = kv.evictions;
    k["spills"] = kv.spills;
    k["page_ins"] = kv.page_ins;
    s["kv"] = k;
    if (const kv::ChunkStore* cs = engine.chunk_store()) {
      const kv::ChunkStats c = cs->stats();
      ojson ck;
      ck["entries"] = c.entries;
      ck["entries_ram"] = c.entries_ram;
      ck["entries_disk"] = c.entries_disk;
      ck["pinned"] = c.pinned;
      ck["pinned_bytes"] = c.pinned_bytes;
      ck["pins_refused"] = c.pins_refused;
      ck["bytes_ram"] = c.bytes_ram;
      ck["bytes_disk"] = c.bytes_disk;
      ck["lookups"] = c.lookups;
      ck["prefix_hits"] = c.prefix_hits;
      ck["content_hits"] = c.content_hits;
      ck["hit_rate"] = c.hit_rate();
      ck["disk_loads"] = c.disk_loads;
      ck["corrupt"] = c.corrupt;
      ck["stores"] = c.stores;
      ck["evictions_ram"] = c.evictions_ram;
      ck["evictions_disk"] = c.evictions_disk;
      if (c.remote.enabled) ck["remote"] = server::remote_stats_json(c.remote);
      s["chunks"] = ck;
    }
    std::lock_guard<std::mutex> l(stats_mu);
    ojson rq;
    rq["finished"] = n_finished;
    ojson fr = ojson::object();
    for (const auto& [name, n] : finish_reasons) fr[name] = n;
    rq["finish_reasons"] = fr;
    rq["rejected_overload"] = rejected_overload;
    rq["cancelled_disconnect"] = cancel_disconnect;
    rq["cancelled_timeout"] = cancel_timeout;
    rq["cancelled_shutdown"] = cancel_shutdown;
    ojson by = ojson::object();
    for (const auto& [key, n] : responses) by[key.first][std::to_string(key.second)] = n;
    rq["responses"] = by;
    s["requests"] = rq;
    ojson t;
    t["prompt"] = prompt_tokens;
    t["cached"] = cached_tokens;
    t["cache_hit_rate"] = prompt_tokens ? double(cached_tokens) / double(prompt_tokens) : 0.0;
    t["completion"] = completion_tokens;
    s["tokens"] = t;
    const auto [dr, pr] = window.rates(int64_t(now_ms() / 1000));
    const double up = (now_ms() - t_start) / 1000;
    ojson th;
    th["decode_tok_per_s_10s"] = dr;
    th["prefill_tok_per_s_10s"] = pr;
    th["completion_tok_per_s_avg"] = up > 0 ? double(completion_tokens) / up : 0.0;
    th["steps"] = n_steps;
    th["mean_ttft_ms"] = n_finished ? 1000 * ttft_sum_s / double(n_finished) : 0.0;
    th["mean_queue_ms"] = n_finished ? 1000 * queue_sum_s / double(n_finished) : 0.0;
    s["throughput"] = th;
    ojson pr_;
    pr_["rss_bytes"] = process_rss_bytes();
    {
      pr_["open_connections"] = http ? http->open_connections() : 0;
      pr_["connections_refused"] = http ? http->refused() : 0;
    }
    s["process"] = pr_;
    return s;
  }

  std::string metrics_text() {
    const kv::KvStats kv = engine.kv_stats();
    const Engine::SpecStats spec = engine.spec_stats();
    std::ostringstream o;
    auto metric = [&](const char* name, const char* type, const char* help) {
      o << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
    };
    std::lock_guard<std::mutex> l(stats_mu);
    metric("kvboost_http_responses_total", "counter", "HTTP responses by endpoint and status (499: client went away).");
    for (const auto& [key, n] : responses)
      o << "kvboost_http_responses_total{endpoint=\"" << key.first << "\",status=\"" << key.second << "\"} " << n << '\n';
    metric("kvboost_requests_finished_total", "counter", "Generation requests finished, by engine finish reason.");
    for (const auto& [name, n] : finish_reasons) o << "kvboost_requests_finished_total{reason=\"" << name << "\"} " << n << '\n';
    metric("kvboost_requests_cancelled_total", "counter", "Requests cancelled by the server, by cause.");
    o << "kvboost_requests_cancelled_total{cause=\"disconnect\"} " << cancel_disconnect << '\n'
      << "kvboost_requests_cancelled_total{cause=\"timeout\"} " << cancel_timeout << '\n'
      << "kvboost_requests_cancelled_total{cause=\"shutdown\"} " << cancel_shutdown << '\n';
    metric("kvboost_requests_rejected_total", "counter", "Requests answered 503 because the queue was full.");
    o << "kvboost_requests_rejected_total " << rejected_overload << '\n';
    metric("kvboost_requests_in_flight", "gauge", "Generation requests submitted and not finished.");
    o << "kvboost_requests_in_flight " << in_flight.load() << '\n';
    metric("kvboost_requests_running", "gauge", "Requests in the running batch after the last step.");
    o << "kvboost_requests_running " << n_running.load() << '\n';
    metric("kvboost_requests_waiting", "gauge", "Requests waiting for admission after the last step.");
    o << "kvboost_requests_waiting " << n_waiting.load() << '\n';
    metric("kvboost_prompt_tokens_total", "counter", "Prompt tokens of finished requests.");
    o << "kvboost_prompt_tokens_total " << prompt_tokens << '\n';
    metric("kvboost_cached_prompt_tokens_total", "counter", "Prompt tokens whose K/V came from a cache.");
    o << "kvboost_cached_prompt_tokens_total " << cached_tokens << '\n';
    metric("kvboost_generation_tokens_total", "counter", "Tokens generated by finished requests.");
    o << "kvboost_generation_tokens_total " << completion_tokens << '\n';
    metric("kvboost_engine_steps_total", "counter", "Engine scheduling steps (forward passes).");
    o << "kvboost_engine_steps_total " << n_steps << '\n';
    metric("kvboost_engine_decode_tokens_total", "counter", "Decode tokens computed by engine steps.");
    o << "kvboost_engine_decode_tokens_total " << step_decode_tokens << '\n';
    metric("kvboost_engine_prefill_tokens_total", "counter", "Prompt tokens computed by engine steps.");
    o << "kvboost_engine_prefill_tokens_total " << step_prefill_tokens << '\n';
    metric("kvboost_time_to_first_token_seconds", "summary", "Time to first token of finished requests.");
    o << "kvboost_time_to_first_token_seconds_sum " << ttft_sum_s << "\nkvboost_time_to_first_token_seconds_count "
      << n_finished << '\n';
    metric("kvboost_request_duration_seconds", "summary", "Submit-to-finish time of finished requests.");
    o << "kvboost_request_duration_seconds_sum " << e2e_sum_s << "\nkvboost_request_duration_seconds_count " << n_finished
      << '\n';
    metric("kvboost_spec_draft_tokens_total", "counter", "Speculative decoding: tokens drafted and verified.");
    o << "kvboost_spec_draft_tokens_total " << spec.drafted << '\n';
    metric("kvboost_spec_accepted_tokens_total", "counter", "Speculative decoding: drafted tokens accepted.");
    o << "kvboost_spec_accepted_tokens_total " << spec.accepted << '\n';
    metric("kvboost_spec_verify_passes_total", "counter", "Speculative decoding: verification passes.");
    o << "kvboost_spec_verify_passes_total " << spec.passes << '\n';
    metric("kvboost_spec_verify_tokens_total", "counter", "Speculative decoding: tokens emitted by verification passes.");
    o << "kvboost_spec_verify_tokens_total " << spec.tokens << '\n';
    metric("kvboost_kv_blocks", "gauge", "KV blocks by state (cached blocks may also be used or free).");
    o << "kvboost_kv_blocks{state=\"total\"} " << kv.n_blocks << "\nkvboost_kv_blocks{state=\"used\"} " << kv.blocks_used
      << "\nkvboost_kv_blocks{state=\"free\"} " << kv.blocks_free << "\nkvboost_kv_blocks{state=\"cached\"} "
      << kv.blocks_cached << "\nkvboost_kv_blocks{state=\"cold\"} " << kv.blocks_cold << '\n';
    metric("kvboost_prefix_cache_query_tokens_total", "counter", "Prompt tokens looked up in the prefix cache.");
    o << "kvboost_prefix_cache_query_tokens_total " << kv.query_tokens << '\n';
    metric("kvboost_prefix_cache_hit_tokens_total", "counter", "Prompt tokens found in the prefix cache.");
    o << "kvboost_prefix_cache_hit_tokens_total " << kv.hit_tokens << '\n';
    metric("kvboost_kv_evictions_total", "counter", "Cached KV blocks evicted.");
    o << "kvboost_kv_evictions_total " << kv.evictions << '\n';
    metric("kvboost_kv_spills_total", "counter", "KV blocks spilled to the cold tier.");
    o << "kvboost_kv_spills_total " << kv.spills << '\n';
    metric("kvboost_kv_page_ins_total", "counter", "KV blocks paged back from the cold tier.");
    o << "kvboost_kv_page_ins_total " << kv.page_ins << '\n';
    if (const kv::ChunkStore* cs = engine.chunk_store()) {
      const kv::ChunkStats c = cs->stats();
      metric("kvboost_chunk_store_entries", "gauge", "Chunks in the chunk store, by tier.");
      o << "kvboost_chunk_store_entries{tier=\"ram\"} " << c.entries_ram << "\nkvboost_chunk_store_entries{tier=\"disk\"} "
        << c.entries_disk << '\n';
      metric("kvboost_chunk_store_bytes", "gauge", "Bytes held by the chunk store, by tier.");
      o << "kvboost_chunk_store_bytes{tier=\"ram\"} " << c.bytes_ram << "\nkvboost_chunk_store_bytes{tier=\"disk\"} "
        << c.bytes_disk << '\n';
      metric("kvboost_chunk_store_lookups_total", "counter", "Chunk lookups.");
      o << "kvboost_chunk_store_lookups_total " << c.lookups << '\n';
      metric("kvboost_chunk_store_hits_total", "counter", "Chunk hits, by kind (prefix: exact; content: another position).");
      o << "kvboost_chunk_store_hits_total{kind=\"prefix\"} " << c.prefix_hits << "\nkvboost_chunk_store_hits_total{kind=\"content\"} "
        << c.content_hits << '\n';
      metric("kvboost_chunk_store_evictions_total", "counter", "Chunks evicted, by tier.");
      o << "kvboost_chunk_store_evictions_total{tier=\"ram\"} " << c.evictions_ram << "\nkvboost_chunk_store_evictions_total{tier=\"disk\"} "
        << c.evictions_disk << '\n';
      if (c.remote.enabled) o << server::remote_metrics_text(c.remote);
    }
    metric("kvboost_process_resident_memory_bytes", "gauge", "Resident set size of the server process.");
    o << "kvboost_process_resident_memory_bytes " << process_rss_bytes() << '\n';
    const kv::ChunkStats cstats = engine.chunk_store() ? engine.chunk_store()->stats() : kv::ChunkStats{};
    o << vllm.text(ctx.model_name, kv, engine.chunk_store() ? &cstats : nullptr, n_running.load(), n_waiting.load());
    return o.str();
  }
};

// ---- Server ------------------------------------------------------------------------------------

Server::Server(Engine& engine, ServerOptions opt) : impl_(std::make_unique<Impl>(engine, std::move(opt))) {
  Impl& s = *impl_;
  if (s.opt.max_queue < 0) fail("max_queue ", s.opt.max_queue, " must be >= 0");
  if (s.opt.max_connections < 1) fail("max_connections ", s.opt.max_connections, " must be >= 1");
  if (s.opt.max_connections_per_client < 1)
    fail("max_connections_per_client ", s.opt.max_connections_per_client, " must be >= 1");
  if (!(s.opt.header_timeout_s > 0) || !(s.opt.body_timeout_s > 0))
    fail("header/body timeouts must be positive (", s.opt.header_timeout_s, " s, ", s.opt.body_timeout_s, " s)");
  if (!(s.opt.timeout_s > 0)) fail("timeout ", s.opt.timeout_s, " s must be positive");
  s.ctx.tok = &engine.tokenizer();
  s.ctx.context_length = engine.context_length();
  s.ctx.max_prompt_tokens = s.opt.max_prompt_tokens > 0 ? std::min(s.opt.max_prompt_tokens, s.ctx.context_length - 1)
                                                        : s.ctx.context_length - 1;
  s.ctx.vocab_size = int32_t(engine.model().config().vocab_size);
  s.ctx.n_layers = int64_t(engine.model().config().n_layers);
  std::string name = s.opt.model_name;
  if (name.empty()) {
    std::string d = s.opt.model_dir;
    while (d.size() > 1 && d.back() == '/') d.pop_back();
    const size_t slash = d.find_last_of('/');
    name = slash == std::string::npos ? d : d.substr(slash + 1);
    if (name.empty()) name = "kvboost";
  }
  s.ctx.model_name = name;
  if (!s.opt.chat_config.empty()) {
    s.ctx.chat_config = s.opt.chat_config;
    chat_template_source(s.ctx.chat_config);  // throws Error when it holds no template
    s.ctx.has_chat_template = true;
  } else if (!s.opt.model_dir.empty()) {
    std::string dir = s.opt.model_dir;
    if (dir.size() > 5 && dir.compare(dir.size() - 5, 5, ".gguf") == 0) {
      const size_t slash = dir.find_last_of('/');
      dir = slash == std::string::npos ? "." : dir.substr(0, slash);
    }
    const std::string cfg = dir + "/tokenizer_config.json";
    if (file_exists(cfg)) {
      s.ctx.chat_config = read_file(cfg);
      try {
        chat_template_source(s.ctx.chat_config);
        s.ctx.has_chat_template = true;
      } catch (const Error&) {
        s.ctx.has_chat_template = false;
      }
    }
  }
}

Server::~Server() { stop(); }

void Server::start() {
  Impl& s = *impl_;
  if (s.started.exchange(true)) fail("the server is already started");
  server::HttpServerOptions ho;
  ho.max_body_bytes = s.opt.max_body_bytes;
  ho.header_timeout_ms = std::max(1, int(s.opt.header_timeout_s * 1000));
  ho.body_timeout_ms = std::max(1, int(s.opt.body_timeout_s * 1000));
  ho.keep_alive_ms = int(s.opt.keep_alive_s * 1000);
  ho.max_connections = s.opt.max_connections;
  ho.max_connections_per_client = s.opt.max_connections_per_client;
  // Every request that may be admitted (running + waiting) has its handler thread, plus a few for
  // quick endpoints (/health, /metrics) so they never wait behind streams.
  ho.n_workers = int(std::min<int64_t>(4096, s.engine.options().max_batch + s.opt.max_queue + 8));
  ho.error_body = [](int status, const std::string& why, const std::string& code) {
    return server::error_body(ApiError(status, why, "", code));
  };
  ho.on_error = [&s](int status) { s.count(status == 429 || status == 503 ? "connection" : "http", status); };
  s.http = std::make_unique<server::HttpServer>(ho, [&s](HttpConn& c, HttpRequest& r) {
    try {
      s.serve_request(c, r);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "kvboost serve: connection failed: %s\n", e.what());
      c.set_keep_alive(false);
    }
  });
  s.http->bind(s.opt.host, s.opt.port);
  s.sched_thread = std::thread([&s] { s.scheduler_loop(); });
  s.http->start();
}

int Server::port() const { return impl_->http ? impl_->http->port() : 0; }

void Server::stop() {
  Impl& s = *impl_;
  if (!s.started || s.stopped.load() || s.draining.exchange(true)) return;
  // 1. No new connections; new requests on open connections get 503.
  s.http->stop_accepting();
  // 2. In-flight requests get the grace period to finish.
  const double deadline = now_ms() + s.opt.shutdown_grace_s * 1000;
  while (s.in_flight.load() > 0 && now_ms() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  // 3. Then they are cancelled; connection threads answer and exit.
  s.stopped = true;
  {
    std::lock_guard<std::mutex> l(s.active_mu);
    for (Active& a : s.active) a.req->cancel();
  }
  s.wake_scheduler();
  s.http->stop();  // handlers answer and return; idle connections close
  {
    std::lock_guard<std::mutex> l(s.sched_mu);
    s.sched_stop = true;
  }
  s.sched_cv.notify_one();
  if (s.sched_thread.joinable()) s.sched_thread.join();
}

#include "server_multi.inc"

}  // namespace kvboost
