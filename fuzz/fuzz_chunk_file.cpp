// A chunk-store file (.kvc) -> the start-up header check and the full read with its checksum.
// The shape and model hash are fixed; the seed corpus holds a valid file for them.
#include "chunk_file.h"
#include "fuzz_util.h"
#include "kvboost/kv.h"

#include <cstdlib>
#include <vector>

// With KVBOOST_FUZZ_SEED_DIR set, writes a valid chunk file there first (the seed: binary, so made
// by our own writer rather than committed).
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("KVBOOST_FUZZ_SEED_DIR")) {
    const kvboost::kv::ChunkShape shape{2, 2, 8};
    for (int q = 0; q < 3; ++q) {
      kvboost::kv::Chunk c;
      c.tokens = {1, 2, 3, 4, 5};
      c.keys = kvboost::kv::ChunkKeys{11, 12, 13};
      kvboost::kv::chunk_init(c, shape, kvboost::kv::KvQuant(q), 5);
      std::vector<float> k(size_t(5 * shape.row()), 0.5f), v(k.size(), -0.25f);
      for (int64_t l = 0; l < shape.n_layers; ++l) kvboost::kv::chunk_put_layer(c, shape, l, k.data(), v.data());
      kvboost::kv::write_chunk_file(std::string(dir) + "/seed" + std::to_string(q) + ".kvc", c, shape,
                                    kvboost::kv::chunk_root("fuzz-model", "\x01model"));
    }
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = kvboost::fuzz::write_input(data, size, ".kvc");
  const kvboost::kv::ChunkShape shape{2, 2, 8};
  const uint64_t model = kvboost::kv::chunk_root("fuzz-model", "\x01model");
  kvboost::fuzz::expect_clean([&] { (void)kvboost::kv::peek_chunk_file(path, shape, model); });
  kvboost::fuzz::expect_clean([&] {
    const kvboost::kv::Chunk c = kvboost::kv::read_chunk_file(path, shape, model);
    std::vector<float> k(size_t(c.tokens.size() * shape.row())), v(k.size());
    for (int64_t l = 0; l < shape.n_layers; ++l) kvboost::kv::chunk_get_layer(c, shape, l, k.data(), v.data());
  });
  return 0;
}
