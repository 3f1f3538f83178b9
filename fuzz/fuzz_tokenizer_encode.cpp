// Arbitrary bytes through the fixture tokenizers: encode (invalid UTF-8 is an Error), decode of
// arbitrary ids (out-of-range ids must be an Error, not a read past the vocabulary), and the
// incremental decoder, which must never emit half a UTF-8 character.
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "kvboost/tokenizer.h"

namespace {
kvboost::Tokenizer& tok(int i) {
  static kvboost::Tokenizer b = kvboost::Tokenizer::from_json(
      kvboost::make_fixture_tokenizer_json("bytelevel", 512), kvboost::make_fixture_tokenizer_config_json("bytelevel"));
  static kvboost::Tokenizer s = kvboost::Tokenizer::from_json(
      kvboost::make_fixture_tokenizer_json("sentencepiece", 512),
      kvboost::make_fixture_tokenizer_config_json("sentencepiece"));
  return i ? s : b;
}
}  // namespace

// The fixture tokenizers are trained here, before the first input: under ASan on a loaded machine
// that takes longer than libFuzzer's per-input timeout (it was reported as a timeout on the first,
// empty input).
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)tok(0), (void)tok(1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (int i = 0; i < 2; ++i) {
    kvboost::Tokenizer& t = tok(i);
    kvboost::fuzz::expect_clean([&] {
      const std::vector<int32_t> ids = t.encode(text, true);
      (void)t.decode(ids, false);
    });
    std::vector<int32_t> ids;
    for (size_t k = 0; k + 1 < size && ids.size() < 256; k += 2) ids.push_back(int32_t(data[k] | data[k + 1] << 8) - 1000);
    kvboost::fuzz::expect_clean([&] { (void)t.decode(ids, false); });
  }
  return 0;
}
