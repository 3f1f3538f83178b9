// Two servers (each its own engine) sharing one real redis-server through --chunk-remote, over
// real HTTP on loopback: a prompt warmed on A is a hit on B with the same first tokens as B's
// full prefill; tenants stay apart; Redis killed mid-run fails no request; a corrupt entry is
// detected and recomputed. Skipped without redis-server unless KVBOOST_REQUIRE_REDIS=1.
#include <gtest/gtest.h>

#include <signal.h>

#include <memory>

#include <nlohmann/json.hpp>

#include "http.h"
#include "kvboost/model.h"
#include "kvboost/server.h"
#include "testing/fixture.h"
#include "redis_server.h"
#include "test_util.h"

namespace kvboost {
namespace {

using json = nlohmann::ordered_json;
using test::RedisServer;

const std::string& tiny_dir() {
  static const std::string dir = [] {
    const std::string d = test::make_temp_dir("remote_server_tiny");
    write_fixture_model(d, fixture_preset("tiny"));
    return d;
  }();
  return dir;
}

// A fresh engine per server: its cost model has not measured a prefill yet, so its first
// lookup is always made (later ones compare the fetch with the measured prefill rate).
std::unique_ptr<Engine> remote_engine(const std::string& url) {
  EngineOptions eo;
  eo.max_batch = 4;
  eo.chunk_size = 32;
  eo.chunk_store.remote_url = url;
  return Engine::load(tiny_dir(), eo);
}

struct Node {  // an engine and its server on an ephemeral port
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Server> srv;
  explicit Node(const std::string& url) : engine(remote_engine(url)) {
    signal(SIGPIPE, SIG_IGN);
    ServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.model_dir = tiny_dir();
    o.model_name = "tiny";
    srv = std::make_unique<Server>(*engine, o);
    srv->start();
  }
  json post(const std::string& path, const json& body) const {
    const server::HttpResponse r = server::http_request("127.0.0.1", srv->port(), "POST", path, body.dump(), {});
    EXPECT_EQ(r.status, 200) << path << ": " << r.body;
    return json::parse(r.body);
  }
  json remote_stats() const {
    const server::HttpResponse r = server::http_request("127.0.0.1", srv->port(), "GET", "/v1/stats", "", {});
    return json::parse(r.body)["chunks"]["remote"];
  }
  std::string metrics() const { return server::http_request("127.0.0.1", srv->port(), "GET", "/metrics", "", {}).body; }
};

std::string rag_prompt(int words) {
  std::string s = "Document: ";
  for (int i = 0; i < words; ++i) s += (i % 3 ? "cache" : "block") + std::to_string(i % 7) + (i % 10 == 9 ? ". " : " ");
  return s + "Question: which block?";
}

json completion(const std::string& prompt, const std::string& salt) {
  return json{{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 4}, {"temperature", 0},
              {"ignore_eos", true}, {"cache_salt", salt}};
}

int64_t cached_tokens(const json& r) { return r["usage"]["prompt_tokens_details"]["cached_tokens"]; }

TEST(RemoteServer, WarmedOnAIsAHitOnB) {
  KVBOOST_REQUIRE_REDIS();
  RedisServer redis;
  Node a(redis.url());
  const std::string prompt = rag_prompt(60);
  const json w = a.post("/v1/warm", json{{"model", "tiny"}, {"prompt", prompt}, {"cache_salt", "rag"}});
  EXPECT_GT(w["prompt_tokens"].get<int64_t>(), 64);
  EXPECT_GT(a.remote_stats()["writes"].get<int64_t>(), 0);  // /v1/warm returns after the writes
  Node b(redis.url());
  const json hit = b.post("/v1/completions", completion(prompt, "rag"));
  EXPECT_GT(cached_tokens(hit), 0) << hit.dump();
  EXPECT_GT(hit["kvboost"]["remote_chunks"].get<int64_t>(), 0) << hit.dump();
  // B's full prefill of the same prompt (another namespace: nothing cached) gives the same text.
  const json full = b.post("/v1/completions", completion(prompt, "rag-full"));
  EXPECT_EQ(cached_tokens(full), 0);
  EXPECT_EQ(hit["choices"][0]["text"], full["choices"][0]["text"]);
  const json rs = b.remote_stats();
  EXPECT_GT(rs["hits"].get<int64_t>(), 0);
  EXPECT_GT(rs["bytes"].get<int64_t>(), 0);
  const std::string m = b.metrics();
  EXPECT_NE(m.find("kvboost_chunk_remote_lookups_total{result=\"hit\"}"), std::string::npos);
  EXPECT_NE(m.find("kvboost_chunk_remote_fetch_ms_bucket{le=\"+Inf\"}"), std::string::npos);
}

TEST(RemoteServer, TenantsStayApart) {
  KVBOOST_REQUIRE_REDIS();
  RedisServer redis;
  Node a(redis.url());
  const std::string prompt = rag_prompt(60);
  a.post("/v1/warm", json{{"model", "tiny"}, {"prompt", prompt}, {"cache_salt", "tenant-1"}});
  Node b(redis.url());
  const json r = b.post("/v1/completions", completion(prompt, "tenant-2"));
  EXPECT_EQ(cached_tokens(r), 0);
  EXPECT_EQ(b.remote_stats()["hits"], 0);
  EXPECT_GT(b.remote_stats()["misses"].get<int64_t>(), 0);
}

TEST(RemoteServer, RedisKilledMidRunFailsNoRequest) {
  KVBOOST_REQUIRE_REDIS();
  RedisServer redis;
  Node a(redis.url());
  Node b(redis.url());
  const std::string prompt = rag_prompt(60);
  a.post("/v1/warm", json{{"model", "tiny"}, {"prompt", prompt}, {"cache_salt", "k"}});
  redis.kill();
  for (int i = 0; i < 4; ++i) {
    const json r = b.post("/v1/completions", completion(prompt + std::to_string(i), "k" + std::to_string(i)));
    EXPECT_EQ(r["usage"]["completion_tokens"], 4);
  }
  const json r = a.post("/v1/completions", completion(prompt + " again", "k"));  // writes fail in the background
  EXPECT_EQ(r["usage"]["completion_tokens"], 4);
  const json rs = b.remote_stats();
  EXPECT_FALSE(rs["up"].get<bool>());
  EXPECT_GT(rs["errors"].get<int64_t>() + rs["unavailable"].get<int64_t>(), 0);
}

TEST(RemoteServer, CorruptEntryIsRecomputed) {
  KVBOOST_REQUIRE_REDIS();
  RedisServer redis;
  Node a(redis.url());
  const std::string prompt = rag_prompt(60);
  a.post("/v1/warm", json{{"model", "tiny"}, {"prompt", prompt}, {"cache_salt", "c"}});
  const std::vector<std::string> keys = redis.keys("kvboost:*");
  ASSERT_FALSE(keys.empty());
  for (const auto& k : keys) {  // one flipped bit in every entry's payload
    std::string v = redis.cmd({"GET", k});
    v[v.size() - 5] ^= 0x04;
    redis.cmd({"SET", k, v});
  }
  Node b(redis.url());
  const json r = b.post("/v1/completions", completion(prompt, "c"));
  EXPECT_EQ(cached_tokens(r), 0);
  const json full = b.post("/v1/completions", completion(prompt, "c-full"));
  EXPECT_EQ(r["choices"][0]["text"], full["choices"][0]["text"]);
  // Every chunk is under its prefix key and its content key; a lookup brings one of the two (the
  // prefix entry when there is one), so each chunk's corrupt entry is counted once.
  EXPECT_EQ(b.remote_stats()["corrupt"].get<int64_t>(), int64_t(keys.size()) / 2);
  EXPECT_EQ(b.remote_stats()["hits"], 0);
}

// A document computed exactly on A (alone, at position 0) is found on B after other text, at
// another position: a content hit through the content key A wrote too, re-rotated and repaired
// like a local one. The lookup was issued at admission and its chunks copied in before the
// prefill reached them (the engine's overlapped path, not KVBOOST_REMOTE_SYNC).
TEST(RemoteServer, DocumentAtAnotherPositionIsAContentHit) {
  KVBOOST_REQUIRE_REDIS();
  RedisServer redis;
  auto a = remote_engine(redis.url()), b = remote_engine(redis.url());
  std::vector<int32_t> doc, intro;
  for (int i = 0; i < 96; ++i) doc.push_back(int32_t(20 + (i * 7) % 200));
  for (int i = 0; i < 40; ++i) intro.push_back(int32_t(30 + (i * 11) % 150));
  auto opts = [](std::vector<int64_t> starts) {
    GenerateOptions o;
    o.max_new_tokens = 3;
    o.sampling.temperature = 0;
    o.segment_starts = std::move(starts);
    o.cache_namespace = "doc";
    o.reuse.mode = ReuseMode::kSelective;
    return o;
  };
  GenerateOptions wa = opts({});
  wa.max_new_tokens = 1;
  a->generate_ids(doc, wa);
  a->chunk_store()->flush();
  std::vector<int32_t> prompt = intro;
  prompt.insert(prompt.end(), doc.begin(), doc.end());
  for (int i = 0; i < 8; ++i) prompt.push_back(int32_t(40 + i));
  GenerateOptions ob = opts({40, 136});
  ob.reuse.store = false;
  const GenerateResult r = b->generate_ids(prompt, ob);
  EXPECT_GT(r.n_remote_chunks, 0);
  EXPECT_GE(r.n_reused, 64) << "the document's chunks were not reused";
  EXPECT_TRUE(r.approximate || r.guarded);  // content hits: repaired, guarded
  EXPECT_EQ(r.output_ids.size(), 3u);
}

}  // namespace
}  // namespace kvboost
