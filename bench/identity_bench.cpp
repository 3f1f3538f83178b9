// The cost of the chunk-store model identity (model_identity, src/model/identity.cpp) on a model:
// the full XXH3-128 hash of the weight files (read through the page cache), the vocabulary and
// the config, then the same call again (in-memory memo), and, with a cache file, a fresh
// process's lookup (run it twice with the same file). docs/chunk-identity.md has the numbers.
//   build/bench/identity_bench MODEL [CACHE_FILE]
#include <algorithm>
#include <cstdio>

#include "kvboost/common.h"
#include "kvboost/runtime.h"

using namespace kvboost;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: identity_bench MODEL [CACHE_FILE]\n");
    return 2;
  }
  const std::string cache = argc > 2 ? argv[2] : "";
  try {
    EngineOptions eo;
    eo.chunk_store.ram_bytes = 0;
    eo.chunk_store.model_id = "unused";  // the engine's own identity call is what we time below
    const double t0 = now_ms();
    auto e = Engine::load(argv[1], eo);
    const double t_load = now_ms() - t0;
    size_t bytes = 0;
    for (const auto& p : e->model().weight_paths()) bytes += MappedFile(p).size();
    double t1 = now_ms();
    for (const auto& p : e->model().weight_paths()) weight_file_hash(p, cache);
    const double t_files = now_ms() - t1;
    t1 = now_ms();
    const std::string id = model_identity(e->model(), e->tokenizer(), "f32", cache);
    const double t_rest = now_ms() - t1;
    std::printf("model %s: %zu weight bytes, vocabulary %d; Engine::load %.0f ms\n", argv[1], bytes,
                e->tokenizer().vocab_size(), t_load);
    std::printf("identity %s: weight files %.1f ms (%s, %.2f GB/s), then vocabulary + config %.1f ms\n", id.c_str(),
                t_files, cache.empty() ? "full hash" : "full hash, or the cache file's entry",
                double(bytes) / std::max(1e-9, t_files) / 1e6, t_rest);
    const std::string again = model_identity(e->model(), e->tokenizer(), "f32", cache);
    return again == id ? 0 : 1;
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "identity_bench: %s\n", ex.what());
    return 1;
  }
}
