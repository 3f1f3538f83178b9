// config.json and generation_config.json texts -> ModelConfig::from_json. The input is split at
// the first NUL byte: before it config.json, after it generation_config.json.
#include <string>

#include "fuzz_util.h"
#include "kvboost/model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string all(reinterpret_cast<const char*>(data), size);
  const size_t nul = all.find('\0');
  const std::string cfg = all.substr(0, nul), gen = nul == std::string::npos ? "" : all.substr(nul + 1);
  kvboost::fuzz::expect_clean([&] {
    const kvboost::ModelConfig c = kvboost::ModelConfig::from_json(cfg, gen, "fuzz/config.json");
    if (c.n_layers < 1 || c.n_heads < 1 || c.head_dim < 1 || !(c.rope_theta > 0)) __builtin_trap();
  });
  return 0;
}
