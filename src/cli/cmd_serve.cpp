// kvboost serve: the OpenAI-compatible HTTP server. Runs until SIGINT/SIGTERM, then shuts down
// gracefully (in-flight requests finish within --shutdown-grace seconds or are cancelled) and
// exits 0.
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>

#include "cli_util.h"
#include "kvboost/hub.h"
#include "kvboost/server.h"

namespace kvboost::cli {

namespace {
struct ServeArgs {
  std::string model, host = "127.0.0.1", api_key_file, served_name;
  std::vector<std::string> api_keys;
  int port = 8000;
  int64_t max_batch = 16, max_queue = 64, prefill_chunk = 512, max_prompt_tokens = 0;
  double timeout_s = 600, grace_s = 30, keep_alive_s = 5;
  std::string max_body = "8MiB";
  int threads = 0;
  int64_t block_size = 16;
  std::string kv_budget, cold_dir, cold_host_budget;
  int64_t kv_prefault = EngineOptions{}.kv_prefault_tokens;
  std::string weight_budget = "0";
  std::string vram_budget = "0";
  std::string head_quant = "auto";
  std::string device = "cpu";
  int tp = 1;
  ChunkArgs chunks;
  SpecArgs spec;
  bool quiet = false, log_requests = false, metrics_no_auth = false;
  int64_t ctx_size = 0;
  std::string chat_template;
  // Hostile clients (docs/reliability.md).
  int max_connections = 4096, max_connections_per_client = 128;
  double header_timeout_s = 10, body_timeout_s = 10;
  std::string allowed_origins;
  std::string max_pinned_per_tenant = "0";
};

// A server runs many sequences at once: by default room for max_batch whole contexts (the
// engine's own default is one), at most 2 GiB. Reserved, committed only as blocks are used.
size_t default_kv_budget(const std::string& dir, int64_t max_batch, int64_t block_size) {
  try {
    const std::string gguf = gguf_model_file(dir);
    const ModelConfig c = gguf.empty() ? ModelConfig::from_dir(dir) : ModelConfig::from_gguf(gguf);
    const double per_token = double(2 * c.n_layers * c.n_kv_heads * c.head_dim) * sizeof(float);
    const double want = per_token * double(c.max_position_embeddings + block_size) * double(max_batch);
    return size_t(std::min(want, double(size_t(2) << 30)));
  } catch (const Error&) {
    return 0;  // the engine's default; Engine::load reports the real problem
  }
}

void run_serve(const ServeArgs& a) {
  if (a.threads > 0) set_num_threads(a.threads);
  // Signals are taken synchronously by this thread (sigwait); every thread started from here on
  // inherits the blocked mask, so none of them is interrupted.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);

  parse_head_quant(a.head_quant, "--head-quant");  // a bad flag is reported before a missing model
  const kernels::Device device = parse_device_flag(a.device);
  const uint64_t vram_budget = parse_vram_budget(a.vram_budget, device);
  const std::string dir = resolve_model_dir(a.model, a.quiet);
  EngineOptions eopt;
  eopt.block_size = a.block_size;
  eopt.max_batch = a.max_batch;
  eopt.prefill_chunk = a.prefill_chunk;
  if (!a.kv_budget.empty()) eopt.kv_budget_bytes = parse_bytes(a.kv_budget, "--kv-budget");
  else if (a.ctx_size > 0) eopt.kv_budget_bytes = kv_bytes_for_tokens(dir, a.ctx_size, a.block_size);
  else eopt.kv_budget_bytes = default_kv_budget(dir, a.max_batch, a.block_size);
  if (a.kv_prefault < 0) fail("--kv-prefault ", a.kv_prefault, ": expected a token count >= 0 (0: off)");
  eopt.kv_prefault_tokens = a.kv_prefault;

  eopt.cold_dir = a.cold_dir;
  if (!a.cold_host_budget.empty())
    eopt.cold_host_bytes = a.cold_host_budget == "0" ? 0 : parse_bytes(a.cold_host_budget, "--cold-host-budget");
  eopt.load.weight_budget = parse_weight_budget(a.weight_budget);
  eopt.load.head_quant = parse_head_quant(a.head_quant, "--head-quant");
  eopt.load.device = device;
  eopt.load.vram_budget = vram_budget;
  eopt.tp = a.tp;
  a.chunks.apply(eopt);
  eopt.chunk_store.max_pinned_per_owner =
      a.max_pinned_per_tenant == "0" ? 0 : parse_bytes(a.max_pinned_per_tenant, "--max-pinned-per-tenant");
  a.spec.apply(eopt);
  auto engine = load_engine(dir, a.quiet, eopt);
  // --chat-template, or the GGUF's own template when no tokenizer_config.json lies beside it.
  const std::string chat_cfg = chat_config_for(dir, a.chat_template, /*require=*/false);

  ServerOptions so;
  so.host = a.host;
  so.port = a.port;
  so.api_keys = a.api_keys;
  if (!a.api_key_file.empty()) {
    std::ifstream f(a.api_key_file);
    if (!f) fail("--api-key-file: cannot read ", a.api_key_file);
    for (std::string line; std::getline(f, line);)
      if (!line.empty() && line[0] != '#') so.api_keys.push_back(line);
  }
  if (const char* k = std::getenv("KVBOOST_API_KEY"); k && *k && so.api_keys.empty()) so.api_keys.push_back(k);
  so.model_name = a.served_name;
  if (so.model_name.empty() && !a.model.empty()) so.model_name = resolve_model(a.model).hub_id;  // a Hub id's name
  so.model_dir = dir;
  so.chat_config = chat_cfg;
  so.max_body_bytes = parse_bytes(a.max_body, "--max-body");
  so.max_prompt_tokens = a.max_prompt_tokens;
  so.max_queue = a.max_queue;
  so.timeout_s = a.timeout_s;
  so.keep_alive_s = a.keep_alive_s;
  so.shutdown_grace_s = a.grace_s;
  so.log_requests = a.log_requests;
  so.metrics_no_auth = a.metrics_no_auth;
  so.max_connections = a.max_connections;
  so.max_connections_per_client = a.max_connections_per_client;
  so.header_timeout_s = a.header_timeout_s;
  so.body_timeout_s = a.body_timeout_s;
  for (size_t p = 0; p < a.allowed_origins.size();) {
    size_t q = a.allowed_origins.find(',', p);
    if (q == std::string::npos) q = a.allowed_origins.size();
    std::string o = a.allowed_origins.substr(p, q - p);
    while (!o.empty() && o.front() == ' ') o.erase(0, 1);
    while (!o.empty() && o.back() == ' ') o.pop_back();
    if (!o.empty()) so.allowed_origins.push_back(o);
    p = q + 1;
  }
  Server server(*engine, so);
  server.start();
  if (!a.quiet)
    std::fprintf(stderr, "kvboost serve: listening on http://%s:%d/v1 (model %s, max batch %lld, queue %lld%s)\n",
                 a.host.c_str(), server.port(), dir.c_str(), (long long)a.max_batch, (long long)a.max_queue,
                 so.api_keys.empty() ? ", no API key" : ", API key required");
  std::fflush(stderr);
  int sig = 0;
  sigwait(&set, &sig);
  if (!a.quiet) std::fprintf(stderr, "kvboost serve: %s: shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
  server.stop();
  if (!a.quiet) std::fprintf(stderr, "kvboost serve: stopped\n");
}
}  // namespace

void add_serve(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* c = app.add_subcommand("serve", "Serve the model over an OpenAI-compatible HTTP API");
  c->add_option("-m,--model", a->model, "Model directory, .gguf file or Hugging Face id ORG/NAME[@REV] (default: the generated demo model)");
  c->add_option("--host", a->host, "Address to bind (default: loopback only)")->capture_default_str();
  c->add_option("--port", a->port, "TCP port (0: any free port)")->capture_default_str()->check(CLI::Range(0, 65535));
  c->add_option("--api-key", a->api_keys,
                "Require 'Authorization: Bearer KEY' (repeatable: each key is a tenant with its own cache namespace; "
                "also $KVBOOST_API_KEY)");
  c->add_option("--api-key-file", a->api_key_file, "Read API keys from this file, one per line");
  c->add_option("--served-model-name", a->served_name, "Model id clients use (default: the directory's name)");
  c->add_option("--max-batch", a->max_batch, "Requests decoded together")->capture_default_str()->check(CLI::PositiveNumber);
  c->add_option("--max-queue", a->max_queue, "Requests waiting beyond the running batch; more are answered 503")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  c->add_option("--prefill-chunk", a->prefill_chunk, "Prompt tokens prefilled per step")->capture_default_str()->check(CLI::PositiveNumber);
  c->add_option("--max-prompt-tokens", a->max_prompt_tokens, "Longest prompt accepted (0: the context length - 1)")
      ->capture_default_str();
  c->add_option("--max-body", a->max_body, "Largest request body (larger: 413)")->capture_default_str();
  c->add_option("--keep-alive", a->keep_alive_s, "Seconds an idle persistent connection stays open (0: one request per connection)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  c->add_option("--timeout", a->timeout_s, "Seconds a request may take before it is cancelled")->capture_default_str()->check(CLI::PositiveNumber);
  c->add_option("--shutdown-grace", a->grace_s, "Seconds in-flight requests get to finish on SIGINT/SIGTERM")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  c->add_option("-t,--threads", a->threads, "Worker threads (default: all cores)");
  c->add_option("-c,--ctx-size", a->ctx_size,
                "KV memory for this many tokens, shared by all requests (llama.cpp's -c; default: --max-batch whole contexts)")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--chat-template", a->chat_template, kChatTemplateHelp);
  c->add_option("--block-size", a->block_size, "Tokens per KV block")->capture_default_str()->check(CLI::PositiveNumber);
  c->add_option("--kv-budget", a->kv_budget, "Bytes of KV memory, e.g. 512MiB (default: max-batch whole contexts, at most 2GiB)");
  c->add_option("--kv-cold-dir", a->cold_dir, "Spill KV blocks beyond --kv-budget to a file in this directory");
  c->add_option("--cold-host-budget", a->cold_host_budget, "With --device cuda and --kv-cold-dir: pinned host memory for spilled KV blocks before the files, e.g. 2GiB (default 1GiB; 0: straight to the files)");
  c->add_option("--kv-prefault", a->kv_prefault,
                "Tokens of KV memory kept committed ahead of use, in idle time, so new requests do not fault pages in "
                "(default 8192; 0: commit only on use)");
  c->add_option("--weight-budget", a->weight_budget, kWeightBudgetHelp);
  c->add_option("--head-quant", a->head_quant, kHeadQuantHelp)->capture_default_str();
  c->add_option("--device", a->device, kDeviceHelp)->capture_default_str();
  c->add_option("--vram-budget", a->vram_budget, kVramBudgetHelp);
  c->add_option("--tp", a->tp, kTpHelp)->capture_default_str();
  a->chunks.add(c);
  a->spec.add(c);
  c->add_flag("--log-requests", a->log_requests, "One line per request on stderr");
  c->add_flag("--metrics-no-auth", a->metrics_no_auth, "Serve GET /metrics without the API key (scrape on a private port)");
  c->add_option("--max-connections", a->max_connections,
                "Open connections in all (at the cap the oldest idle one is closed for a new one)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  c->add_option("--max-connections-per-client", a->max_connections_per_client,
                "Open connections per client IP address; more: 429")
      ->capture_default_str()->check(CLI::PositiveNumber);
  c->add_option("--header-timeout", a->header_timeout_s, "Seconds a client may take to send a request's headers (then 408)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  c->add_option("--body-timeout", a->body_timeout_s, "Seconds a client may take to send a request's body (then 408)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  c->add_option("--max-pinned-per-tenant", a->max_pinned_per_tenant,
                "Bytes of chunks one tenant (API key) may pin with /v1/warm, e.g. 64MiB (0: only --chunk-ram bounds "
                "all pins together); more: 507")
      ->capture_default_str();
  c->add_option("--allowed-origins", a->allowed_origins,
                "CORS: comma-separated origins whose pages may call the API, '*' for any (default: none)");
  c->add_flag("-q,--quiet", a->quiet, "No startup or shutdown messages");
  c->callback([a]() { run_serve(*a); });
}

}  // namespace kvboost::cli
