// model_identity (src/model/identity.cpp): the key prefix of stored K/V. Two models whose K/V
// could differ never share it; a renamed copy of one model does.
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "kvboost/model.h"
#include "kvboost/tokenizer.h"
#include "testing/fixture.h"
#include "test_util.h"

using namespace kvboost;
namespace fs = std::filesystem;

namespace {

std::string fixture(const std::string& name, uint64_t seed, const std::string& quant = "",
                    const std::string& dequant_dir = "") {
  const std::string dir = test::make_temp_dir(name);
  FixtureSpec s = fixture_preset("tiny");
  s.seed = seed;
  s.intermediate = 192;  // a multiple of AWQ's group size
  s.quant = quant;
  s.group_size = 32;
  s.dequant_dir = dequant_dir;
  write_fixture_model(dir, s);
  return dir;
}

std::string identity_of(const std::string& dir, const std::string& kv_format = "f32", const std::string& cache = "") {
  auto m = Model::load(dir);
  const Tokenizer t = Tokenizer::from_dir(dir);
  return model_identity(*m, t, kv_format, cache);
}

TEST(ModelIdentity, SameShapeOtherWeightsDiffer) {
  const std::string a = fixture("ident_seed1", 1), b = fixture("ident_seed2", 2);
  const std::string ia = identity_of(a), ib = identity_of(b);
  EXPECT_EQ(ia.size(), 5u + 32u);
  EXPECT_EQ(ia.rfind("kvb1-", 0), 0u);
  EXPECT_NE(ia, ib) << "same shape and tokenizer, other weights";
  // Deterministic: the same file gives the same identity (also through a fresh load).
  EXPECT_EQ(identity_of(a), ia);
  // The stored K/V's encoding is part of it.
  EXPECT_NE(identity_of(a, "int8"), ia);
}

TEST(ModelIdentity, RenamedCopyIsTheSameModel) {
  const std::string a = fixture("ident_orig", 1);
  const std::string copy = test::make_temp_dir("ident_copy");
  fs::remove_all(copy);
  fs::copy(a, copy, fs::copy_options::recursive);
  fs::rename(copy + "/model.safetensors", copy + "/model.safetensors.tmp");  // new inode and mtime
  fs::rename(copy + "/model.safetensors.tmp", copy + "/model.safetensors");
  EXPECT_EQ(identity_of(copy), identity_of(a));
}

// The AWQ file and the f32 file holding exactly the values it represents: the same shape and
// nearly the same K/V, but not the same bytes.
TEST(ModelIdentity, QuantizedAndUnquantizedDiffer) {
  const std::string deq = test::make_temp_dir("ident_deq");
  const std::string awq = fixture("ident_awq", 1, "awq", deq);
  // (the dequantized directory has no tokenizer of its own: give it the same one)
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    if (fs::exists(awq + "/" + f)) fs::copy_file(awq + "/" + f, deq + "/" + f, fs::copy_options::overwrite_existing);
  auto ma = Model::load(awq), md = Model::load(deq);
  ASSERT_EQ(ma->config().hidden_size, md->config().hidden_size);
  ASSERT_EQ(ma->config().n_layers, md->config().n_layers);
  EXPECT_NE(identity_of(awq), identity_of(deq));
}

// A changed file (same path) is hashed again: neither the in-memory memo nor the disk cache
// serves the old hash.
TEST(ModelIdentity, CacheFollowsTheFile) {
  const std::string dir = test::make_temp_dir("ident_cache");
  const std::string f = dir + "/w.bin", cache = dir + "/identity.cache";
  std::ofstream(f) << "first contents";
  const std::string h1 = weight_file_hash(f, cache);
  EXPECT_EQ(weight_file_hash(f, cache), h1);
  std::ifstream in(cache);
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  EXPECT_EQ(line.substr(0, 32), h1);
  std::ofstream(f) << "other contents, other size";
  const std::string h2 = weight_file_hash(f, cache);
  EXPECT_NE(h2, h1);
  EXPECT_EQ(weight_file_hash(f), h2);
  EXPECT_THROW(weight_file_hash(dir + "/missing.bin"), Error);
}

}  // namespace
