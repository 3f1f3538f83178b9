// The server over an engine with tensor parallelism (EngineOptions::tp = 2; `kvboost serve --tp
// 2`), over real HTTP on loopback: completions, streamed and not, and concurrent requests batched
// by the scheduler, give the text the same server gives over a tp = 1 engine. (The rank threads
// run under the HTTP handler threads' engine lock: this executable is in CI's TSan stage.)
#include <gtest/gtest.h>

#include <signal.h>

#include <future>

#include <nlohmann/json.hpp>

#include "http.h"
#include "kvboost/server.h"
#include "test_util.h"

namespace kvboost {
namespace {

using json = nlohmann::ordered_json;

struct TpServer {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Server> srv;
  TpServer(const std::string& dir, int tp) {
    signal(SIGPIPE, SIG_IGN);
    EngineOptions eo;
    eo.tp = tp;
    eo.max_batch = 4;
    engine = Engine::load(dir, eo);
    ServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.model_dir = dir;
    o.model_name = "stories260K";
    srv = std::make_unique<Server>(*engine, o);
    srv->start();
  }
  std::string complete(const std::string& prompt, bool stream) const {
    json req{{"model", "stories260K"}, {"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0}, {"ignore_eos", true}};
    if (!stream) {
      const server::HttpResponse r = server::http_request("127.0.0.1", srv->port(), "POST", "/v1/completions", req.dump());
      EXPECT_EQ(r.status, 200) << r.body;
      return json::parse(r.body)["choices"][0]["text"];
    }
    req["stream"] = true;
    server::HttpStream st;
    EXPECT_TRUE(st.open("127.0.0.1", srv->port(), "POST", "/v1/completions", req.dump()));
    std::string d, text;
    while (st.next_event(d))
      if (d != "[DONE]") text += json::parse(d)["choices"][0]["text"].get<std::string>();
    return text;
  }
};

const std::vector<std::string> kPrompts = {"Once upon a time", "The cat sat on the", "Lily and Ben went to the park",
                                           "One day, a little bird"};

TEST(ServerTp, CompletionsOverATp2EngineMatchTp1) {
  const std::string dir = test::model_path("stories260K");
  KVBOOST_REQUIRE_PATH(dir);
  std::vector<std::string> want;
  {
    TpServer one(dir, 1);
    for (const auto& p : kPrompts) want.push_back(one.complete(p, false));
  }
  TpServer two(dir, 2);
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    EXPECT_EQ(two.complete(kPrompts[i], false), want[i]) << kPrompts[i];
    EXPECT_EQ(two.complete(kPrompts[i], true), want[i]) << kPrompts[i] << " (streamed)";
  }
  // Concurrent clients: batched together in the scheduler's passes, each its own text.
  std::vector<std::future<std::string>> got;
  for (size_t i = 0; i < kPrompts.size(); ++i)
    got.push_back(std::async(std::launch::async, [&, i] { return two.complete(kPrompts[i], i % 2 == 1); }));
  for (size_t i = 0; i < kPrompts.size(); ++i) EXPECT_EQ(got[i].get(), want[i]) << kPrompts[i] << " (concurrent)";
}

}  // namespace
}  // namespace kvboost
