// The chunk store's remote tier against a real redis-server on loopback (started and killed by
// each test): round trip, one object per chunk, tenant and model isolation, corrupt values, TTL,
// the size cap, the cost model, and failures (down at start, killed mid-run and restarted, full,
// slow through a delaying proxy, a full write queue).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <thread>

#include "../../src/kv/remote_store.h"
#include "kvboost/kv.h"
#include "redis_server.h"
#include "test_util.h"

namespace kvboost::kv {
namespace {

using test::DelayProxy;
using test::RedisServer;

const ChunkShape kShape{2, 2, 8};

ChunkStoreOptions remote_opts(const std::string& url, const std::string& model = "model-a") {
  ChunkStoreOptions o;
  o.ram_bytes = size_t(16) << 20;
  o.model_id = model;
  o.remote_url = url;
  return o;
}

// A chunk of n tokens (values from seed) with the keys the engine would give it in namespace ns.
std::shared_ptr<Chunk> make_chunk(int64_t n, int seed, const std::string& model, const std::string& ns,
                                  bool exact = true, KvQuant q = KvQuant::kF32) {
  auto c = std::make_shared<Chunk>();
  for (int64_t i = 0; i < n; ++i) c->tokens.push_back(int32_t(seed * 1000 + i));
  const uint64_t root = chunk_root(model, ns);
  c->keys = chunk_keys(chunk_first_keys(root), root, c->tokens);
  if (!exact) c->keys.prefix = c->keys.check = 0;
  chunk_init(*c, kShape, q, n);
  std::mt19937 rng{uint32_t(seed)};
  std::normal_distribution<float> d;
  std::vector<float> k(size_t(n * kShape.row())), v(k.size());
  for (int64_t l = 0; l < kShape.n_layers; ++l) {
    for (auto& x : k) x = d(rng);
    for (auto& x : v) x = d(rng);
    chunk_put_layer(*c, kShape, l, k.data(), v.data());
  }
  return c;
}

ChunkQuery query_of(const Chunk& c) { return ChunkQuery{c.keys, c.tokens}; }

TEST(RemoteUrl, Forms) {
  RemoteUrl u = parse_remote_url("redis://10.0.0.5:6380/3");
  EXPECT_EQ(u.host, "10.0.0.5");
  EXPECT_EQ(u.port, 6380);
  EXPECT_EQ(u.db, 3);
  u = parse_remote_url("redis://kvb:s3cret@cache.local?prefix=prod-a");
  EXPECT_EQ(u.user, "kvb");
  EXPECT_EQ(u.password, "s3cret");
  EXPECT_EQ(u.host, "cache.local");
  EXPECT_EQ(u.port, 6379);
  EXPECT_EQ(u.prefix, "prod-a");
  u = parse_remote_url("unix:///run/redis/redis.sock?db=2");
  EXPECT_EQ(u.socket, "/run/redis/redis.sock");
  EXPECT_EQ(u.db, 2);
  EXPECT_EQ(redact_remote_url("redis://kvb:s3cret@cache.local:6379"), "redis://kvb:***@cache.local:6379");
  EXPECT_EQ(redact_remote_url("redis://s3cret@cache.local"), "redis://***@cache.local");
  EXPECT_EQ(redact_remote_url("redis://cache.local:6379/2"), "redis://cache.local:6379/2");
  try {
    parse_remote_url("redis://kvb:s3cret@cache.local:port");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find("s3cret"), std::string::npos) << e.what();
  }
  for (const char* bad : {"http://x", "redis://", "redis://h:99999", "redis://h/x", "unix://rel.sock", "redis://h?zz=1"})
    EXPECT_THROW(parse_remote_url(bad), Error) << bad;
  try {
    parse_remote_url("rediss://h:6380");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("TLS"), std::string::npos) << e.what();
  }
}

TEST(RemoteValue, KeyAndVerification) {
  auto c = make_chunk(40, 1, "model-a", "u:t1", true, KvQuant::kInt8);
  const uint64_t mh = chunk_root("model-a", "\x01model");
  const std::string key = remote_key("kvboost", mh, "u:t1", true, c->keys.prefix);
  EXPECT_NE(key.find(":v1:u%3At1:p"), std::string::npos) << key;  // layout version, escaped namespace
  const std::string v = encode_remote_value(*c, kShape, "model-a", mh, "u:t1");
  EXPECT_EQ(v.size(), remote_value_bytes(kShape, KvQuant::kInt8, 40, "model-a", "u:t1"));
  const Chunk d = decode_remote_value(v, kShape, "model-a", mh, "u:t1", key);
  EXPECT_EQ(d.tokens, c->tokens);
  EXPECT_EQ(d.data, c->data);
  EXPECT_EQ(d.quant, KvQuant::kInt8);
  EXPECT_THROW(decode_remote_value(v, kShape, "model-a", mh, "u:t2", key), Error);  // another tenant
  EXPECT_THROW(decode_remote_value(v, kShape, "model-b", chunk_root("model-b", "\x01model"), "u:t1", key), Error);
  EXPECT_THROW(decode_remote_value(v.substr(0, v.size() - 1), kShape, "model-a", mh, "u:t1", key), Error);
  std::string flipped = v;
  flipped[flipped.size() - 3] ^= 0x10;  // one payload bit
  EXPECT_THROW(decode_remote_value(flipped, kShape, "model-a", mh, "u:t1", key), Error);
}

TEST(RemoteStore, RoundTripBetweenTwoStores) {
  KVBOOST_REQUIRE_REDIS();
  RedisServer redis;
  auto c = make_chunk(64, 7, "model-a", "u:t");
  auto cc = make_chunk(32, 8, "model-a", "u:t", /*exact=*/false);
  {
    ChunkStore a(kShape, remote_opts(redis.url()));
    a.put(c, false, "u:t");
    a.put(cc, false, "u:t");
    a.flush();
    EXPECT_EQ(a.stats().remote.writes, 2);
  }
  // One object per chunk, under prefix + model + layout version + namespace + kind/key; the
  // exact chunk under its content key too (a second complete object, not a pointer).
  const std::vector<std::string> keys = redis.keys("kvboost:*");
  ASSERT_EQ(keys.size(), 3u);
  ChunkStore b(kShape, remote_opts(redis.url()));
  EXPECT_EQ(b.find_prefix(c->keys, c->tokens), nullptr);  // not local yet
  const ChunkQuery q[] = {query_of(*c), query_of(*cc)};
  EXPECT_EQ(b.fetch_remote("u:t", q, /*content=*/true), 2);
  const ChunkStats s = b.stats();
  EXPECT_EQ(s.remote.hits, 2);
  EXPECT_EQ(s.remote.fetches, 1);  // one round trip for the prompt
  // The exact chunk's bytes came once, not once per key (the pair script).
  EXPECT_EQ(s.remote.bytes, int64_t(remote_value_bytes(kShape, KvQuant::kF32, 64, "model-a", "u:t") +
                                    remote_value_bytes(kShape, KvQuant::kF32, 32, "model-a", "u:t")));
  auto hit = b.find_prefix(c->keys, c->tokens);
  ASSERT_NE(hit, nullptr);  // promoted to RAM
  EXPECT_EQ(hit->data, c->data);
  auto chit = b.find_content(cc->keys.content, cc->tokens);
  ASSERT_NE(chit, nullptr);
  EXPECT_EQ(chit->data, cc->data);
  // Already local: not asked again.
  EXPECT_EQ(b.fetch_remote("u:t", q, true), 0);
  EXPECT_EQ(b.stats().remote.fetches, 1);
  // Promoted chunks are not written back.
  b.flush();
  EXPECT_EQ(b.stats().remote.writes, 0);
}

TEST(RemoteStore, UnixSocket) {
  KVBOOST_REQUIRE_REDIS();
  const std::string sock = test::make_temp_dir("remote_unix") + "/redis.sock";
  RedisServer redis(0, {"--unixsocket", sock, "--unixsocketperm", "700"});
  auto c = make_chunk(16, 4, "model-a", "u:");
  const std::string url = "unix://" + sock + "?db=2&prefix=sock";
  {
    ChunkStore a(kShape, remote_opts(url));
    a.put(c, false, "u:");
    a.flush();
    EXPECT_EQ(a.stats().remote.writes, 1);
  }
  EXPECT_EQ(redis.cmd({"DBSIZE"}), "0");  // written to database 2, not 0
  ChunkStore b(kShape, remote_opts(url));
  const ChunkQuery q[] = {query_of(*c)};
  EXPECT_EQ(b.fetch_remote("u:", q, true), 1);
}

TEST(RemoteStore, TenantAndModelIsolation) {
  KVBOOST_REQUIRE_REDIS();
  RedisServer redis;
  auto c = make_chunk(64, 3, "model-a", "u:t1");
  {
    ChunkStore a(kShape, remote_opts(redis.url()));
    a.put(c, false, "u:t1");
    a.flush();
  }
  // The same keys and tokens asked for by another tenant: a miss (its key differs).
  ChunkStore b(kShape, remote_opts(redis.url()));
  const ChunkQuery q[] = {query_of(*c)};
  EXPECT_EQ(b.fetch_remote("u:t2", q, true), 0);
  EXPECT_EQ(b.stats().remote.misses, 1);
  // Another model never hits, even when its key is made to hold model-a's value.
  const std::string ka = redis.keys("kvboost:*").at(0);
  ChunkStoreOptions ob = remote_opts(redis.url(), "model-b");
  ChunkStore m(kShape, ob);
  EXPECT_EQ(m.fetch_remote("u:t1", q, true), 0);
  const uint64_t mhb = chunk_root("model-b", "\x01model");
  const std::string kb = remote_key("kvboost", mhb, "u:t1", true, c->keys.prefix);
  EXPECT_NE(kb, ka);
  redis.cmd({"COPY", ka, kb});
  // and a tenant's key holding another tenant's value is rejected as well
  redis.cmd({"COPY", ka, remote_key("kvboost", chunk_root("model-a", "\x01model"), "u:t2", true, c->keys.prefix)});
  EXPECT_EQ(m.fetch_remote("u:t1", q, true), 0);
  EXPECT_EQ(m.stats().remote.corrupt, 1);
  EXPECT_EQ(m.find_prefix(c->keys, c->tokens), nullptr);
  EXPECT_EQ(b.fetch_remote("u:t2", q, true), 0);
  EXPECT_EQ(b.stats().remote.corrupt, 1);
}

TEST(RemoteStore, CorruptValuesAreMisses) {
  KVBOOST_REQUIRE_REDIS();
  RedisServer redis;
  auto c1 = make_chunk(64, 11, "model-a", "u:");
  auto c2 = make_chunk(64, 12, "model-a", "u:");
  {
    ChunkStore a(kShape, remote_opts(redis.url()));
    a.put(c1, false, "u:");
    a.put(c2, false, "u:");
    a.flush();
  }
  const uint64_t mh = chunk_root("model-a", "\x01model");
  const std::string k1 = remote_key("kvboost", mh, "u:", true, c1->keys.prefix);
  const std::string k2 = remote_key("kvboost", mh, "u:", true, c2->keys.prefix);
  std::string v = redis.cmd({"GET", k1});
  v[v.size() / 2] ^= 0x01;  // a flipped bit in the payload
  redis.cmd({"SET", k1, v});
  redis.cmd({"SET", k2, "garbage"});
  ChunkStore b(kShape, remote_opts(redis.url()));
  const ChunkQuery q[] = {query_of(*c1), query_of(*c2)};
  EXPECT_EQ(b.fetch_remote("u:", q, true), 0);
  EXPECT_EQ(b.stats().remote.corrupt, 2);
  EXPECT_EQ(b.find_prefix(c1->keys, c1->tokens), nullptr);
  // Recomputed and stored again: the SET replaces the bad value.
  b.put(c1, false, "u:");
  b.flush();
  ChunkStore d(kShape, remote_opts(redis.url()));
  EXPECT_EQ(d.fetch_remote("u:", q, true), 1);
  auto hit = d.find_prefix(c1->keys, c1->tokens);
  ASSERT_NE(hit, nullptr);
  EXPECT_EQ(hit->data, c1->data);
}

TEST(RemoteStore, TtlAndSizeCap) {
  KVBOOST_REQUIRE_REDIS();
  RedisServer redis;
  ChunkStoreOptions o = remote_opts(redis.url());
  o.remote_ttl_s = 120;
  o.remote_max_entry_bytes = remote_value_bytes(kShape, KvQuant::kF32, 64, "model-a", "u:");
  ChunkStore a(kShape, o);
  a.put(make_chunk(64, 1, "model-a", "u:"), false, "u:");
  a.put(make_chunk(65, 2, "model-a", "u:"), false, "u:");  // one token over the cap
  a.flush();
  const std::vector<std::string> keys = redis.keys("kvboost:*");
  ASSERT_EQ(keys.size(), 2u);  // the 64-token chunk under its prefix and its content key
  for (const auto& k : keys) EXPECT_GT(std::stoi(redis.cmd({"TTL", k})), 100) << k;
  const int ttl = std::stoi(redis.cmd({"TTL", keys[0]}));
  EXPECT_GT(ttl, 100);
  EXPECT_LE(ttl, 120);
  EXPECT_EQ(a.stats().remote.too_big, 1);
  const std::vector<RemoteEntryInfo> list = a.list_remote(100);
  ASSERT_EQ(list.size(), 2u);
  for (const auto& e : list) {
    EXPECT_EQ(e.problem, "") << e.key;
    EXPECT_EQ(e.n_tokens, 64);
    EXPECT_EQ(e.ns, "u:");
    EXPECT_GT(e.ttl_s, 100);
  }
}

// A document computed exactly on one server (after other text, at another position) is a
// content hit on another: the exact chunk was written under its content key too. Prefix-only
// lookups (reuse mode prefix) do not take it; another tenant does not see it; and without EVAL
// (an ACL user without +eval) the lookup falls back to MGET of both keys.
TEST(RemoteStore, ExactChunkIsAContentHitElsewhere) {
  KVBOOST_REQUIRE_REDIS();
  RedisServer redis;
  auto c = make_chunk(48, 5, "model-a", "u:t");
  const uint64_t root = chunk_root("model-a", "u:t");
  c->keys = chunk_keys(chunk_keys(chunk_first_keys(root), root, std::vector<int32_t>{1, 2, 3}), root, c->tokens);
  c->pos0 = 3;
  {
    ChunkStore a(kShape, remote_opts(redis.url()));
    a.put(c, false, "u:t");
    a.flush();
  }
  auto at_start = make_chunk(48, 5, "model-a", "u:t");  // the same tokens at position 0, other prefix key
  ASSERT_NE(at_start->keys.prefix, c->keys.prefix);
  ASSERT_EQ(at_start->keys.content, c->keys.content);
  const ChunkQuery q[] = {query_of(*at_start)};
  {
    ChunkStore b(kShape, remote_opts(redis.url()));
    EXPECT_EQ(b.fetch_remote("u:t", q, /*content=*/false), 0);
    EXPECT_EQ(b.fetch_remote("u:t2", q, true), 0);
    EXPECT_EQ(b.fetch_remote("u:t", q, true), 1);
    EXPECT_EQ(b.find_prefix(at_start->keys, at_start->tokens), nullptr);  // not exact here
    auto hit = b.find_content(c->keys.content, c->tokens);
    ASSERT_NE(hit, nullptr);
    EXPECT_EQ(hit->pos0, 3);  // re-rotated by the engine's copy-in, like a local content hit
    EXPECT_EQ(hit->data, c->data);
  }
  redis.cmd({"ACL", "SETUSER", "noeval", "on", ">pw", "~*", "+@all", "-eval", "-evalsha"});
  const std::string url = "redis://noeval:pw@127.0.0.1:" + std::to_string(redis.port());
  ChunkStore d(kShape, remote_opts(url));
  EXPECT_EQ(d.fetch_remote("u:t", q, true), 1);
  EXPECT_NE(d.find_content(c->keys.content, c->tokens), nullptr);
  EXPECT_EQ(d.stats().remote.corrupt, 0);
}

TEST(RemoteStore, CostModelSkipsWhatIsCheaperToRecompute) {
  KVBOOST_REQUIRE_REDIS();
  RedisServer redis;
  auto c = make_chunk(64, 5, "model-a", "u:");
  {
    ChunkStore a(kShape, remote_opts(redis.url()));
    a.put(c, false, "u:");
    a.flush();
  }
  ChunkStore b(kShape, remote_opts(redis.url()));
  // A prefill of 64 tokens in a microsecond: no round trip can beat it.
  b.note_prefill(1 << 20, 0.001);
  const ChunkQuery q[] = {query_of(*c)};
  EXPECT_EQ(b.fetch_remote("u:", q, true), 0);
  EXPECT_EQ(b.stats().remote.skipped, 1);
  EXPECT_EQ(b.stats().remote.fetches, 0);
  // A slow prefill (10 tokens/s): fetching wins.
  ChunkStore s(kShape, remote_opts(redis.url()));
  s.note_prefill(10, 1000);
  EXPECT_EQ(s.fetch_remote("u:", q, true), 1);
  EXPECT_EQ(s.stats().remote.skipped, 0);
}

TEST(RemoteStore, DownAtStartThenUp) {
  KVBOOST_REQUIRE_REDIS();
  const int port = test::free_loopback_port();
  auto c = make_chunk(64, 9, "model-a", "u:");
  ChunkStore b(kShape, remote_opts("redis://127.0.0.1:" + std::to_string(port)));
  EXPECT_FALSE(b.stats().remote.up);
  const ChunkQuery q[] = {query_of(*c)};
  EXPECT_EQ(b.fetch_remote("u:", q, true), 0);  // no throw, a miss
  EXPECT_GE(b.stats().remote.unavailable, 1);
  b.put(make_chunk(64, 10, "model-a", "u:"), false, "u:");  // dropped, never thrown
  b.flush();
  EXPECT_EQ(b.stats().remote.writes, 0);
  // The server appears: the writer's probe reconnects (backoff 100 ms .. 5 s), lookups resume.
  RedisServer redis(port);
  {
    ChunkStore a(kShape, remote_opts(redis.url()));
    a.put(c, false, "u:");
    a.flush();
  }
  int64_t got = 0;
  for (int i = 0; i < 100 && !got; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    got = b.fetch_remote("u:", q, true);
  }
  EXPECT_EQ(got, 1);
  EXPECT_TRUE(b.stats().remote.up);
}

TEST(RemoteStore, KilledMidRunAndRestarted) {
  KVBOOST_REQUIRE_REDIS();
  auto redis = std::make_unique<RedisServer>();
  const int port = redis->port();
  auto c1 = make_chunk(64, 21, "model-a", "u:");
  auto c2 = make_chunk(64, 22, "model-a", "u:");
  ChunkStore a(kShape, remote_opts(redis->url()));
  ChunkStore b(kShape, remote_opts(redis->url()));
  a.put(c1, false, "u:");
  a.flush();
  const ChunkQuery q1[] = {query_of(*c1)}, q2[] = {query_of(*c2)};
  EXPECT_EQ(b.fetch_remote("u:", q1, true), 1);
  redis->kill();
  a.put(c2, false, "u:");  // the write fails in the background
  a.flush();
  EXPECT_EQ(b.fetch_remote("u:", q2, true), 0);  // the connection breaks: a miss, no throw
  EXPECT_GE(b.stats().remote.errors, 1);
  EXPECT_FALSE(b.stats().remote.up);
  EXPECT_EQ(b.fetch_remote("u:", q2, true), 0);  // backing off: not even tried
  EXPECT_GE(b.stats().remote.unavailable, 1);
  redis = std::make_unique<RedisServer>(port);  // restarted, empty
  ChunkStore w(kShape, remote_opts(redis->url()));
  w.put(c2, false, "u:");
  w.flush();
  int64_t got = 0;
  for (int i = 0; i < 100 && !got; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    got = b.fetch_remote("u:", q2, true);
  }
  EXPECT_EQ(got, 1);
}

TEST(RemoteStore, FullRedisRefusesWrites) {
  KVBOOST_REQUIRE_REDIS();
  RedisServer redis(0, {"--maxmemory", "2mb", "--maxmemory-policy", "noeviction"});
  ChunkStoreOptions o = remote_opts(redis.url());
  o.remote_queue = 1000;
  ChunkStore a(kShape, o);
  for (int i = 0; i < 400; ++i) a.put(make_chunk(128, 100 + i, "model-a", "u:"), false, "u:");  // ~16 KiB each
  a.flush();
  const RemoteStats s = a.stats().remote;
  EXPECT_GT(s.writes, 0);
  EXPECT_GT(s.write_errors, 0);  // OOM command not allowed when used memory > 'maxmemory'
  EXPECT_TRUE(s.up);             // an error reply is not an outage
  // Lookups still work for what was stored.
  ChunkStore b(kShape, o);
  auto c = make_chunk(128, 100, "model-a", "u:");
  const ChunkQuery q[] = {query_of(*c)};
  EXPECT_EQ(b.fetch_remote("u:", q, true), 1);
}

TEST(RemoteStore, SlowRedisAndFullQueue) {
  KVBOOST_REQUIRE_REDIS();
  RedisServer redis;
  DelayProxy slow(redis.port(), 10);  // +20 ms per round trip
  auto c = make_chunk(64, 31, "model-a", "u:");
  ChunkStoreOptions o = remote_opts(slow.url());
  o.remote_queue = 1;
  {
    ChunkStore a(kShape, o);
    for (int i = 0; i < 8; ++i) a.put(make_chunk(64, 40 + i, "model-a", "u:"), false, "u:");
    a.put(c, false, "u:");
    a.flush();
    EXPECT_GT(a.stats().remote.write_drops, 0);  // the queue holds one; the rest are dropped, counted
  }
  {
    ChunkStore a(kShape, remote_opts(redis.url()));
    a.put(c, false, "u:");
    a.flush();
  }
  const ChunkQuery q[] = {query_of(*c)};
  // Through the slow link, a fast prefill makes fetching not worth it...
  ChunkStore b(kShape, remote_opts(slow.url()));
  EXPECT_GE(b.stats().remote.rtt_ms, 15.0);  // measured at connect
  b.note_prefill(64, 1.0);                   // 64 tokens in 1 ms
  EXPECT_EQ(b.fetch_remote("u:", q, true), 0);
  EXPECT_EQ(b.stats().remote.skipped, 1);
  // ... and a slow one makes it worth it.
  ChunkStore s(kShape, remote_opts(slow.url()));
  s.note_prefill(64, 1e4);  // 6.4 tokens/s
  EXPECT_EQ(s.fetch_remote("u:", q, true), 1);
  EXPECT_GE(s.stats().remote.fetch_ms_sum, 15.0);
}

}  // namespace
}  // namespace kvboost::kv
