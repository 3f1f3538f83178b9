// A safetensors file (header and data) -> WeightFiles::open_file.
#include "fuzz_util.h"
#include "kvboost/model.h"
#include "kvboost/model_files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = kvboost::fuzz::write_input(data, size, ".safetensors");
  kvboost::fuzz::expect_clean([&] { (void)kvboost::WeightFiles::open_file(path); });
  return 0;
}
