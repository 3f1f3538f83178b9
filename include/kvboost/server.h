// kvboost/server.h — an OpenAI-compatible HTTP server over one Engine (continuous batching).
// Uses kvboost/runtime.h and kvboost/chat.h.
//
// Endpoints: POST /v1/completions, POST /v1/chat/completions (streaming with Server-Sent
// Events), GET /v1/models, GET /health, GET /v1/stats, POST /v1/warm, GET /metrics (Prometheus).
// Threads: one HTTP event loop (reads and parses every connection), a bounded pool of handler
// threads (complete requests only), and one scheduler thread that alone calls Engine::step();
// handlers submit requests and stream from a per-request queue that the engine's on_text
// callback fills.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvboost/runtime.h"

namespace kvboost {

struct ServerOptions {
  std::string host = "127.0.0.1";  // loopback unless asked otherwise
  int port = 8000;                 // 0: an ephemeral port (see Server::port())
  // Bearer keys; empty = no authentication. Each key is a tenant: its requests' prefix-cache
  // namespace starts with the key's identity, so tenants never share (or time) each other's cache.
  std::vector<std::string> api_keys;
  std::string model_name;          // the id /v1/models reports and requests must name ("" = dir name)
  std::string model_dir;           // its tokenizer_config.json gives the chat template
  // A tokenizer_config.json text whose chat_template /v1/chat/completions renders, instead of
  // model_dir's (kvboost serve --chat-template, or a GGUF's own template); "" = model_dir's.
  std::string chat_config;
  size_t max_body_bytes = 8u << 20;  // larger request bodies: 413
  int64_t max_prompt_tokens = 0;     // 0 = the context length - 1
  int64_t max_queue = 64;            // requests waiting beyond those running; more: 503
  int max_connections = 4096;        // open connections; at the cap the oldest idle (or still
                                     // sending headers) is closed for a new one, else 503
  int max_connections_per_client = 128;  // per client IP address; more: 429 at once
  double header_timeout_s = 10;      // first byte of a request -> end of its headers; then 408
  double body_timeout_s = 10;        // end of headers -> end of the body; then 408
  // CORS: origins whose browser pages may call the API ("*": any); empty: no CORS headers.
  std::vector<std::string> allowed_origins;
  double keep_alive_s = 5;           // an idle persistent connection is closed after this; 0: one
                                     // request per connection
  double timeout_s = 600;            // per request, from arrival to last token; then cancelled
  double shutdown_grace_s = 30;      // stop(): in-flight requests get this long to finish
  bool log_requests = false;         // one line per request on stderr
  bool metrics_no_auth = false;      // GET /metrics without the API key (a private scrape port)
  // Testing: the scheduler pauses this long after each engine step (a slow model on demand, so
  // that tests of overload, cancellation and timeouts do not depend on the machine's speed).
  double step_delay_ms = 0;
};

class Server {
 public:
  // The engine must outlive the server. Reads the chat template (if any) from model_dir.
  Server(Engine& engine, ServerOptions opt);
  ~Server();  // stop()s
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds and starts serving on background threads. Throws Error when it cannot bind.
  void start();
  int port() const;  // the bound port (after start)
  // Graceful shutdown: stop accepting, answer new requests 503, let in-flight requests finish
  // within shutdown_grace_s (then cancel them), join every thread. Idempotent.
  void stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvboost
