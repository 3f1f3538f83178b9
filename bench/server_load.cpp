// server_load: N concurrent streaming clients against a running `kvboost serve` for a bounded
// time. Reports requests/s, generated tokens/s, time to first token and inter-token latency
// (p50/p99), errors by status (503s counted apart: they are deliberate back-pressure), and the
// server's RSS before and after (from /v1/stats). With --scaling 1,8 it runs one phase per
// concurrency and prints the aggregate generation tokens/s of each relative to the first.
//
//   server_load --port 8000 --clients 16 --duration 20 --max-tokens 64
//   server_load --port 8000 --scaling 1,8 --duration 15 --max-tokens 32
//   server_load --port 8000 --slow 1000 --duration 5      # slow-client test, below
//
// --slow N: the slow-client test. Opens N connections (from 127.0.0.2.. so that the per-client cap
// does not refuse them) that each send one byte of a request head and then nothing, holds them,
// and meanwhile times GET /health and short completions on new connections, one after another,
// for --duration seconds. A server whose threads are held by idle clients fails or stalls here.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <map>
#include <sstream>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <thread>

#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "http.h"
#include "kvboost/common.h"

using json = nlohmann::ordered_json;
using namespace kvboost;

namespace {

struct Args {
  std::string host = "127.0.0.1", key, model, prompt_text;
  int port = 8000;
  int clients = 16;
  double duration_s = 20;
  int max_tokens = 64;
  int prompt_words = 32;
  bool chat = false, shared_prefix = false;
  std::string scaling;
  std::string json_out;
  int slow = 0;
};

struct Sample {
  double ttft_ms = -1;
  std::vector<double> gaps_ms;  // between consecutive content chunks
  int64_t tokens = 0;
  double decode_ms = 0;         // first content chunk -> last content chunk
  int status = 0;
  bool ok = false;
};

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, size_t(p / 100.0 * double(v.size() - 1) + 0.5));
  return v[i];
}

json server_stats(const Args& a) {
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

Sample one_request(const Args& a, int client, int seq) {
  Sample s;
  // A distinct prompt per request (no prefix-cache shortcut) unless --shared-prefix.
  std::string prompt = a.prompt_text;
  if (prompt.empty()) {
    for (int i = 0; i < a.prompt_words; ++i) prompt += (i ? " " : "") + std::string(i % 2 ? "story" : "river") + std::to_string((i * 7 + client) % 10);
  }
  if (!a.shared_prefix) prompt = "Client " + std::to_string(client) + " request " + std::to_string(seq) + ": " + prompt;
  json body{{"max_tokens", a.max_tokens}, {"temperature", 0}, {"stream", true}, {"ignore_eos", true},
            {"stream_options", {{"include_usage", true}}}};
  if (!a.model.empty()) body["model"] = a.model;
  if (a.chat) body["messages"] = json::array({{{"role", "user"}, {"content", prompt}}});
  else body["prompt"] = prompt;
  server::Headers h;
  if (!a.key.empty()) h.push_back({"Authorization", "Bearer " + a.key});
  const double t0 = now_ms();
  server::HttpStream st;
  if (!st.open(a.host, a.port, "POST", a.chat ? "/v1/chat/completions" : "/v1/completions", body.dump(), h, 600'000)) {
    s.status = -1;
    return s;
  }
  s.status = st.status();
  if (s.status != 200) {
    st.read_all();
    return s;
  }
  double last = 0;
  std::string d;
  bool done = false;
  while (st.next_event(d)) {
    if (d == "[DONE]") {
      done = true;
      break;
    }
    json c;
    try {
      c = json::parse(d);
    } catch (...) {
      continue;
    }
    if (c.contains("error")) {
      s.status = 500;
      return s;
    }
    if (c.contains("usage") && c["usage"].is_object()) s.tokens = c["usage"]["completion_tokens"].get<int64_t>();
    if (c["choices"].empty()) continue;
    const json& ch = c["choices"][0];
    std::string piece = a.chat ? (ch["delta"].contains("content") ? ch["delta"]["content"].get<std::string>() : "")
                               : ch["text"].get<std::string>();
    if (piece.empty()) continue;
    const double t = now_ms();
    if (s.ttft_ms < 0) s.ttft_ms = t - t0;
    else s.gaps_ms.push_back(t - last);
    last = t;
  }
  s.ok = done;
  if (s.ttft_ms >= 0) s.decode_ms = last - t0 - s.ttft_ms;
  if (!done) s.status = -2;
  return s;
}

json run_phase(const Args& a, int clients) {
  const json before = server_stats(a);
  std::mutex mu;
  std::vector<Sample> samples;
  const double t0 = now_ms();
  const double end = t0 + a.duration_s * 1000;
  std::vector<std::thread> th;
  for (int c = 0; c < clients; ++c)
    th.emplace_back([&, c] {
      for (int seq = 0; now_ms() < end; ++seq) {
        Sample s = one_request(a, c, seq);
        if (s.status == 503) std::this_thread::sleep_for(std::chrono::milliseconds(100));  // back off
        std::lock_guard<std::mutex> l(mu);
        samples.push_back(std::move(s));
      }
    });
  for (auto& t : th) t.join();
  const double wall_s = (now_ms() - t0) / 1000;
  const json after = server_stats(a);

  int64_t ok = 0, tokens = 0, rejected = 0;
  std::map<int, int64_t> errors;
  std::vector<double> ttft, gaps, stream_rate;
  for (const Sample& s : samples) {
    if (s.ok) {
      ++ok;
      tokens += s.tokens;
      if (s.ttft_ms >= 0) ttft.push_back(s.ttft_ms);
      gaps.insert(gaps.end(), s.gaps_ms.begin(), s.gaps_ms.end());
      if (s.tokens > 2 && s.decode_ms > 0) stream_rate.push_back(double(s.tokens - 1) * 1000.0 / s.decode_ms);
    } else if (s.status == 503) {
      ++rejected;
    } else {
      ++errors[s.status];
    }
  }
  json r;
  r["clients"] = clients;
  r["wall_s"] = wall_s;
  r["requests_ok"] = ok;
  r["requests_per_s"] = double(ok) / wall_s;
  r["tokens"] = tokens;
  r["tokens_per_s"] = double(tokens) / wall_s;
  // Decode rate of one stream while `clients` streams run (median over requests), and that times
  // the number of streams: the aggregate decode rate with every stream decoding.
  r["decode_tok_per_s_per_stream"] = pct(stream_rate, 50);
  r["decode_tok_per_s_aggregate"] = pct(stream_rate, 50) * clients;
  r["ttft_ms_p50"] = pct(ttft, 50);
  r["ttft_ms_p99"] = pct(ttft, 99);
  r["itl_ms_p50"] = pct(gaps, 50);
  r["itl_ms_p99"] = pct(gaps, 99);
  r["rejected_503"] = rejected;
  json e = json::object();
  for (const auto& [st, n] : errors) e[std::to_string(st)] = n;
  r["errors"] = e;
  if (!before.is_null() && !after.is_null()) {
    r["server_rss_mib_before"] = before["process"]["rss_bytes"].get<double>() / 1048576.0;
    r["server_rss_mib_after"] = after["process"]["rss_bytes"].get<double>() / 1048576.0;
    r["kv_blocks_used_after"] = after["kv"]["blocks_used"];
    r["kv_blocks_total"] = after["kv"]["blocks_total"];
  }
  std::printf(
      "clients %3d | %6.1f s | %5lld ok (%.2f req/s) | %7.1f tok/s | TTFT p50 %7.1f p99 %7.1f ms | ITL p50 %6.1f p99 %6.1f ms | "
      "503s %lld | errors %s | RSS %.1f -> %.1f MiB | decode %.1f tok/s/stream, %.1f aggregate\n",
      clients, wall_s, (long long)ok, double(ok) / wall_s, double(tokens) / wall_s, pct(ttft, 50), pct(ttft, 99),
      pct(gaps, 50), pct(gaps, 99), (long long)rejected, e.dump().c_str(), r.value("server_rss_mib_before", 0.0),
      r.value("server_rss_mib_after", 0.0), pct(stream_rate, 50), pct(stream_rate, 50) * clients);
  std::fflush(stdout);
  return r;
}

json run_slow(const Args& a) {
  rlimit r{};
  getrlimit(RLIMIT_NOFILE, &r);
  r.rlim_cur = r.rlim_max;
  setrlimit(RLIMIT_NOFILE, &r);
  std::vector<int> fds;
  int n_failed = 0;
  for (int i = 0; i < a.slow; ++i) {
    const int fd = server::http_connect(a.host, a.port, 5000, "127.0.0." + std::to_string(2 + i % 100));
    if (fd < 0) {
      ++n_failed;
      continue;
    }
    (void)!::send(fd, "P", 1, MSG_NOSIGNAL);
    fds.push_back(fd);
  }
  server::Headers h;
  if (!a.key.empty()) h.push_back({"Authorization", "Bearer " + a.key});
  std::vector<double> health_ms, completion_ms;
  int health_bad = 0, completion_bad = 0;
  json body{{"prompt", "Once upon a time"}, {"max_tokens", 8}, {"temperature", 0}, {"ignore_eos", true}};
  if (!a.model.empty()) body["model"] = a.model;
  const double end = now_ms() + a.duration_s * 1000;
  while (now_ms() < end) {
    double t = now_ms();
    server::HttpResponse hr = server::http_request(a.host, a.port, "GET", "/health", "", h, 10'000);
    if (hr.status == 200) health_ms.push_back(now_ms() - t);
    else ++health_bad;
    t = now_ms();
    server::HttpResponse cr = server::http_request(a.host, a.port, "POST", "/v1/completions", body.dump(), h, 30'000);
    if (cr.status == 200) completion_ms.push_back(now_ms() - t);
    else ++completion_bad;
  }
  for (int fd : fds) ::close(fd);
  json out{{"slow_connections", int(fds.size())},       {"slow_connect_failed", n_failed},
           {"health_ok", int(health_ms.size())},        {"health_failed", health_bad},
           {"health_ms_p50", pct(health_ms, 50)},       {"health_ms_max", pct(health_ms, 100)},
           {"completion_ok", int(completion_ms.size())}, {"completion_failed", completion_bad},
           {"completion_ms_p50", pct(completion_ms, 50)}, {"completion_ms_max", pct(completion_ms, 100)}};
  std::printf(
      "slow clients %d (connect failed %d) | /health %d ok, %d failed, p50 %.2f ms, max %.2f ms | completions (8 tok) %d "
      "ok, %d failed, p50 %.1f ms, max %.1f ms\n",
      int(fds.size()), n_failed, int(health_ms.size()), health_bad, pct(health_ms, 50), pct(health_ms, 100),
      int(completion_ms.size()), completion_bad, pct(completion_ms, 50), pct(completion_ms, 100));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"Load test for kvboost serve: concurrent streaming clients for a bounded time"};
  app.add_option("--host", a.host)->capture_default_str();
  app.add_option("--port", a.port)->capture_default_str();
  app.add_option("--api-key", a.key);
  app.add_option("--model", a.model, "Model id to send (default: none, the server's)");
  app.add_option("-c,--clients", a.clients, "Concurrent streaming clients")->capture_default_str();
  app.add_option("-d,--duration", a.duration_s, "Seconds to keep starting requests")->capture_default_str();
  app.add_option("-n,--max-tokens", a.max_tokens, "Tokens per request (ignore_eos)")->capture_default_str();
  app.add_option("--prompt-words", a.prompt_words, "Words in the generated prompt")->capture_default_str();
  app.add_option("--prompt", a.prompt_text, "Prompt text (instead of generated words)");
  app.add_flag("--chat", a.chat, "Use /v1/chat/completions");
  app.add_flag("--shared-prefix", a.shared_prefix, "Same prompt for every request (prefix cache hits)");
  app.add_option("--scaling", a.scaling, "Comma-separated concurrencies to run one after another, e.g. 1,8");
  app.add_option("--json", a.json_out, "Write the results as JSON to this file");
  app.add_option("--slow", a.slow, "The slow-client test: hold this many idle connections, time new clients");
  CLI11_PARSE(app, argc, argv);
  if (a.slow > 0) {
    const json r = run_slow(a);
    if (!a.json_out.empty()) {
      FILE* f = std::fopen(a.json_out.c_str(), "w");
      if (f) {
        std::fputs(r.dump(2).c_str(), f);
        std::fclose(f);
      }
    }
    return r["health_failed"].get<int>() + r["completion_failed"].get<int>() > 0 ? 1 : 0;
  }
  std::vector<int> phases;
  if (a.scaling.empty()) {
    phases.push_back(a.clients);
  } else {
    std::stringstream ss(a.scaling);
    for (std::string t; std::getline(ss, t, ',');) phases.push_back(std::stoi(t));
  }
  if (server_stats(a).is_null()) {
    std::fprintf(stderr, "server_load: no /v1/stats from %s:%d\n", a.host.c_str(), a.port);
    return 1;
  }
  json all = json::array();
  for (int c : phases) all.push_back(run_phase(a, c));
  if (phases.size() > 1) {
    const double base = all[0]["tokens_per_s"].get<double>();
    const double dbase = all[0]["decode_tok_per_s_aggregate"].get<double>();
    for (size_t i = 1; i < all.size(); ++i)
      std::printf("at %d clients vs %d: end-to-end generation tok/s %.2fx, aggregate decode tok/s %.2fx\n", phases[i],
                  phases[0], base > 0 ? all[i]["tokens_per_s"].get<double>() / base : 0.0,
                  dbase > 0 ? all[i]["decode_tok_per_s_aggregate"].get<double>() / dbase : 0.0);
  }
  if (!a.json_out.empty()) {
    FILE* f = std::fopen(a.json_out.c_str(), "w");
    if (f) {
      std::fputs(all.dump(2).c_str(), f);
      std::fclose(f);
    }
  }
  return 0;
}
