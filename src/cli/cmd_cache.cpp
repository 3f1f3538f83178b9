// Chunk store options shared by the commands, `kvboost warm` and `kvboost cache`.
#include <cstdio>

#include "cli_util.h"

namespace kvboost::cli {

void ChunkArgs::add(CLI::App* c) {
  c->add_option("--chunk-size", chunk_size, "Tokens per reuse chunk")->capture_default_str()->check(CLI::PositiveNumber);
  c->add_option("--chunk-store", disk_dir, "Directory of the chunk store's disk tier (survives restarts)");
  c->add_option("--chunk-ram", ram, "RAM budget of the chunk store, e.g. 512MiB (0 = no chunk store)")->capture_default_str();
  c->add_option("--chunk-disk", disk, "Disk budget of the chunk store (0 = unlimited)")->capture_default_str();
  c->add_option("--kv-quant", quant, "Stored chunk K/V: f32 | int8 | int4")->capture_default_str();
}

void ChunkArgs::apply(EngineOptions& eo) const {
  eo.chunk_size = chunk_size;
  eo.chunk_store.ram_bytes = ram == "0" ? 0 : parse_bytes(ram, "--chunk-ram");
  eo.chunk_store.disk_bytes = disk == "0" ? 0 : parse_bytes(disk, "--chunk-disk");
  eo.chunk_store.disk_dir = disk_dir;
  eo.chunk_store.quant = kv::parse_kv_quant(quant);
}

namespace {
struct WarmArgs {
  std::string model, cache_namespace;
  std::vector<std::string> files;
  ChunkArgs chunks;
};

void run_warm(const WarmArgs& a) {
  if (a.chunks.disk_dir.empty()) fail("kvboost warm needs --chunk-store DIR (a process's RAM tier ends with it)");
  EngineOptions eo;
  a.chunks.apply(eo);
  auto e = load_engine(resolve_model_dir(a.model, false), false, eo);
  for (const auto& f : a.files) {
    const std::vector<int32_t> ids = e->tokenizer().encode(read_file(f), true);
    const double t0 = now_ms();
    const int64_t cached = e->warm(ids, {}, a.cache_namespace);
    std::fprintf(stderr, "%s: %zu tokens (%lld already cached) in %.0f ms\n", f.c_str(), ids.size(), (long long)cached,
                 now_ms() - t0);
  }
  std::fprintf(stderr, "chunk store: %s\n", e->chunk_store()->stats().to_string().c_str());
}

struct CacheArgs {
  std::string model;
  ChunkArgs chunks;
};

void run_cache(const CacheArgs& a) {
  if (a.chunks.disk_dir.empty()) fail("kvboost cache needs --chunk-store DIR");
  EngineOptions eo;
  a.chunks.apply(eo);
  auto e = load_engine(resolve_model_dir(a.model, true), true, eo);
  const kv::ChunkStats s = e->chunk_store()->stats();
  std::printf("chunk store %s\n  model identity: %s (entries of other models are ignored)\n"
              "  entries: %lld (disk %lld, %.1f MiB)\n  corrupt files removed at start-up: %lld\n",
              a.chunks.disk_dir.c_str(), e->model_id().c_str(), (long long)s.entries, (long long)s.entries_disk, double(s.bytes_disk) / 1048576.0,
              (long long)s.corrupt);
  for (const auto& c : s.corrupt_files) std::printf("    %s\n", c.c_str());
}
}  // namespace

void add_cache_commands(CLI::App& app) {
  auto w = std::make_shared<WarmArgs>();
  CLI::App* c = app.add_subcommand("warm", "Compute and store the chunks of prompt files ahead of time (disk tier)");
  c->add_option("-m,--model", w->model, "Model directory (default: the offline demo model)");
  c->add_option("files", w->files, "Prompt files (exact bytes)")->required();
  c->add_option("--cache-namespace", w->cache_namespace, "Tenant namespace");
  w->chunks.add(c);
  c->callback([w]() { run_warm(*w); });

  auto k = std::make_shared<CacheArgs>();
  CLI::App* i = app.add_subcommand("cache", "Inspect a chunk store directory: entries, bytes, corrupt files");
  i->add_option("-m,--model", k->model, "Model directory (default: the offline demo model)");
  k->chunks.add(i);
  i->callback([k]() { run_cache(*k); });
}

}  // namespace kvboost::cli
