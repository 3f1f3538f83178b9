// tokenizer_fixture_writer OUT_DIR: writes OUT_DIR/{bytelevel,sentencepiece}/tokenizer.json and
// tokenizer_config.json from make_fixture_tokenizer_json, for the differential test.
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>

#include "kvboost/tokenizer.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  try {
    for (const char* kind : {"bytelevel", "sentencepiece"}) {
      std::filesystem::path d = std::filesystem::path(argv[1]) / kind;
      std::filesystem::create_directories(d);
      std::ofstream(d / "tokenizer.json") << kvboost::make_fixture_tokenizer_json(kind, 1024, 7);
      std::ofstream(d / "tokenizer_config.json") << kvboost::make_fixture_tokenizer_config_json(kind);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tokenizer_fixture_writer: %s\n", e.what());
    return 1;
  }
  return 0;
}
