// A GGUF file -> the reader (metadata, tensor table) and the config derived from it.
#include "fuzz_util.h"
#include "gguf.h"
#include "kvboost/model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = kvboost::fuzz::write_input(data, size, ".gguf");
  kvboost::fuzz::expect_clean([&] { kvboost::gguf::File f(path); });
  kvboost::fuzz::expect_clean([&] { (void)kvboost::ModelConfig::from_gguf(path); });
  return 0;
}
