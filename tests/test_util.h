// Helpers shared by the test programs.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace kvboost::test {

// ../shared (or $KVBOOST_SHARED_DIR) + "/" + rel.
std::string shared_path(const std::string& rel);
// The source tree and the build tree this test was configured from.
std::string source_dir();
std::string binary_dir();
// The models committed to the repository: models/ of the source tree (or $KVBOOST_MODELS_DIR)
// + "/" + rel, e.g. model_path("stories260K").
std::string model_path(const std::string& rel);
// True when KVBOOST_REQUIRE_ORACLES=1: a missing oracle is then a failure, not a skip.
bool oracles_required();
// A fresh empty directory under the build tree's temp area.
std::string make_temp_dir(const std::string& name);

}  // namespace kvboost::test

// Skips the test (or fails it when oracles are required) if `path` does not exist.
#define KVBOOST_REQUIRE_PATH(path)                                                   \
  do {                                                                               \
    if (!::kvboost::test::path_exists(path)) {                                       \
      if (::kvboost::test::oracles_required()) FAIL() << "missing oracle: " << (path); \
      GTEST_SKIP() << "missing " << (path) << " (oracle data not available)";         \
    }                                                                                \
  } while (0)

namespace kvboost::test {
bool path_exists(const std::string& path);
// The Gemma 3 270M Q4_K_M GGUF: $KVBOOST_GEMMA3_GGUF, else where scripts/gemma_path.sh puts it.
std::string gemma3_path();
// Names of the entries of a directory (no "." / ".."), sorted.
std::vector<std::string> list_dir(const std::string& dir);
}

// Skips the test when the Gemma 3 GGUF is missing (fails it when KVBOOST_REQUIRE_GEMMA3=1).
#define KVBOOST_REQUIRE_GEMMA3(path)                                             \
  do {                                                                           \
    if (!::kvboost::test::path_exists(path)) {                                   \
      const char* req_ = std::getenv("KVBOOST_REQUIRE_GEMMA3");                  \
      if (req_ && std::string(req_) == "1") FAIL() << "missing " << (path);      \
      GTEST_SKIP() << "missing " << (path) << " (Gemma 3 270M GGUF)";            \
    }                                                                            \
  } while (0)
