// The server: construction, start/stop and the scheduler thread (the layout: server_impl.h).
#include "server_impl.h"

#include <chrono>
#include <cstdio>
#include <fstream>

#include "kvboost/chat.h"

namespace kvboost {

using namespace server_detail;

namespace server_detail {

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

thread_local LogInfo t_log;

void log_result(const GenerateResult& r) {
  t_log.prompt += r.n_prompt();
  t_log.cached += std::max<int64_t>(0, std::max(r.n_cached, r.n_reused - r.n_recomputed));
  t_log.completion += int64_t(r.output_ids.size());
  if (t_log.ttft_ms == 0) t_log.ttft_ms = r.ttft_ms;
}

}  // namespace server_detail

void Server::Impl::wake_scheduler() {
  {
    std::lock_guard<std::mutex> l(sched_mu);
    sched_wake = true;
  }
  sched_cv.notify_one();
}

void Server::Impl::count(const std::string& endpoint, int status) {
  t_log.status = status;
  std::lock_guard<std::mutex> l(stats_mu);
  ++responses[{endpoint, status}];
}

void Server::Impl::scheduler_loop() {
  bool idle_pending = true;
  for (;;) {
    {
      std::unique_lock<std::mutex> l(sched_mu);
      // The timeout is a safety net: a request finished by another thread's step (Engine::generate
      // callers) is still reaped.
      // Idle: the engine's idle work (committing the KV memory the next requests will write) in
      // slices, looking for requests between them; the wait only when it has none left.
      const auto wait = idle_pending ? std::chrono::milliseconds(0) : std::chrono::milliseconds(50);
      sched_cv.wait_for(l, wait, [&] { return sched_stop || sched_wake || engine.has_work(); });
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
    idle_pending = false;
    if (!stepped && !sched_stop) {
      try {
        idle_pending = engine.idle_work();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "kvboost serve: idle work failed: %s\n", e.what());
      }
    }
    if (stepped && opt.step_delay_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(opt.step_delay_ms));
  }
}

// Marks finished requests' channels done and records them.
void Server::Impl::reap() {
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

}  // namespace kvboost
