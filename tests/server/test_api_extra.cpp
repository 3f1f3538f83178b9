// The rest of the API surface over real HTTP on loopback (issue 22): /tokenize and /detokenize
// (llama.cpp's and vLLM's shapes), /v1/embeddings' 501, logit_bias, n > 1 from one prefill,
// prompt lists, FIM (`suffix`) refused without FIM tokens and accepted on a fixture vocabulary
// with them, the kvboost:* metrics and --metrics-no-auth, the request log line.
#include <gtest/gtest.h>

#include <signal.h>

#include <filesystem>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "api.h"
#include "http.h"
#include "metrics.h"
#include "kvboost/model.h"
#include "kvboost/server.h"
#include "kvboost/tokenizer.h"
#include "testing/fixture.h"
#include "test_util.h"

namespace kvboost {
namespace {

using json = nlohmann::ordered_json;
using server::HttpResponse;

const std::string& tiny_dir() {
  static const std::string dir = [] {
    const std::string d = test::make_temp_dir("api_extra_tiny");
    write_fixture_model(d, fixture_preset("tiny"));
    return d;
  }();
  return dir;
}

// The tiny model with Qwen2.5-Coder's FIM tokens added to its (byte-level fixture) vocabulary.
const std::string& fim_dir() {
  static const std::string dir = [] {
    const std::string tokdir = test::make_temp_dir("api_extra_fim_tok");
    json t = json::parse(make_fixture_tokenizer_json("bytelevel", 512, 7));
    int next = 0;
    for (const auto& a : t["added_tokens"]) next = std::max(next, a["id"].get<int>() + 1);
    for (const char* s : {"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"})
      t["added_tokens"].push_back({{"id", next++}, {"content", s}, {"single_word", false}, {"lstrip", false},
                                   {"rstrip", false}, {"normalized", false}, {"special", true}});
    std::ofstream(tokdir + "/tokenizer.json") << t.dump();
    std::ofstream(tokdir + "/tokenizer_config.json") << make_fixture_tokenizer_config_json("bytelevel");
    const std::string d = test::make_temp_dir("api_extra_fim");
    FixtureSpec spec = fixture_preset("tiny");
    spec.tokenizer_dir = tokdir;
    spec.vocab = 0;
    write_fixture_model(d, spec);
    return d;
  }();
  return dir;
}

Engine& engine_for(const std::string& dir) {
  static std::map<std::string, std::unique_ptr<Engine>> engines;
  auto& e = engines[dir];
  if (!e) {
    EngineOptions eo;
    eo.max_batch = 4;
    e = Engine::load(dir, eo);
  }
  return *e;
}

struct TestServer {
  std::unique_ptr<Server> srv;
  int port = 0;
  explicit TestServer(const std::string& dir, ServerOptions o = {}) {
    signal(SIGPIPE, SIG_IGN);
    o.host = "127.0.0.1";
    o.port = 0;
    o.model_dir = dir;
    o.model_name = "tiny";
    srv = std::make_unique<Server>(engine_for(dir), o);
    srv->start();
    port = srv->port();
  }
  HttpResponse get(const std::string& path, const server::Headers& h = {}) const {
    return server::http_request("127.0.0.1", port, "GET", path, "", h);
  }
  HttpResponse post(const std::string& path, const json& body, const server::Headers& h = {}) const {
    return server::http_request("127.0.0.1", port, "POST", path, body.dump(), h);
  }
};

json ok_body(const HttpResponse& r) {
  EXPECT_EQ(r.status, 200) << r.body;
  try {
    return json::parse(r.body);
  } catch (const std::exception&) {
    ADD_FAILURE() << "not JSON: " << r.body;
    return json::object();
  }
}

json error_of(const HttpResponse& r, int status) {
  EXPECT_EQ(r.status, status) << r.body;
  json b = json::parse(r.body, nullptr, false);
  EXPECT_TRUE(b.is_object() && b.contains("error")) << r.body;
  return b.is_object() && b.contains("error") ? b["error"] : json::object();
}

std::string words(int n, const std::string& tag) {
  std::string s;
  for (int i = 0; i < n; ++i) s += (i ? " " : "") + tag + std::to_string(i % 5);
  return s;
}

TEST(ApiExtra, TokenizeDetokenizeRoundTripBothShapes) {
  TestServer s(tiny_dir());
  const std::string text = "Hello, KV cache! 123";
  // llama.cpp: content, add_special default false, with_pieces.
  const json a = ok_body(s.post("/tokenize", {{"content", text}}));
  ASSERT_TRUE(a["tokens"].is_array());
  ASSERT_GT(a["tokens"].size(), 0u);
  const Tokenizer& tok = engine_for(tiny_dir()).tokenizer();
  EXPECT_EQ(a["tokens"].get<std::vector<int32_t>>(), tok.encode(text, false));
  const json back = ok_body(s.post("/detokenize", {{"tokens", a["tokens"]}}));
  EXPECT_EQ(back["content"], text);
  EXPECT_EQ(back["prompt"], text);
  const json pieces = ok_body(s.post("/tokenize", {{"content", text}, {"with_pieces", true}}));
  ASSERT_EQ(pieces["tokens"].size(), a["tokens"].size());
  EXPECT_EQ(pieces["tokens"][0]["id"], a["tokens"][0]);
  EXPECT_TRUE(pieces["tokens"][0]["piece"].is_string());
  // vLLM: prompt, add_special_tokens default true; count and max_model_len.
  const json v = ok_body(s.post("/tokenize", {{"model", "tiny"}, {"prompt", text}}));
  EXPECT_EQ(v["tokens"].get<std::vector<int32_t>>(), tok.encode(text, true));
  EXPECT_EQ(v["count"], v["tokens"].size());
  EXPECT_EQ(v["max_model_len"], 2048);
  // Bad input names the field.
  EXPECT_EQ(error_of(s.post("/detokenize", {{"tokens", {1, 999999}}}), 400)["param"], "tokens");
  EXPECT_EQ(error_of(s.post("/detokenize", json::object()), 400)["param"], "tokens");
  EXPECT_EQ(error_of(s.post("/tokenize", {{"content", 5}}), 400)["param"], "content");
  EXPECT_EQ(error_of(s.post("/tokenize", json::object()), 400)["param"], "prompt");
  const json e = error_of(s.post("/v1/embeddings", {{"input", "x"}}), 501);
  EXPECT_NE(e["message"].get<std::string>().find("causal"), std::string::npos);
  EXPECT_EQ(error_of(s.get("/tokenize"), 405)["code"], "method_not_allowed");
}

TEST(ApiExtra, LogitBiasForcesATokenAndIsRangeChecked) {
  TestServer s(tiny_dir());
  const json t = ok_body(s.post("/tokenize", {{"content", "q"}}));
  ASSERT_EQ(t["tokens"].size(), 1u);
  const int id = t["tokens"][0];
  for (const char* path : {"/v1/completions", "/v1/chat/completions"}) {
    json req = {{"model", "tiny"}, {"max_tokens", 6}, {"temperature", 1.0}, {"seed", 3}, {"ignore_eos", true},
                {"logit_bias", {{std::to_string(id), 100}}}};
    if (std::string(path) == "/v1/completions") req["prompt"] = "once upon";
    else req["messages"] = {{{"role", "user"}, {"content", "hi"}}};
    const json b = ok_body(s.post(path, req));
    const std::string text =
        std::string(path) == "/v1/completions" ? b["choices"][0]["text"] : b["choices"][0]["message"]["content"];
    EXPECT_EQ(text, "qqqqqq") << path;
  }
  auto bias = [&](const json& lb) {
    return s.post("/v1/completions", {{"model", "tiny"}, {"prompt", "x"}, {"max_tokens", 1}, {"logit_bias", lb}});
  };
  EXPECT_EQ(error_of(bias({{"5", 101}}), 400)["param"], "logit_bias");
  EXPECT_EQ(error_of(bias({{"5", "high"}}), 400)["param"], "logit_bias");
  EXPECT_EQ(error_of(bias({{"abc", 1}}), 400)["param"], "logit_bias");
  EXPECT_EQ(error_of(bias({{"99999999", 1}}), 400)["param"], "logit_bias");
  EXPECT_EQ(error_of(bias(json::array({1})), 400)["param"], "logit_bias");
  EXPECT_EQ(ok_body(bias({{"5", -100}}))["choices"].size(), 1u);
}

TEST(ApiExtra, NChoicesShareOnePrefill) {
  TestServer s(tiny_dir());
  const json req = {{"model", "tiny"},       {"prompt", words(60, "n")}, {"max_tokens", 5},
                    {"temperature", 1.0},    {"seed", 11},               {"n", 3},
                    {"ignore_eos", true},    {"cache_salt", "n3-nonstream"}};
  const json b = ok_body(s.post("/v1/completions", req));
  ASSERT_EQ(b["choices"].size(), 3u);
  const int64_t n_prompt = b["usage"]["prompt_tokens"];
  ASSERT_GT(n_prompt, 32);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(b["choices"][i]["index"], i);
    EXPECT_TRUE(b["choices"][i]["text"].is_string());
  }
  // The prompt is prefilled once: choice 0 computes it, choices 1 and 2 find its blocks.
  EXPECT_EQ(b["choices"][0]["kvboost"]["cached_prefix_tokens"], 0);
  for (int i = 1; i < 3; ++i) EXPECT_GE(b["choices"][i]["kvboost"]["cached_prefix_tokens"].get<int64_t>(), n_prompt / 2) << i;
  EXPECT_EQ(b["usage"]["completion_tokens"], 15);
  // Seeds seed + index: choice i equals a single request with seed 11 + i.
  json one = req;
  one.erase("n");
  one["seed"] = 12;
  EXPECT_EQ(ok_body(s.post("/v1/completions", one))["choices"][0]["text"], b["choices"][1]["text"]);
  // Chat, streamed: every choice's deltas carry its index, and each choice finishes.
  server::HttpStream st;
  json creq = {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", words(20, "c")}}}}, {"max_tokens", 4},
               {"n", 2},          {"stream", true},  {"ignore_eos", true}, {"temperature", 0.8}};
  ASSERT_TRUE(st.open("127.0.0.1", s.port, "POST", "/v1/chat/completions", creq.dump()));
  ASSERT_EQ(st.status(), 200);
  std::string d;
  std::map<int, std::string> text;
  std::map<int, int> finished;
  bool done = false;
  while (st.next_event(d)) {
    if (d == "[DONE]") {
      done = true;
      continue;
    }
    const json ev = json::parse(d);
    ASSERT_EQ(ev["choices"].size(), 1u) << d;
    const int idx = ev["choices"][0]["index"];
    if (ev["choices"][0]["delta"].contains("content")) text[idx] += ev["choices"][0]["delta"]["content"].get<std::string>();
    if (!ev["choices"][0]["finish_reason"].is_null()) ++finished[idx];
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(finished, (std::map<int, int>{{0, 1}, {1, 1}}));
  EXPECT_EQ(text.size(), 2u);
  // n and best_of are range-checked.
  EXPECT_EQ(error_of(s.post("/v1/completions", {{"prompt", "x"}, {"n", 0}}), 400)["param"], "n");
  EXPECT_EQ(error_of(s.post("/v1/completions", {{"prompt", "x"}, {"n", 1000}}), 400)["param"], "n");
}

// best_of > n: best_of candidates per prompt (seeds seed + candidate), the n with the highest
// cumulative log-probability returned best first; the ranking's own logprobs stay out unless
// asked for; every candidate's tokens are in usage; 400s for best_of < n, too large, or stream.
TEST(ApiExtra, BestOfReturnsTheMostLikelyCandidates) {
  TestServer s(tiny_dir());
  const std::string prompt = words(30, "b");
  const json req = {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 4}, {"temperature", 1.0}, {"seed", 21},
                    {"n", 2},          {"best_of", 5},     {"ignore_eos", true}};
  const json b = ok_body(s.post("/v1/completions", req));
  ASSERT_EQ(b["choices"].size(), 2u);
  EXPECT_EQ(b["usage"]["completion_tokens"], 20);  // all 5 candidates were generated
  EXPECT_TRUE(b["choices"][0]["logprobs"].is_null());
  // Each candidate i is the single request with seed 21 + i; rank them by their logprobs.
  std::vector<std::pair<double, std::string>> cands;
  for (int i = 0; i < 5; ++i) {
    json one = {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 4}, {"temperature", 1.0}, {"seed", 21 + i},
                {"ignore_eos", true}, {"logprobs", 0}};
    const json r = ok_body(s.post("/v1/completions", one));
    double sum = 0;
    for (const auto& lp : r["choices"][0]["logprobs"]["token_logprobs"]) sum += lp.get<double>();
    cands.push_back({sum, r["choices"][0]["text"]});
  }
  std::vector<size_t> order = {0, 1, 2, 3, 4};
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return cands[x].first > cands[y].first; });
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(b["choices"][i]["index"], i);
    EXPECT_EQ(b["choices"][i]["text"], cands[order[size_t(i)]].second) << i;
    EXPECT_NEAR(b["choices"][i]["kvboost"]["cumulative_logprob"].get<double>(), cands[order[size_t(i)]].first, 1e-3);
    EXPECT_EQ(b["choices"][i]["kvboost"]["candidate"], order[size_t(i)]);
  }
  EXPECT_GE(b["choices"][0]["kvboost"]["cumulative_logprob"].get<double>(),
            b["choices"][1]["kvboost"]["cumulative_logprob"].get<double>());
  // With logprobs asked for, the returned choices carry theirs.
  json lreq = req;
  lreq["logprobs"] = 1;
  const json lb = ok_body(s.post("/v1/completions", lreq));
  EXPECT_EQ(lb["choices"][0]["logprobs"]["tokens"].size(), 4u);
  // best_of = n is plain n; chat takes best_of too.
  json eq = req;
  eq["best_of"] = 2;
  EXPECT_EQ(ok_body(s.post("/v1/completions", eq))["usage"]["completion_tokens"], 8);
  const json cb = ok_body(s.post("/v1/chat/completions", {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}},
                                                          {"max_tokens", 3}, {"best_of", 3}, {"ignore_eos", true}}));
  EXPECT_EQ(cb["choices"].size(), 1u);
  EXPECT_EQ(cb["usage"]["completion_tokens"], 9);
  auto err = [&](const json& extra) {
    json r = {{"model", "tiny"}, {"prompt", "x"}, {"max_tokens", 2}};
    for (const auto& [k, v] : extra.items()) r[k] = v;
    return error_of(s.post("/v1/completions", r), 400);
  };
  const json lt = err({{"n", 3}, {"best_of", 2}});
  EXPECT_EQ(lt["param"], "best_of");
  EXPECT_NE(lt["message"].get<std::string>().find("at least 'n'"), std::string::npos) << lt;
  EXPECT_EQ(err({{"best_of", 65}})["param"], "best_of");
  EXPECT_EQ(err({{"best_of", 0}})["param"], "best_of");
  const json st = err({{"best_of", 2}, {"stream", true}});
  EXPECT_EQ(st["param"], "best_of");
  EXPECT_NE(st["message"].get<std::string>().find("cannot be streamed"), std::string::npos) << st;
}

// Streaming with n > 1 and logprobs: each choice's logprobs arrive in its own chunks (its index),
// and joined they equal the non-streamed choice's.
TEST(ApiExtra, StreamedLogprobsPerChoice) {
  TestServer s(tiny_dir());
  for (const bool chat : {false, true}) {
    json req = {{"model", "tiny"}, {"max_tokens", 5}, {"temperature", 1.0}, {"seed", 4}, {"n", 2}, {"ignore_eos", true}};
    if (chat) {
      req["messages"] = {{{"role", "user"}, {"content", words(10, "l")}}};
      req["logprobs"] = true;
      req["top_logprobs"] = 1;
    } else {
      req["prompt"] = words(10, "l");
      req["logprobs"] = 1;
    }
    const char* path = chat ? "/v1/chat/completions" : "/v1/completions";
    const json whole = ok_body(s.post(path, req));
    req["stream"] = true;
    server::HttpStream st;
    ASSERT_TRUE(st.open("127.0.0.1", s.port, "POST", path, req.dump()));
    ASSERT_EQ(st.status(), 200);
    std::string d;
    std::map<int, std::vector<std::string>> tokens;
    std::map<int, std::string> text;
    while (st.next_event(d)) {
      if (d == "[DONE]") continue;
      const json ev = json::parse(d);
      const json& c = ev["choices"][0];
      const int idx = c["index"];
      if (chat && c["delta"].contains("content")) text[idx] += c["delta"]["content"].get<std::string>();
      if (!chat) text[idx] += c["text"].get<std::string>();
      if (c["logprobs"].is_null()) continue;
      if (chat)
        for (const auto& t : c["logprobs"]["content"]) tokens[idx].push_back(t["token"]);
      else
        for (const auto& t : c["logprobs"]["tokens"]) tokens[idx].push_back(t);
    }
    ASSERT_EQ(tokens.size(), 2u) << chat;
    for (int i = 0; i < 2; ++i) {
      const json& wc = whole["choices"][i];
      std::vector<std::string> want;
      if (chat)
        for (const auto& t : wc["logprobs"]["content"]) want.push_back(t["token"]);
      else
        for (const auto& t : wc["logprobs"]["tokens"]) want.push_back(t);
      EXPECT_EQ(tokens[i], want) << "chat " << chat << " choice " << i;
      EXPECT_EQ(text[i], chat ? wc["message"]["content"].get<std::string>() : wc["text"].get<std::string>());
    }
  }
}

TEST(ApiExtra, PromptListGivesOneChoicePerPromptInOrder) {
  TestServer s(tiny_dir());
  const std::vector<std::string> prompts = {"alpha beta", "gamma", "delta epsilon zeta"};
  const json b = ok_body(s.post("/v1/completions", {{"model", "tiny"}, {"prompt", prompts}, {"max_tokens", 3},
                                                   {"temperature", 0}, {"ignore_eos", true}, {"echo", true}}));
  ASSERT_EQ(b["choices"].size(), 3u);
  const Tokenizer& tok = engine_for(tiny_dir()).tokenizer();
  int64_t n_prompt = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(b["choices"][i]["index"], i);
    // echo puts each choice's own prompt first; greedy: the same as the prompt alone.
    const std::string t = b["choices"][i]["text"];
    EXPECT_EQ(t.rfind(prompts[i], 0), 0u) << t;
    const json alone = ok_body(s.post("/v1/completions", {{"model", "tiny"}, {"prompt", prompts[i]}, {"max_tokens", 3},
                                                         {"temperature", 0}, {"ignore_eos", true}}));
    EXPECT_EQ(t, prompts[i] + alone["choices"][0]["text"].get<std::string>());
    n_prompt += int64_t(tok.encode(prompts[i], true).size());
  }
  EXPECT_EQ(b["usage"]["prompt_tokens"], n_prompt);
  // Token-id prompts in a list; a bad element names prompt.
  const json ids = ok_body(s.post("/v1/completions", {{"prompt", {{1, 2, 3}, {4, 5}}}, {"max_tokens", 1}}));
  EXPECT_EQ(ids["choices"].size(), 2u);
  EXPECT_EQ(error_of(s.post("/v1/completions", {{"prompt", {"a", 5}}, {"max_tokens", 1}}), 400)["param"], "prompt");
}

TEST(ApiExtra, SuffixIsFimWithFimTokensAndA400Without) {
  {
    TestServer s(tiny_dir());
    const json e = error_of(s.post("/v1/completions", {{"prompt", "def f(x):"}, {"suffix", "return y"}, {"max_tokens", 2}}), 400);
    EXPECT_EQ(e["param"], "suffix");
    EXPECT_NE(e["message"].get<std::string>().find("fim_prefix"), std::string::npos) << e.dump();
    EXPECT_EQ(error_of(s.post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"suffix", "y"}}), 400)["param"],
              "suffix");
  }
  TestServer s(fim_dir());
  const Tokenizer& tok = engine_for(fim_dir()).tokenizer();
  const auto fim = server::find_fim_tokens(tok);
  ASSERT_TRUE(fim.has_value());
  const json b = ok_body(s.post("/v1/completions", {{"prompt", "def f(x):"}, {"suffix", "return y"}, {"max_tokens", 3},
                                                   {"temperature", 0}, {"ignore_eos", true}}));
  ASSERT_EQ(b["choices"].size(), 1u);
  // The prompt the model saw: <|fim_prefix|> prefix <|fim_suffix|> suffix <|fim_middle|>.
  std::vector<int32_t> want = {fim->prefix};
  for (int32_t t : tok.encode("def f(x):", false)) want.push_back(t);
  want.push_back(fim->suffix);
  for (int32_t t : tok.encode("return y", false)) want.push_back(t);
  want.push_back(fim->middle);
  EXPECT_EQ(b["usage"]["prompt_tokens"], want.size());
  json ids = want;
  const json same = ok_body(s.post("/v1/completions", {{"prompt", ids}, {"max_tokens", 3}, {"temperature", 0}, {"ignore_eos", true}}));
  EXPECT_EQ(same["choices"][0]["text"], b["choices"][0]["text"]);
}

TEST(ApiExtra, VllmMetricsAndMetricsNoAuth) {
  {
  ServerOptions o;
  o.api_keys = {"secret"};
  o.metrics_no_auth = true;
  TestServer s(tiny_dir(), o);
  const server::Headers auth = {{"Authorization", "Bearer secret"}};
  ok_body(s.post("/v1/completions", {{"prompt", words(10, "m")}, {"max_tokens", 4}, {"ignore_eos", true}}, auth));
  EXPECT_EQ(s.post("/v1/completions", {{"prompt", "x"}}).status, 401);  // the API still needs the key
  const HttpResponse m = s.get("/metrics");                          // /metrics does not
  ASSERT_EQ(m.status, 200) << m.body;
  for (const char* k : {"# TYPE kvboost:time_to_first_token_seconds histogram",
                        "kvboost:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"+Inf\"} ",
                        "# TYPE kvboost:inter_token_latency_seconds histogram", "kvboost:e2e_request_latency_seconds_count{model_name=\"tiny\"} ",
                        "# TYPE kvboost:request_queue_time_seconds histogram", "# TYPE kvboost:request_prefill_time_seconds histogram",
                        "# TYPE kvboost:kv_cache_usage_perc gauge", "# TYPE kvboost:num_preemptions_total counter",
                        "kvboost:prefix_cache_queries_total{model_name=\"tiny\"} ", "kvboost:prefix_cache_hits_total{model_name=\"tiny\"} ",
                        "kvboost_http_responses_total"})
    EXPECT_NE(m.body.find(k), std::string::npos) << k;
  // The histograms are cumulative and end in the count.
  const std::string itl_inf = "kvboost:inter_token_latency_seconds_bucket{model_name=\"tiny\",le=\"+Inf\"} ";
  const size_t at = m.body.find(itl_inf);
  ASSERT_NE(at, std::string::npos);
  EXPECT_GE(std::atoll(m.body.c_str() + at + itl_inf.size()), 3);
  }  // one server on the engine at a time (each has its scheduler thread)
  ServerOptions locked;
  locked.api_keys = {"secret"};
  TestServer l(tiny_dir(), locked);
  EXPECT_EQ(l.get("/metrics").status, 401);
}

TEST(ApiExtra, RequestLogLine) {
  const std::string line = server::request_log_line("POST", "/v1/completions", 200, 12, 8, 5, 3.5, 40.5);
  for (const char* k : {"status=200", "POST /v1/completions", "prompt_tokens=12", "cached_tokens=8", "completion_tokens=5",
                        "ttft_ms=3.5", "total_ms=40.5"})
    EXPECT_NE(line.find(k), std::string::npos) << k << " in " << line;
  EXPECT_EQ(line[4], '-');  // starts with an ISO-8601 UTC timestamp
  EXPECT_EQ(line.substr(19, 1), "Z");
}

}  // namespace
}  // namespace kvboost
