// Server tests over real HTTP on loopback (ephemeral ports): every endpoint, streaming, the
// bad-input catalog, API keys and tenancy, cancellation on disconnect (KV freed), 503 under
// overload, timeouts, warm-up, segments and graceful shutdown. The model is the generated tiny
// fixture (random weights, a byte-level tokenizer with a ChatML template); stories260K (no chat
// template) when ../shared has it.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <thread>

#include <nlohmann/json.hpp>

#include "api.h"
#include "http.h"
#include "kvboost/model.h"
#include "kvboost/chat.h"
#include "kvboost/server.h"
#include "testing/fixture.h"
#include "test_util.h"

namespace kvboost {
namespace {

using json = nlohmann::ordered_json;
using server::HttpResponse;
using server::HttpStream;

const std::string& tiny_dir() {
  static const std::string dir = [] {
    const std::string d = test::make_temp_dir("server_tiny");
    write_fixture_model(d, fixture_preset("tiny"));
    return d;
  }();
  return dir;
}

Engine& tiny_engine() {
  static std::unique_ptr<Engine> e = [] {
    EngineOptions eo;
    eo.max_batch = 4;
    return Engine::load(tiny_dir(), eo);
  }();
  return *e;
}

// A server on an ephemeral port for the duration of a test.
struct TestServer {
  std::unique_ptr<Server> srv;
  int port = 0;
  explicit TestServer(Engine& e, ServerOptions o = {}, const std::string& dir = "") {
    signal(SIGPIPE, SIG_IGN);
    o.host = "127.0.0.1";
    o.port = 0;
    o.model_dir = dir.empty() ? tiny_dir() : dir;
    o.model_name = o.model_name.empty() ? "tiny" : o.model_name;
    srv = std::make_unique<Server>(e, o);
    srv->start();
    port = srv->port();
  }
  HttpResponse get(const std::string& path, const server::Headers& h = {}) const {
    return server::http_request("127.0.0.1", port, "GET", path, "", h);
  }
  HttpResponse post(const std::string& path, const std::string& body, const server::Headers& h = {}) const {
    return server::http_request("127.0.0.1", port, "POST", path, body, h);
  }
  HttpResponse post(const std::string& path, const json& body, const server::Headers& h = {}) const {
    return post(path, body.dump(), h);
  }
  json stats() const { return json::parse(get("/v1/stats").body); }
};

json body_of(const HttpResponse& r) {
  try {
    return json::parse(r.body);
  } catch (const std::exception&) {
    ADD_FAILURE() << "not JSON (status " << r.status << "): " << r.body;
    return json();
  }
}

// Checks the OpenAI error shape and returns the error object.
json expect_error(const HttpResponse& r, int status, const std::string& what) {
  EXPECT_EQ(r.status, status) << what << ": " << r.body;
  json b = body_of(r);
  EXPECT_TRUE(b.contains("error")) << what << ": " << r.body;
  if (!b.contains("error")) return json();
  const json& e = b["error"];
  EXPECT_TRUE(e["message"].is_string() && !e["message"].get<std::string>().empty()) << what;
  EXPECT_TRUE(e["type"].is_string()) << what;
  EXPECT_TRUE(e.contains("param") && e.contains("code")) << what;
  return e;
}

// A prompt of about n tokens for the byte-level fixture.
std::string long_prompt(int words) {
  std::string s;
  for (int i = 0; i < words; ++i) {
    if (i) s += ' ';
    s += i % 3 ? "cache" : "block";
    s += std::to_string(i % 7);
  }
  return s;
}

json completion_req(const std::string& prompt, int max_tokens) {
  return json{{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true}};
}

// Reads every SSE event's data of a streamed response.
std::vector<std::string> read_events(HttpStream& s) {
  std::vector<std::string> ev;
  std::string d;
  while (s.next_event(d)) ev.push_back(d);
  return ev;
}

bool wait_for(const std::function<bool()>& cond, double seconds) {
  const double end = now_ms() + seconds * 1000;
  while (now_ms() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return cond();
}

TEST(Server, HealthModelsStatsMetrics) {
  TestServer s(tiny_engine());
  HttpResponse h = s.get("/health");
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(body_of(h)["status"], "ok");
  HttpResponse m = s.get("/v1/models");
  ASSERT_EQ(m.status, 200);
  json mb = body_of(m);
  EXPECT_EQ(mb["object"], "list");
  ASSERT_EQ(mb["data"].size(), 1u);
  EXPECT_EQ(mb["data"][0]["id"], "tiny");
  EXPECT_EQ(mb["data"][0]["max_model_len"], 2048);
  EXPECT_EQ(s.get("/v1/models/tiny").status, 200);
  expect_error(s.get("/v1/models/gpt-4"), 404, "unknown model id");
  HttpResponse st = s.get("/v1/stats");
  ASSERT_EQ(st.status, 200);
  json sb = body_of(st);
  for (const char* k : {"queue", "kv", "requests", "tokens", "throughput", "process"}) EXPECT_TRUE(sb.contains(k)) << k;
  EXPECT_GT(sb["kv"]["blocks_total"].get<int64_t>(), 0);
  EXPECT_GT(sb["process"]["rss_bytes"].get<int64_t>(), 0);
  HttpResponse mt = s.get("/metrics");
  ASSERT_EQ(mt.status, 200);
  EXPECT_NE(mt.header("content-type").find("text/plain"), std::string::npos);
  for (const char* k : {"# TYPE kvboost_http_responses_total counter", "kvboost_kv_blocks{state=\"used\"}",
                        "kvboost_requests_in_flight 0", "kvboost_process_resident_memory_bytes"})
    EXPECT_NE(mt.body.find(k), std::string::npos) << k;
  expect_error(s.get("/v1/nothing"), 404, "unknown path");
  expect_error(s.get("/v1/completions"), 405, "GET on a POST endpoint");
  expect_error(s.post("/v1/models", std::string("{}")), 405, "POST on a GET endpoint");
}

TEST(Server, CompletionNonStreamingAndPrefixCache) {
  TestServer s(tiny_engine());
  const std::string prompt = long_prompt(30);
  HttpResponse r = s.post("/v1/completions", completion_req(prompt, 8));
  ASSERT_EQ(r.status, 200) << r.body;
  json b = body_of(r);
  EXPECT_EQ(b["object"], "text_completion");
  EXPECT_EQ(b["model"], "tiny");
  EXPECT_EQ(b["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  ASSERT_EQ(b["choices"].size(), 1u);
  EXPECT_EQ(b["choices"][0]["finish_reason"], "length");
  const int64_t n_prompt = int64_t(tiny_engine().tokenizer().encode(prompt).size());
  EXPECT_EQ(b["usage"]["prompt_tokens"], n_prompt);
  EXPECT_EQ(b["usage"]["completion_tokens"], 8);
  EXPECT_EQ(b["usage"]["total_tokens"], n_prompt + 8);
  // The same prompt again (same tenant): its full blocks come from the prefix cache, same text.
  HttpResponse r2 = s.post("/v1/completions", completion_req(prompt, 8));
  json b2 = body_of(r2);
  EXPECT_EQ(b2["choices"][0]["text"], b["choices"][0]["text"]);
  EXPECT_GE(b2["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), 16);
  EXPECT_EQ(b2["usage"]["prompt_tokens_details"]["cached_tokens"], b2["kvboost"]["cached_prefix_tokens"]);
  // A different cache_salt is another namespace: nothing cached.
  json salted = completion_req(prompt, 8);
  salted["cache_salt"] = "other";
  json b3 = body_of(s.post("/v1/completions", salted));
  EXPECT_EQ(b3["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(b3["choices"][0]["text"], b["choices"][0]["text"]);
  // echo, token-id prompts, and a list of one prompt.
  json e = completion_req(prompt, 4);
  e["echo"] = true;
  json be = body_of(s.post("/v1/completions", e));
  EXPECT_EQ(be["choices"][0]["text"].get<std::string>().rfind(prompt, 0), 0u);
  json ids = completion_req("", 4);
  ids["prompt"] = tiny_engine().tokenizer().encode(prompt);
  EXPECT_EQ(body_of(s.post("/v1/completions", ids))["choices"][0]["text"],
            body_of(s.post("/v1/completions", completion_req(prompt, 4)))["choices"][0]["text"]);
  json one = completion_req("", 4);
  one["prompt"] = json::array({prompt});
  EXPECT_EQ(s.post("/v1/completions", one).status, 200);
}

TEST(Server, StreamingCompletionMatchesNonStreaming) {
  TestServer s(tiny_engine());
  const std::string prompt = "Once upon a time";
  json req = completion_req(prompt, 12);
  const std::string whole = body_of(s.post("/v1/completions", req))["choices"][0]["text"];
  req["stream"] = true;
  req["stream_options"] = {{"include_usage", true}};
  HttpStream st;
  ASSERT_TRUE(st.open("127.0.0.1", s.port, "POST", "/v1/completions", req.dump()));
  EXPECT_EQ(st.status(), 200);
  EXPECT_NE(st.headers().empty(), true);
  std::vector<std::string> ev = read_events(st);
  ASSERT_GE(ev.size(), 3u);
  EXPECT_EQ(ev.back(), "[DONE]");
  std::string text, finish;
  json usage;
  for (size_t i = 0; i + 1 < ev.size(); ++i) {
    json c = json::parse(ev[i]);
    EXPECT_EQ(c["object"], "text_completion");
    if (c.contains("usage")) {
      usage = c["usage"];
      EXPECT_TRUE(c["choices"].empty());
      continue;
    }
    text += c["choices"][0]["text"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, whole);
  EXPECT_EQ(finish, "length");
  EXPECT_EQ(usage["completion_tokens"], 12);
}

// Logprobs: each token's logprob is log-softmax of the model's logits (checked against a direct
// forward pass), the sampled token is the argmax under greedy decoding, the top list is sorted and
// holds the sampled token first; streamed logprobs equal the non-streamed ones.
TEST(Server, CompletionLogprobs) {
  TestServer s(tiny_engine());
  json req = completion_req("Once upon a time", 6);
  req["logprobs"] = 3;
  const json b = body_of(s.post("/v1/completions", req));
  const json& lp = b["choices"][0]["logprobs"];
  ASSERT_TRUE(lp.is_object()) << b.dump();
  ASSERT_EQ(lp["tokens"].size(), 6u);
  ASSERT_EQ(lp["token_logprobs"].size(), 6u);
  ASSERT_EQ(lp["top_logprobs"].size(), 6u);
  ASSERT_EQ(lp["text_offset"].size(), 6u);
  std::string joined;
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(lp["text_offset"][i].get<size_t>(), joined.size());
    joined += lp["tokens"][i].get<std::string>();
    const double l = lp["token_logprobs"][i];
    EXPECT_LE(l, 0.0);
    const json& top = lp["top_logprobs"][i];
    ASSERT_TRUE(top.is_object());
    EXPECT_GE(top.size(), 1u);
    EXPECT_LE(top.size(), 4u);  // 3 alternatives (+ the sampled token when not among them: never, greedy)
    double best = -1e30;
    for (const auto& [k, v] : top.items()) best = std::max(best, v.get<double>());
    EXPECT_NEAR(l, best, 1e-6) << "greedy picks the most likely token";
  }
  EXPECT_EQ(joined, b["choices"][0]["text"].get<std::string>());

  // The first token's logprob against the model directly: log-softmax of the prompt's last logits.
  const Engine& e = tiny_engine();
  const std::vector<int32_t> ids = e.tokenizer().encode("Once upon a time");
  KvCache kv(e.model().config(), 64);
  std::vector<float> logits(size_t(e.model().config().vocab_size));
  e.model().forward(ids.data(), int64_t(ids.size()), kv, logits.data());
  double mx = -1e30, sum = 0;
  for (float x : logits) mx = std::max(mx, double(x));
  for (float x : logits) sum += std::exp(double(x) - mx);
  const int64_t first = std::max_element(logits.begin(), logits.end()) - logits.begin();
  EXPECT_NEAR(lp["token_logprobs"][0].get<double>(), double(logits[size_t(first)]) - mx - std::log(sum), 1e-4);

  req["stream"] = true;
  HttpStream st;
  ASSERT_TRUE(st.open("127.0.0.1", s.port, "POST", "/v1/completions", req.dump()));
  std::vector<std::string> ev = read_events(st);
  std::vector<double> streamed;
  for (const std::string& d : ev) {
    if (d == "[DONE]") break;
    const json c = json::parse(d);
    const json& l = c["choices"][0]["logprobs"];
    if (l.is_null()) continue;
    for (const auto& v : l["token_logprobs"]) streamed.push_back(v);
  }
  ASSERT_EQ(streamed.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(streamed[i], lp["token_logprobs"][i].get<double>(), 1e-6);
}

TEST(Server, ChatLogprobsAndPenalties) {
  TestServer s(tiny_engine());
  json req{{"model", "tiny"},
           {"messages", {{{"role", "user"}, {"content", "Say something."}}}},
           {"max_tokens", 5},
           {"temperature", 0},
           {"ignore_eos", true},
           {"logprobs", true},
           {"top_logprobs", 2}};
  const json b = body_of(s.post("/v1/chat/completions", req));
  const json& content = b["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 5u) << b.dump();
  for (const json& t : content) {
    EXPECT_TRUE(t["token"].is_string());
    EXPECT_LE(t["logprob"].get<double>(), 0.0);
    EXPECT_TRUE(t["bytes"].is_array());
    ASSERT_EQ(t["top_logprobs"].size(), 2u);
    EXPECT_GE(t["top_logprobs"][0]["logprob"].get<double>(), t["top_logprobs"][1]["logprob"].get<double>());
    EXPECT_EQ(t["top_logprobs"][0]["token"], t["token"]);
  }
  // A strong frequency penalty changes greedy output that repeats tokens: with 2.0 per
  // occurrence, no token the model generated may be the argmax again unless it leads by more.
  json plain{{"model", "tiny"}, {"prompt", "block0 block0 block0"}, {"max_tokens", 24}, {"temperature", 0},
             {"ignore_eos", true}};
  const json a = body_of(s.post("/v1/completions", plain));
  plain["frequency_penalty"] = 2.0;
  plain["presence_penalty"] = 2.0;
  const json p = body_of(s.post("/v1/completions", plain));
  ASSERT_TRUE(a["choices"][0]["text"].is_string());
  ASSERT_TRUE(p["choices"][0]["text"].is_string());
  EXPECT_NE(a["choices"][0]["text"], p["choices"][0]["text"]) << "the penalties must change a 24-token greedy output";
}

// HTTP/1.1 keep-alive: two requests on one connection, then "Connection: close" ends it.
TEST(Server, KeepAliveServesSeveralRequestsPerConnection) {
  TestServer s(tiny_engine());
  const int fd = server::http_connect("127.0.0.1", s.port);
  ASSERT_GE(fd, 0);
  auto send_req = [&](const std::string& extra) {
    const std::string body = completion_req("Hello", 2).dump();
    const std::string r = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + extra +
                          "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    ASSERT_EQ(::send(fd, r.data(), r.size(), MSG_NOSIGNAL), ssize_t(r.size()));
  };
  std::string buf;
  // Reads one response (headers + Content-Length body) from buf/fd; "" on EOF.
  auto read_resp = [&]() -> std::string {
    char tmp[4096];
    for (;;) {
      const size_t he = buf.find("\r\n\r\n");
      if (he != std::string::npos) {
        const size_t cl = buf.find("Content-Length: ");
        if (cl != std::string::npos && cl < he) {
          const size_t n = std::stoul(buf.substr(cl + 16));
          if (buf.size() >= he + 4 + n) {
            std::string r = buf.substr(0, he + 4 + n);
            buf.erase(0, he + 4 + n);
            return r;
          }
        }
      }
      const ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
      if (n <= 0) return "";
      buf.append(tmp, size_t(n));
    }
  };
  send_req("");
  std::string r1 = read_resp();
  EXPECT_NE(r1.find("HTTP/1.1 200"), std::string::npos) << r1;
  EXPECT_NE(r1.find("Connection: keep-alive"), std::string::npos) << r1;
  send_req("");
  std::string r2 = read_resp();
  EXPECT_NE(r2.find("HTTP/1.1 200"), std::string::npos) << r2;
  send_req("Connection: close\r\n");
  std::string r3 = read_resp();
  EXPECT_NE(r3.find("Connection: close"), std::string::npos) << r3;
  char c;
  EXPECT_EQ(::recv(fd, &c, 1, 0), 0) << "the server closes after Connection: close";
  ::close(fd);
}

// Chat prompts carry their message boundaries as segments (chunks never straddle messages).
TEST(Server, ChatMessagesBecomeSegments) {
  Engine& e = tiny_engine();
  server::ApiContext ctx;
  ctx.tok = &e.tokenizer();
  ctx.context_length = e.context_length();
  ctx.max_prompt_tokens = e.context_length() - 1;
  ctx.vocab_size = int32_t(e.model().config().vocab_size);
  ctx.model_name = "tiny";
  ctx.chat_config = read_file(tiny_dir() + "/tokenizer_config.json");
  ctx.has_chat_template = true;
  const json body{{"model", "tiny"},
                  {"messages",
                   {{{"role", "system"}, {"content", "You are terse."}},
                    {{"role", "user"}, {"content", "Tell me about caches."}},
                    {{"role", "assistant"}, {"content", "They keep things."}},
                    {{"role", "user"}, {"content", "More?"}}}}};
  const server::ParsedRequest p = server::parse_chat(body, ctx);
  ASSERT_EQ(p.opt.segment_starts.size(), 3u);
  const auto im_start = e.tokenizer().token_to_id("<|im_start|>");
  ASSERT_TRUE(im_start.has_value());
  int64_t prev = 0;
  for (int64_t s : p.opt.segment_starts) {
    EXPECT_GT(s, prev);
    EXPECT_LT(s, int64_t(p.prompt_ids.size()));
    // ChatML: every message starts with <|im_start|> (after the previous one's "<|im_end|>\n").
    EXPECT_EQ(p.prompt_ids[size_t(s)], *im_start) << "segment start " << s;
    prev = s;
  }
  // A one-message conversation has no boundaries.
  const json one{{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}};
  EXPECT_TRUE(server::parse_chat(one, ctx).opt.segment_starts.empty());
}

TEST(Server, ChatCompletionStreamingAndNot) {
  TestServer s(tiny_engine());
  json req{{"model", "tiny"},
           {"messages", json::array({{{"role", "system"}, {"content", "Be brief."}},
                                     {{"role", "user"}, {"content", json::array({{{"type", "text"}, {"text", "Hi "}},
                                                                                 {{"type", "text"}, {"text", "there"}}})}}})},
           {"max_tokens", 10},
           {"temperature", 0},
           {"ignore_eos", true}};
  HttpResponse r = s.post("/v1/chat/completions", req);
  ASSERT_EQ(r.status, 200) << r.body;
  json b = body_of(r);
  EXPECT_EQ(b["object"], "chat.completion");
  EXPECT_EQ(b["choices"][0]["message"]["role"], "assistant");
  const std::string content = b["choices"][0]["message"]["content"];
  // The prompt is the model's ChatML template, rendered and tokenized without extra specials.
  const std::string rendered = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ(b["usage"]["prompt_tokens"], int64_t(tiny_engine().tokenizer().encode(rendered, false).size()));
  req["stream"] = true;
  HttpStream st;
  ASSERT_TRUE(st.open("127.0.0.1", s.port, "POST", "/v1/chat/completions", req.dump()));
  std::vector<std::string> ev = read_events(st);
  ASSERT_GE(ev.size(), 3u);
  EXPECT_EQ(ev.back(), "[DONE]");
  json first = json::parse(ev[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  for (size_t i = 1; i + 1 < ev.size(); ++i) {
    json c = json::parse(ev[i]);
    const json& d = c["choices"][0]["delta"];
    if (d.contains("content")) text += d["content"].get<std::string>();
  }
  EXPECT_EQ(text, content);
  EXPECT_EQ(json::parse(ev[ev.size() - 2])["choices"][0]["finish_reason"], "length");
}

TEST(Server, StopStrings) {
  TestServer s(tiny_engine());
  const std::string prompt = "The quick brown fox";
  const std::string text = body_of(s.post("/v1/completions", completion_req(prompt, 40)))["choices"][0]["text"];
  ASSERT_GE(text.size(), 12u);
  // A stop string: the first whole UTF-8 character that does not occur at the start; the text
  // must end right before its first occurrence.
  std::string stop;
  for (size_t i = 1; i < text.size() && stop.empty();) {
    size_t len = 1;
    const unsigned char c = (unsigned char)text[i];
    if (c >= 0xF0) len = 4;
    else if (c >= 0xE0) len = 3;
    else if (c >= 0xC0) len = 2;
    const std::string ch = text.substr(i, len);
    if (text.find(ch) == i) stop = ch;
    i += len;
  }
  ASSERT_FALSE(stop.empty()) << text;
  const size_t at = text.find(stop);
  json req = completion_req(prompt, 40);
  req["stop"] = json::array({"\x01never", stop});
  json b = body_of(s.post("/v1/completions", req));
  EXPECT_EQ(b["choices"][0]["text"], text.substr(0, at));
  EXPECT_EQ(b["choices"][0]["finish_reason"], "stop");
  req["stop"] = stop;  // a single string works too
  EXPECT_EQ(body_of(s.post("/v1/completions", req))["choices"][0]["text"], text.substr(0, at));
}

TEST(Server, BadInputCatalog) {
  ServerOptions o;
  o.max_body_bytes = 64 << 10;
  o.max_prompt_tokens = 256;
  TestServer s(tiny_engine(), o);
  const json msgs = json::array({{{"role", "user"}, {"content", "hi"}}});
  struct Case {
    const char* what;
    const char* path;
    std::string body;
    int status;
    const char* param;  // expected error.param ("" = don't check)
  };
  auto comp = [](json extra) {
    json b{{"model", "tiny"}, {"prompt", "hello"}, {"max_tokens", 4}};
    for (auto& [k, v] : extra.items()) b[k] = v;
    return b.dump();
  };
  auto chat = [&](json extra) {
    json b{{"model", "tiny"}, {"messages", msgs}, {"max_tokens", 4}};
    for (auto& [k, v] : extra.items()) b[k] = v;
    return b.dump();
  };
  const std::vector<Case> cases = {
      {"malformed JSON", "/v1/completions", "{\"prompt\": ", 400, ""},
      {"empty body", "/v1/completions", "", 400, ""},
      {"JSON array body", "/v1/completions", "[1, 2]", 400, ""},
      {"invalid UTF-8 in a string", "/v1/completions", "{\"prompt\": \"ab\xff\xfe\", \"max_tokens\": 2}", 400, ""},
      {"lone surrogate escape", "/v1/completions", "{\"prompt\": \"a\\ud800b\", \"max_tokens\": 2}", 400, ""},
      {"prompt of wrong type", "/v1/completions", comp({{"prompt", 5}}), 400, "prompt"},
      {"missing prompt", "/v1/completions", R"({"model": "tiny"})", 400, "prompt"},
      {"empty prompt", "/v1/completions", comp({{"prompt", ""}}), 400, "prompt"},
      {"prompt list with a number", "/v1/completions", comp({{"prompt", {"a", 5}}}), 400, "prompt"},
      {"token id outside the vocabulary", "/v1/completions", comp({{"prompt", {1, 2, 99999999}}}), 400, "prompt"},
      {"max_tokens a string", "/v1/completions", comp({{"max_tokens", "ten"}}), 400, "max_tokens"},
      {"negative max_tokens", "/v1/completions", comp({{"max_tokens", -5}}), 400, "max_tokens"},
      {"zero max_tokens", "/v1/completions", comp({{"max_tokens", 0}}), 400, "max_tokens"},
      {"huge max_tokens", "/v1/completions", comp({{"max_tokens", 1000000000000LL}}), 400, "max_tokens"},
      {"fractional max_tokens", "/v1/completions", comp({{"max_tokens", 2.5}}), 400, "max_tokens"},
      {"temperature a string", "/v1/completions", comp({{"temperature", "hot"}}), 400, "temperature"},
      {"temperature too high", "/v1/completions", comp({{"temperature", 5}}), 400, "temperature"},
      {"negative temperature", "/v1/completions", comp({{"temperature", -0.5}}), 400, "temperature"},
      {"top_p zero", "/v1/completions", comp({{"top_p", 0}}), 400, "top_p"},
      {"top_p above one", "/v1/completions", comp({{"top_p", 1.5}}), 400, "top_p"},
      {"top_k fractional", "/v1/completions", comp({{"top_k", 1.5}}), 400, "top_k"},
      {"min_p above one", "/v1/completions", comp({{"min_p", 2}}), 400, "min_p"},
      {"seed a string", "/v1/completions", comp({{"seed", "x"}}), 400, "seed"},
      {"stream a string", "/v1/completions", comp({{"stream", "yes"}}), 400, "stream"},
      {"stop a number", "/v1/completions", comp({{"stop", 3}}), 400, "stop"},
      {"stop list with a number", "/v1/completions", comp({{"stop", {"a", 1}}}), 400, "stop"},
      {"empty stop string", "/v1/completions", comp({{"stop", ""}}), 400, "stop"},
      {"n = 0", "/v1/completions", comp({{"n", 0}}), 400, "n"},
      {"logprobs above 20", "/v1/completions", comp({{"logprobs", 21}}), 400, "logprobs"},
      {"logprobs a bool", "/v1/completions", comp({{"logprobs", true}}), 400, "logprobs"},
      {"logprobs with echo", "/v1/completions", comp({{"logprobs", 2}, {"echo", true}}), 400, "logprobs"},
      {"presence_penalty out of range", "/v1/completions", comp({{"presence_penalty", 2.5}}), 400, "presence_penalty"},
      {"frequency_penalty a string", "/v1/completions", comp({{"frequency_penalty", "x"}}), 400, "frequency_penalty"},
      {"unknown reuse mode", "/v1/completions", comp({{"reuse", "bogus"}}), 400, "reuse"},
      {"reuse blend_first_ratio above one", "/v1/completions",
       comp({{"reuse", {{"mode", "cacheblend"}, {"blend_first_ratio", 1.5}}}}), 400, "blend_first_ratio"},
      {"reuse guard_lead negative", "/v1/completions",
       comp({{"reuse", {{"mode", "cacheblend"}, {"guard_lead", -1}}}}), 400, "guard_lead"},
      {"reuse guard_risk above one", "/v1/completions",
       comp({{"reuse", {{"mode", "cacheblend"}, {"guard_risk", 2}}}}), 400, "guard_risk"},
      {"reuse blend_taper_layers zero", "/v1/completions",
       comp({{"reuse", {{"mode", "cacheblend"}, {"blend_taper_layers", 0}}}}), 400, "blend_taper_layers"},
      {"segments not strings", "/v1/completions", comp({{"segments", {1}}}), 400, "segments"},
      {"cache_salt a number", "/v1/completions", comp({{"cache_salt", 1}}), 400, "cache_salt"},
      {"unknown model", "/v1/completions", comp({{"model", "gpt-4"}}), 404, "model"},
      {"prompt longer than the limit", "/v1/completions", comp({{"prompt", long_prompt(400)}}), 400, "prompt"},
      {"prompt + max_tokens beyond the context", "/v1/completions", comp({{"max_tokens", 2046}}), 400, "max_tokens"},
      {"messages missing", "/v1/chat/completions", R"({"model": "tiny"})", 400, "messages"},
      {"messages not a list", "/v1/chat/completions", chat({{"messages", "hi"}}), 400, "messages"},
      {"empty messages", "/v1/chat/completions", chat({{"messages", json::array()}}), 400, "messages"},
      {"message not an object", "/v1/chat/completions", chat({{"messages", {"hi"}}}), 400, "messages[0]"},
      {"unknown role", "/v1/chat/completions", chat({{"messages", {{{"role", "wizard"}, {"content", "x"}}}}}), 400,
       "messages[0].role"},
      {"role missing", "/v1/chat/completions", chat({{"messages", {{{"content", "x"}}}}}), 400, "messages[0].role"},
      {"content missing", "/v1/chat/completions", chat({{"messages", {{{"role", "user"}}}}}), 400, "messages[0].content"},
      {"content a number", "/v1/chat/completions", chat({{"messages", {{{"role", "user"}, {"content", 7}}}}}), 400,
       "messages[0].content"},
      {"image content part", "/v1/chat/completions",
       chat({{"messages", {{{"role", "user"}, {"content", {{{"type", "image_url"}, {"image_url", "x"}}}}}}}}), 400,
       "messages[0].content[0]"},
      {"chat logprobs a number", "/v1/chat/completions", chat({{"logprobs", 3}}), 400, "logprobs"},
      {"chat top_logprobs without logprobs", "/v1/chat/completions", chat({{"top_logprobs", 3}}), 400, "top_logprobs"},
      {"chat top_logprobs above 20", "/v1/chat/completions", chat({{"logprobs", true}, {"top_logprobs", 30}}), 400,
       "top_logprobs"},
      {"chat n = 100", "/v1/chat/completions", chat({{"n", 100}}), 400, "n"},
      {"chat temperature out of range", "/v1/chat/completions", chat({{"temperature", 2.5}}), 400, "temperature"},
      {"chat unknown model", "/v1/chat/completions", chat({{"model", "nope"}}), 404, "model"},
      {"tools", "/v1/chat/completions", chat({{"tools", {{{"type", "function"}}}}}), 400, "tools"},
  };
  for (const Case& c : cases) {
    json e = expect_error(s.post(c.path, c.body), c.status, c.what);
    if (*c.param && e.is_object()) {
      EXPECT_EQ(e["param"], c.param) << c.what << ": " << e.dump();
    }
  }
  // Oversized body: 413, answered before the body is read.
  const std::string big = json{{"model", "tiny"}, {"prompt", std::string(100 << 10, 'a')}}.dump();
  expect_error(s.post("/v1/completions", big), 413, "body over the limit");
  // Malformed HTTP.
  {
    const int fd = server::http_connect("127.0.0.1", s.port);
    ASSERT_GE(fd, 0);
    const std::string bad = "POST /v1/completions HTTP/1.1\r\nContent-Length: abc\r\n\r\n";
    ASSERT_EQ(::send(fd, bad.data(), bad.size(), MSG_NOSIGNAL), ssize_t(bad.size()));
    std::string got;
    char buf[4096];
    for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) got.append(buf, size_t(n));
    ::close(fd);
    EXPECT_EQ(got.rfind("HTTP/1.1 400", 0), 0u) << got;
  }
  // The server keeps serving.
  HttpResponse ok = s.post("/v1/completions", completion_req("hello again", 3));
  EXPECT_EQ(ok.status, 200) << ok.body;
  json st = s.stats();
  EXPECT_EQ(st["queue"]["in_flight"], 0);
  EXPECT_EQ(st["kv"]["blocks_used"], 0);
}

TEST(Server, ApiKeysAndTenants) {
  ServerOptions o;
  o.api_keys = {"key-one", "key-two"};
  TestServer s(tiny_engine(), o);
  const server::Headers k1{{"Authorization", "Bearer key-one"}}, k2{{"Authorization", "Bearer key-two"}};
  EXPECT_EQ(s.get("/health").status, 200);  // health checks need no key
  json e = expect_error(s.get("/v1/models"), 401, "no key");
  EXPECT_EQ(e["type"], "authentication_error");
  expect_error(s.get("/v1/models", {{"Authorization", "Bearer wrong"}}), 401, "wrong key");
  expect_error(s.get("/v1/models", {{"Authorization", "key-one"}}), 401, "not Bearer");
  expect_error(s.post("/v1/completions", completion_req("hi", 2)), 401, "no key on a POST");
  EXPECT_EQ(s.get("/v1/models", k1).status, 200);
  EXPECT_EQ(s.get("/metrics", k2).status, 200);
  // Tenants never share the prefix cache, even for the same prompt and cache_salt.
  const std::string prompt = long_prompt(40) + " tenants";
  json a1 = body_of(s.post("/v1/completions", completion_req(prompt, 2), k1));
  json a2 = body_of(s.post("/v1/completions", completion_req(prompt, 2), k1));
  json b1 = body_of(s.post("/v1/completions", completion_req(prompt, 2), k2));
  EXPECT_EQ(a1["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_GE(a2["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), 16);
  EXPECT_EQ(b1["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
}

TEST(Server, ClientDisconnectCancelsAndFreesKv) {
  ServerOptions o;
  o.step_delay_ms = 10;  // ~100 tokens/s: the client is sure to leave mid-generation
  TestServer s(tiny_engine(), o);
  json req = completion_req(long_prompt(40), 1000);
  req["stream"] = true;
  {
    HttpStream st;
    ASSERT_TRUE(st.open("127.0.0.1", s.port, "POST", "/v1/completions", req.dump()));
    std::string d;
    for (int i = 0; i < 4; ++i) ASSERT_TRUE(st.next_event(d));
    EXPECT_GT(s.stats()["kv"]["blocks_used"].get<int64_t>(), 0);
    st.close();
  }
  EXPECT_TRUE(wait_for([&] {
    json st = s.stats();
    return st["queue"]["in_flight"] == 0 && st["kv"]["blocks_used"] == 0;
  }, 10)) << s.stats().dump();
  json st = s.stats();
  EXPECT_EQ(st["requests"]["cancelled_disconnect"], 1);
  EXPECT_EQ(st["requests"]["finish_reasons"]["cancelled"], 1);
  // Non-streaming clients that leave are noticed too.
  req["stream"] = false;
  {
    const int fd = server::http_connect("127.0.0.1", s.port);
    const std::string body = req.dump();
    std::string msg = "POST /v1/completions HTTP/1.1\r\nContent-Length: ";
    msg += std::to_string(body.size());
    msg += "\r\n\r\n";
    msg += body;
    ASSERT_EQ(::send(fd, msg.data(), msg.size(), MSG_NOSIGNAL), ssize_t(msg.size()));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ::close(fd);
  }
  EXPECT_TRUE(wait_for([&] { return s.stats()["requests"]["cancelled_disconnect"] == 2; }, 10));
  EXPECT_TRUE(wait_for([&] { return s.stats()["kv"]["blocks_used"] == 0; }, 10));
}

TEST(Server, OverloadAnswers503AndRecovers) {
  ServerOptions o;
  o.max_queue = 1;
  o.step_delay_ms = 10;
  EngineOptions eo;
  eo.max_batch = 1;
  auto engine = Engine::load(tiny_dir(), eo);
  TestServer s(*engine, o);
  json req = completion_req("overload", 1000);
  req["stream"] = true;
  // One running + one waiting fill the server.
  HttpStream a, b;
  ASSERT_TRUE(a.open("127.0.0.1", s.port, "POST", "/v1/completions", req.dump()));
  ASSERT_TRUE(b.open("127.0.0.1", s.port, "POST", "/v1/completions", req.dump()));
  EXPECT_EQ(a.status(), 200);
  EXPECT_EQ(b.status(), 200);
  HttpResponse r = s.post("/v1/completions", completion_req("third", 2));
  json e = expect_error(r, 503, "third request");
  EXPECT_EQ(e["code"], "server_overloaded");
  EXPECT_EQ(r.header("retry-after"), "1");
  EXPECT_EQ(s.stats()["requests"]["rejected_overload"], 1);
  a.close();
  b.close();
  EXPECT_TRUE(wait_for([&] { return s.stats()["queue"]["in_flight"] == 0; }, 10));
  EXPECT_EQ(s.post("/v1/completions", completion_req("after", 2)).status, 200);
}

TEST(Server, PerRequestTimeout) {
  ServerOptions o;
  o.timeout_s = 0.3;
  o.step_delay_ms = 10;
  TestServer s(tiny_engine(), o);
  json e = expect_error(s.post("/v1/completions", completion_req("slow", 1000)), 504, "non-streaming timeout");
  EXPECT_EQ(e["code"], "timeout");
  json req = completion_req("slow", 1000);
  req["stream"] = true;
  HttpStream st;
  ASSERT_TRUE(st.open("127.0.0.1", s.port, "POST", "/v1/completions", req.dump()));
  std::vector<std::string> ev = read_events(st);
  ASSERT_GE(ev.size(), 2u);
  EXPECT_EQ(ev.back(), "[DONE]");
  EXPECT_TRUE(json::parse(ev[ev.size() - 2]).contains("error"));
  EXPECT_TRUE(wait_for([&] { return s.stats()["kv"]["blocks_used"] == 0; }, 10));
  EXPECT_EQ(s.stats()["requests"]["cancelled_timeout"], 2);
}

TEST(Server, WarmThenHitAndSegments) {
  TestServer s(tiny_engine());
  const std::string prompt = long_prompt(50) + " warm";
  json w{{"model", "tiny"}, {"prompt", prompt}, {"cache_salt", "warm-test"}};
  HttpResponse r = s.post("/v1/warm", w);
  ASSERT_EQ(r.status, 200) << r.body;
  json wb = body_of(r);
  EXPECT_EQ(wb["object"], "warm");
  const int64_t n = wb["prompt_tokens"];
  EXPECT_EQ(wb["cached_tokens"], 0);
  json req = completion_req(prompt, 2);
  req["cache_salt"] = "warm-test";
  json b = body_of(s.post("/v1/completions", req));
  // At least the prompt's full blocks (all but the last token when every block is full).
  const int64_t cached = b["usage"]["prompt_tokens_details"]["cached_tokens"];
  EXPECT_GE(cached, n / 16 * 16 - (n % 16 == 0 ? 1 : 0));
  EXPECT_LE(cached, n);
  // segments: documents tokenized one by one before the prompt.
  const std::string doc1 = std::string("Document one: ").append(long_prompt(20));
  const std::string doc2 = std::string("Document two: ").append(long_prompt(25));
  json seg{{"model", "tiny"}, {"segments", {doc1, doc2}},
           {"prompt", " Question?"}, {"max_tokens", 2}, {"reuse", "prefix"}};
  HttpResponse sr = s.post("/v1/completions", seg);
  ASSERT_EQ(sr.status, 200) << sr.body;
  const Tokenizer& tok = tiny_engine().tokenizer();
  const size_t expect = tok.encode(doc1).size() + tok.encode(doc2, false).size() + tok.encode(" Question?", false).size();
  EXPECT_EQ(body_of(sr)["usage"]["prompt_tokens"], int64_t(expect));
  // The same documents in the other order, repaired by a gradual cacheblend given in full.
  seg["segments"] = {doc2, doc1};
  seg["reuse"] = {{"mode", "cacheblend"}, {"blend_ratio", 0.2}, {"blend_first_ratio", 0.6}, {"blend_taper_layers", 2}};
  HttpResponse br = s.post("/v1/completions", seg);
  ASSERT_EQ(br.status, 200) << br.body;
  EXPECT_GT(body_of(br)["kvboost"]["recomputed_tokens"].get<int64_t>(), 0) << br.body;
  // The guard, off and always on: a guarded request recomputes every reused token past its
  // exact prefix.
  seg["segments"] = {"A new first segment moves both documents.", doc2, doc1};
  seg["temperature"] = 0;
  seg["max_tokens"] = 6;
  seg["reuse"] = {{"mode", "cacheblend"}, {"guard_lead", 0}, {"store", false}};
  json off = body_of(s.post("/v1/completions", seg));
  EXPECT_EQ(off["kvboost"]["guarded"], false) << off.dump();
  seg["reuse"] = {{"mode", "cacheblend"}, {"guard_lead", 1e6}, {"store", false}};
  json on = body_of(s.post("/v1/completions", seg));
  EXPECT_EQ(on["kvboost"]["guarded"], true) << on.dump();
  // (the first approximate prompt of this mode: nothing learned yet, the threshold is guard_lead)
  EXPECT_EQ(on["kvboost"]["guard_lead"].get<double>(), 1e6) << on.dump();
  EXPECT_LT(on["kvboost"]["first_lead"].get<double>(), 1e6) << on.dump();
  EXPECT_EQ(off["kvboost"]["guard_lead"].get<double>(), 0.0) << off.dump();  // (off)
  EXPECT_EQ(off["kvboost"]["first_lead"], on["kvboost"]["first_lead"]) << off.dump();
  EXPECT_EQ(on["kvboost"]["recomputed_tokens"].get<int64_t>(),
            on["kvboost"]["reused_tokens"].get<int64_t>() - on["kvboost"]["cached_prefix_tokens"].get<int64_t>())
      << on.dump();
  // ... and answers as a full prefill does (another tenant's salt: nothing cached to reuse).
  json fresh = seg;
  fresh["reuse"] = "prefix";
  fresh["cache_salt"] = "guard-fresh";
  json full = body_of(s.post("/v1/completions", fresh));
  EXPECT_EQ(full["kvboost"]["reused_tokens"], 0) << full.dump();
  EXPECT_EQ(on["choices"][0]["text"], full["choices"][0]["text"]);
  // Warm a chat conversation too.
  json wc{{"model", "tiny"}, {"messages", json::array({{{"role", "user"}, {"content", long_prompt(30)}}})}};
  EXPECT_EQ(s.post("/v1/warm", wc).status, 200);
}

TEST(Server, GracefulShutdownFinishesInFlight) {
  ServerOptions o;
  o.step_delay_ms = 5;
  o.shutdown_grace_s = 20;
  TestServer s(tiny_engine(), o);
  json req = completion_req("shutdown", 30);
  req["stream"] = true;
  HttpStream st;
  ASSERT_TRUE(st.open("127.0.0.1", s.port, "POST", "/v1/completions", req.dump()));
  std::string d;
  ASSERT_TRUE(st.next_event(d));
  std::thread stopper([&] { s.srv->stop(); });
  std::vector<std::string> ev = read_events(st);
  stopper.join();
  ASSERT_GE(ev.size(), 2u);
  EXPECT_EQ(ev.back(), "[DONE]");
  EXPECT_EQ(json::parse(ev[ev.size() - 2])["choices"][0]["finish_reason"], "length");
  // The socket is closed.
  std::string why;
  EXPECT_EQ(server::http_request("127.0.0.1", s.port, "GET", "/health", "", {}, 2000, &why).status, 0);
}

TEST(Server, ShutdownGraceZeroCancels) {
  ServerOptions o;
  o.step_delay_ms = 10;
  o.shutdown_grace_s = 0;
  TestServer s(tiny_engine(), o);
  json req = completion_req("cancel me", 1000);
  req["stream"] = true;
  HttpStream st;
  ASSERT_TRUE(st.open("127.0.0.1", s.port, "POST", "/v1/completions", req.dump()));
  std::string d;
  ASSERT_TRUE(st.next_event(d));
  s.srv->stop();
  std::vector<std::string> ev = read_events(st);
  ASSERT_GE(ev.size(), 2u);
  EXPECT_EQ(ev.back(), "[DONE]");
  EXPECT_TRUE(json::parse(ev[ev.size() - 2]).contains("error"));
  EXPECT_EQ(tiny_engine().kv_stats().blocks_used, 0);
}

TEST(Server, Stories260kHasNoChatTemplate) {
  const std::string dir = test::model_path("stories260K");
  KVBOOST_REQUIRE_PATH(dir);
  auto engine = Engine::load(dir);
  ServerOptions o;
  o.model_name = "stories260K";
  TestServer s(*engine, o, dir);
  json e = expect_error(
      s.post("/v1/chat/completions",
             json{{"model", "stories260K"}, {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}}),
      400, "no chat template");
  EXPECT_EQ(e["code"], "no_chat_template");
  HttpResponse r = s.post("/v1/completions", json{{"model", "stories260K"}, {"prompt", "Once upon a time"}, {"max_tokens", 16}, {"temperature", 0}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_FALSE(body_of(r)["choices"][0]["text"].get<std::string>().empty());
  // A SentencePiece model's completion continues the prompt: "Once upon a" + " time", with the
  // space (decode of the generated ids alone strips it), and the logprob tokens join to the text.
  r = s.post("/v1/completions", json{{"model", "stories260K"}, {"prompt", "Once upon a"}, {"max_tokens", 6},
                                     {"temperature", 0}, {"logprobs", 2}});
  ASSERT_EQ(r.status, 200) << r.body;
  const json b = body_of(r);
  const std::string text = b["choices"][0]["text"];
  EXPECT_EQ(text.rfind(" time", 0), 0u) << text;
  std::string joined;
  for (const auto& t : b["choices"][0]["logprobs"]["tokens"]) joined += t.get<std::string>();
  EXPECT_EQ(joined, text);
  EXPECT_TRUE(b["choices"][0]["logprobs"]["top_logprobs"][0].contains(" time")) << b.dump();
}

// kvboost serve --chat-template (ServerOptions::chat_config): a model without a template of its
// own answers chat requests through the given one (issue 20).
TEST(Server, ChatConfigGivesAModelATemplate) {
  const std::string dir = test::model_path("stories260K");
  KVBOOST_REQUIRE_PATH(dir);
  auto engine = Engine::load(dir);
  ServerOptions o;
  o.model_name = "stories260K";
  o.chat_config = with_chat_template(read_file(dir + "/tokenizer_config.json"), *builtin_chat_template("chatml"));
  TestServer s(*engine, o, dir);
  HttpResponse r = s.post("/v1/chat/completions", json{{"model", "stories260K"}, {"max_tokens", 4}, {"temperature", 0},
                                                       {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}});
  ASSERT_EQ(r.status, 200) << r.body;
  // the prompt is the ChatML rendering of the one message: its tokens, as the engine counts them
  const std::string prompt = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ(body_of(r)["usage"]["prompt_tokens"], engine->tokenizer().encode(prompt, false).size());
}

// Speculative decoding over HTTP: the body's "speculative" knobs, the response's
// kvboost.speculative, the /metrics counters, and a bad mode answered 400.
TEST(Server, SpeculativeFieldStatsAndMetrics) {
  TestServer s(tiny_engine());
  const std::string prompt = "one two three four one two three four one two three four one two";
  json req = completion_req(prompt, 24);
  req["temperature"] = 0;
  req["speculative"] = {{"mode", "off"}};
  json off = body_of(s.post("/v1/completions", req));
  req["speculative"] = {{"mode", "lookup"}, {"draft_tokens", 4}, {"ngram", 2}};
  json on = body_of(s.post("/v1/completions", req));
  EXPECT_EQ(on["choices"][0]["text"], off["choices"][0]["text"]);  // greedy: the same tokens
  EXPECT_EQ(off["kvboost"]["speculative"]["drafted"], 0) << off.dump();
  ASSERT_TRUE(on["kvboost"]["speculative"].contains("acceptance_rate")) << on.dump();
  EXPECT_GE(on["kvboost"]["speculative"]["tokens_per_pass"].get<double>(), 1.0) << on.dump();
  const std::string mt = s.get("/metrics").body;
  EXPECT_NE(mt.find("kvboost_spec_draft_tokens_total "), std::string::npos);
  EXPECT_NE(mt.find("kvboost_spec_accepted_tokens_total "), std::string::npos);
  req["speculative"] = {{"mode", "fast"}};
  EXPECT_EQ(s.post("/v1/completions", req).status, 400);
  req["speculative"] = {{"mode", "draft"}};  // no draft model loaded: the engine's Error
  EXPECT_EQ(s.post("/v1/completions", req).status, 400);
}

}  // namespace
}  // namespace kvboost

