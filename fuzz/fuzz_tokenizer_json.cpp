// tokenizer.json (before the first NUL) and tokenizer_config.json (after it) -> Tokenizer, then a
// short encode/decode round on the loaded tokenizer.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fuzz_util.h"
#include "kvboost/tokenizer.h"

// With KVBOOST_FUZZ_SEED_DIR set, writes the fixture tokenizers there first (seeds).
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("KVBOOST_FUZZ_SEED_DIR")) {
    for (const char* kind : {"bytelevel", "sentencepiece"}) {
      const std::string s = kvboost::make_fixture_tokenizer_json(kind, 300) + std::string(1, '\0') +
                            kvboost::make_fixture_tokenizer_config_json(kind);
      FILE* f = std::fopen((std::string(dir) + "/" + kind).c_str(), "wb");
      if (f) std::fwrite(s.data(), 1, s.size(), f), std::fclose(f);
    }
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string all(reinterpret_cast<const char*>(data), size);
  const size_t nul = all.find('\0');
  const std::string tj = all.substr(0, nul), cfg = nul == std::string::npos ? "" : all.substr(nul + 1);
  kvboost::fuzz::expect_clean([&] {
    kvboost::Tokenizer t = kvboost::Tokenizer::from_json(tj, cfg, "fuzz/tokenizer.json");
    const std::vector<int32_t> ids = t.encode("Hello, world! 123 \xc3\xa9", true);
    (void)t.decode(ids, false);
  });
  return 0;
}
