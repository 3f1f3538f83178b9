// A chunk store never serves another model's K/V (issue 27): two random-weight fixtures of the
// same shape and tokenizer (seeds 1 and 2) share one store, on disk and in RAM, and B's answer
// is B's own; a renamed copy of A still hits A's entries.
// Catches: the engine's old identity (shape + weight byte count + rope theta), under which B
// took 399 of 400 prompt tokens from A's store and printed A-flavoured text.
#include <filesystem>

#include "kvboost/runtime.h"
#include "testing/fixture.h"
#include "test_util.h"

using namespace kvboost;
namespace fs = std::filesystem;

namespace {

std::string fixture(const std::string& name, uint64_t seed) {
  const std::string dir = test::make_temp_dir(name);
  FixtureSpec s = fixture_preset("tiny");
  s.seed = seed;
  write_fixture_model(dir, s);
  return dir;
}

const std::string kDoc =
    "The harbour town woke early. Fishing boats left before dawn and came back at noon with nets full of silver "
    "fish. In the market, sellers called out prices while children ran between the stalls. An old man mended "
    "a sail by the water, and gulls circled over the roofs of the houses near the pier. ";

std::vector<int32_t> prompt(const Engine& e, std::vector<int64_t>* segs) {
  const Tokenizer& t = e.tokenizer();
  std::vector<int32_t> ids = t.encode("Read this.", true);
  segs->assign({int64_t(ids.size())});
  const auto d = t.encode(kDoc + kDoc, false);
  ids.insert(ids.end(), d.begin(), d.end());
  segs->push_back(int64_t(ids.size()));
  const auto q = t.encode(" What did the old man do?", false);
  ids.insert(ids.end(), q.begin(), q.end());
  return ids;
}

EngineOptions opts(const std::string& disk = "") {
  EngineOptions eo;
  eo.chunk_size = 32;
  eo.chunk_store.disk_dir = disk;
  return eo;
}

GenerateOptions gen(const std::vector<int64_t>& segs, ReuseMode m) {
  GenerateOptions o;
  o.max_new_tokens = 12;
  o.ignore_eos = true;
  o.sampling.temperature = 0.0f;
  o.segment_starts = segs;
  o.reuse.mode = m;
  o.reuse.guard_lead = 0;
  return o;
}

// B alone: its greedy output with no store at all.
std::vector<int32_t> alone(const std::string& dir, const std::vector<int32_t>& ids, const std::vector<int64_t>& segs) {
  EngineOptions eo = opts();
  eo.chunk_store.ram_bytes = 0;
  auto e = Engine::load(dir, eo);
  GenerateOptions o = gen(segs, ReuseMode::kPrefixOnly);
  o.prefix_cache = false;
  return e->generate_ids(ids, o).output_ids;
}

TEST(ChunkIdentity, SameShapeModelsNeverHitEachOthersDiskEntries) {
  const std::string a = fixture("cid_disk_a", 1), b = fixture("cid_disk_b", 2);
  const std::string store = test::make_temp_dir("cid_disk_store");
  std::vector<int64_t> segs;
  std::vector<int32_t> ids;
  std::string id_a;
  std::vector<int32_t> a_hit;  // A's answer from its own entries (bit-exact K/V: the copy's must equal it)
  {
    auto ea = Engine::load(a, opts(store));
    ids = prompt(*ea, &segs);
    ASSERT_GT(ids.size(), 150u);
    ea->warm(ids, segs);
    ea->chunk_store()->flush();
    ASSERT_GT(ea->chunk_store()->stats().entries_disk, 3);
    id_a = ea->model_id();
    a_hit = ea->generate_ids(ids, gen(segs, ReuseMode::kPrefixOnly)).output_ids;
  }
  const std::vector<int32_t> b_alone = alone(b, ids, segs);
  for (ReuseMode m : {ReuseMode::kPrefixOnly, ReuseMode::kCacheBlend}) {
    SCOPED_TRACE(reuse_mode_name(m));
    auto eb = Engine::load(b, opts(store));
    EXPECT_NE(eb->model_id(), id_a);
    GenerateOptions o = gen(segs, m);
    o.reuse.store = false;
    const GenerateResult r = eb->generate_ids(ids, o);
    EXPECT_EQ(r.n_reused, 0) << "B took K/V from A's entries";
    EXPECT_EQ(r.output_ids, b_alone);
    const kv::ChunkStats s = eb->chunk_store()->stats();
    EXPECT_EQ(s.entries_disk, 0) << "A's files are not B's entries";
    EXPECT_EQ(s.prefix_hits + s.content_hits, 0);
  }
  // A renamed copy of A (another directory, new inodes) is the same model: it hits.
  const std::string copy = test::make_temp_dir("cid_disk_copy");
  fs::remove_all(copy);
  fs::copy(a, copy, fs::copy_options::recursive);
  auto ec = Engine::load(copy, opts(store));
  EXPECT_EQ(ec->model_id(), id_a);
  const GenerateResult r = ec->generate_ids(ids, gen(segs, ReuseMode::kPrefixOnly));
  EXPECT_EQ(r.n_cached, int64_t(ids.size()) - 1);
  EXPECT_GT(ec->chunk_store()->stats().disk_loads, 0);
  EXPECT_EQ(r.output_ids, a_hit);
  EXPECT_TRUE(fs::exists(store + "/model-identity.cache"));
}

TEST(ChunkIdentity, SameShapeModelsShareOneRamStoreWithoutMixing) {
  const std::string a = fixture("cid_ram_a", 1), b = fixture("cid_ram_b", 2);
  auto ea = Engine::load(a, opts());
  kv::ChunkStoreOptions so;
  so.ram_bytes = size_t(64) << 20;
  auto shared = std::make_shared<kv::ChunkStore>(ea->chunk_store()->shape(), so);
  EngineOptions eo = opts();
  eo.shared_chunk_store = shared;
  ea = Engine::load(a, eo);
  auto eb = Engine::load(b, eo);
  EXPECT_EQ(ea->chunk_store(), eb->chunk_store());
  std::vector<int64_t> segs;
  const std::vector<int32_t> ids = prompt(*ea, &segs);
  ea->warm(ids, segs);
  const std::vector<int32_t> a_hit = ea->generate_ids(ids, gen(segs, ReuseMode::kPrefixOnly)).output_ids;
  const int64_t entries = shared->stats().entries;
  const int64_t hits0 = shared->stats().prefix_hits + shared->stats().content_hits;  // A's own
  ASSERT_GT(entries, 3);
  for (ReuseMode m : {ReuseMode::kPrefixOnly, ReuseMode::kNone, ReuseMode::kCacheBlend}) {
    SCOPED_TRACE(reuse_mode_name(m));
    GenerateOptions o = gen(segs, m);
    o.reuse.store = false;
    const GenerateResult r = eb->generate_ids(ids, o);
    EXPECT_EQ(r.n_reused, 0) << "B took K/V from A's entries";
    EXPECT_EQ(r.output_ids, alone(b, ids, segs));
  }
  EXPECT_EQ(shared->stats().prefix_hits + shared->stats().content_hits, hits0) << "B hit an entry";
  // B stores its own entries beside A's; each model then hits only its own.
  eb->warm(ids, segs);
  EXPECT_EQ(shared->stats().entries, 2 * entries);
  const std::string copy = test::make_temp_dir("cid_ram_copy");
  fs::remove_all(copy);
  fs::copy(a, copy, fs::copy_options::recursive);
  auto ec = Engine::load(copy, eo);
  const GenerateResult r = ec->generate_ids(ids, gen(segs, ReuseMode::kPrefixOnly));
  EXPECT_EQ(r.n_cached, int64_t(ids.size()) - 1);
  EXPECT_EQ(r.output_ids, a_hit);
  // A store of another shape is refused.
  auto other = std::make_shared<kv::ChunkStore>(kv::ChunkShape{1, 1, 8}, so);
  EngineOptions bad = opts();
  bad.shared_chunk_store = other;
  EXPECT_THROW(Engine::load(a, bad), Error);
}

}  // namespace
