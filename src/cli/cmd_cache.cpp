// Chunk store options shared by the commands, `kvboost warm` and `kvboost cache`.
#include <sys/stat.h>

#include <cstdio>

#include "cli_util.h"

namespace kvboost::cli {

void ChunkArgs::add(CLI::App* c) {
  c->add_option("--chunk-size", chunk_size, "Tokens per reuse chunk")->capture_default_str()->check(CLI::PositiveNumber);
  c->add_option("--chunk-store", disk_dir, "Directory of the chunk store's disk tier (survives restarts)");
  c->add_option("--chunk-ram", ram, "RAM budget of the chunk store, e.g. 512MiB (0 = no chunk store)")->capture_default_str();
  c->add_option("--chunk-disk", disk, "Disk budget of the chunk store (0 = unlimited)")->capture_default_str();
  c->add_option("--kv-quant", quant, "Stored chunk K/V: f32 | int8 | int4")->capture_default_str();
  c->add_option("--chunk-remote", remote,
                "Chunk store tier shared by many servers: redis://[USER:PASSWORD@]HOST[:PORT][/DB][?prefix=P] or "
                "unix:///PATH[?db=N&prefix=P] (Redis / Valkey; see docs/chunk-remote.md)");
  c->add_option("--chunk-remote-ttl", remote_ttl, "Expiry of chunks written to --chunk-remote, seconds (0 = none)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  c->add_option("--guard-file", guard_file,
                "The reuse guard's calibration file, loaded at start and updated as it learns "
                "(default: DIR/guard-<model id>.txt beside --chunk-store DIR; `kvboost bench reuse --calibrate` writes it)");
}

void save_calibration(const Engine& e, const std::string& path) {
  struct stat st {};
  const bool is_dir = ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  const std::string file = is_dir ? path_join(path, "guard-" + e.model_id() + ".txt") : path;
  e.save_guard_calibration(file);
  const Engine::GuardCalibration g = e.guard_calibration();
  std::printf("guard calibration written to %s (error samples: selective %zu, cacheblend %zu, none %zu)\n", file.c_str(),
              g.errors[size_t(ReuseMode::kSelective)].size(), g.errors[size_t(ReuseMode::kCacheBlend)].size(),
              g.errors[size_t(ReuseMode::kNone)].size());
}

void ChunkArgs::apply(EngineOptions& eo) const {
  eo.chunk_size = chunk_size;
  eo.chunk_store.ram_bytes = ram == "0" ? 0 : parse_bytes(ram, "--chunk-ram");
  eo.chunk_store.disk_bytes = disk == "0" ? 0 : parse_bytes(disk, "--chunk-disk");
  eo.chunk_store.disk_dir = disk_dir;
  eo.chunk_store.quant = kv::parse_kv_quant(quant);
  if (!remote.empty() && eo.chunk_store.ram_bytes == 0)
    fail("--chunk-remote needs the chunk store's RAM tier (fetched chunks are promoted there): --chunk-ram must not be 0");
  eo.chunk_store.remote_url = remote;
  eo.chunk_store.remote_ttl_s = remote_ttl;
  eo.guard_file = guard_file;
}

namespace {
struct WarmArgs {
  std::string model, cache_namespace;
  std::vector<std::string> files;
  ChunkArgs chunks;
};

void run_warm(const WarmArgs& a) {
  if (a.chunks.disk_dir.empty() && a.chunks.remote.empty())
    fail("kvboost warm needs --chunk-store DIR or --chunk-remote URL (a process's RAM tier ends with it)");
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
  bool verify = false;
  size_t remote_limit = 10000;
};

void run_cache(const CacheArgs& a) {
  if (a.chunks.disk_dir.empty() && a.chunks.remote.empty()) fail("kvboost cache needs --chunk-store DIR or --chunk-remote URL");
  EngineOptions eo;
  a.chunks.apply(eo);
  auto e = load_engine(resolve_model_dir(a.model, true), true, eo);
  if (!a.chunks.disk_dir.empty()) {
    const int64_t n_start = e->chunk_store()->stats().corrupt;
    const int64_t n_verify = a.verify ? e->chunk_store()->verify_disk() : 0;
    const kv::ChunkStats s = e->chunk_store()->stats();
    std::printf("chunk store %s\n  model identity: %s (entries of other models are ignored)\n"
                "  entries: %lld (disk %lld, %.1f MiB)\n  corrupt files removed at start-up: %lld\n",
                a.chunks.disk_dir.c_str(), e->model_id().c_str(), (long long)s.entries, (long long)s.entries_disk, double(s.bytes_disk) / 1048576.0,
                (long long)n_start);
    if (a.verify) std::printf("  corrupt files found by --verify (checksums): %lld\n", (long long)n_verify);
    else std::printf("  (headers and sizes checked; --verify checks every checksum)\n");
    for (const auto& c : s.corrupt_files) std::printf("    %s\n", c.c_str());
  }
  if (!a.chunks.remote.empty()) {
    // Lists this model's entries (every namespace) and verifies each one as a lookup would.
    const std::vector<kv::RemoteEntryInfo> v = e->chunk_store()->list_remote(a.remote_limit);
    size_t bytes = 0, bad = 0;
    std::printf("remote chunk store (--chunk-remote): this model's entries, every namespace\n");
    for (const auto& x : v) {
      bytes += x.bytes;
      bad += !x.problem.empty();
      if (x.problem.empty())
        std::printf("  %s  %zu bytes, %lld tokens, %s, namespace \"%s\", ttl %s\n", x.key.c_str(), x.bytes,
                    (long long)x.n_tokens, x.quant.c_str(), x.ns.c_str(),
                    x.ttl_s < 0 ? "none" : (std::to_string(x.ttl_s) + " s").c_str());
      else
        std::printf("  %s  %zu bytes  BAD: %s\n", x.key.c_str(), x.bytes, x.problem.c_str());
    }
    std::printf("  entries: %zu%s, %.1f MiB, failing verification: %zu\n", v.size(),
                v.size() >= a.remote_limit ? " (limit reached)" : "", double(bytes) / 1048576.0, bad);
    if (bad) throw Error("remote chunk store: " + std::to_string(bad) + " entries fail verification (ignored by lookups)");
  }
}
}  // namespace

void add_cache_commands(CLI::App& app) {
  auto w = std::make_shared<WarmArgs>();
  CLI::App* c = app.add_subcommand("warm", "Compute and store the chunks of prompt files ahead of time (disk and/or remote tier)");
  c->add_option("-m,--model", w->model, "Model directory, .gguf file or Hugging Face id ORG/NAME[@REV] (default: the offline demo model)");
  c->add_option("files", w->files, "Prompt files (exact bytes)")->required();
  c->add_option("--cache-namespace", w->cache_namespace, "Tenant namespace");
  w->chunks.add(c);
  c->callback([w]() { run_warm(*w); });

  auto k = std::make_shared<CacheArgs>();
  CLI::App* i = app.add_subcommand("cache", "Inspect a chunk store (directory and/or --chunk-remote): entries, bytes, corrupt entries");
  i->add_option("-m,--model", k->model, "Model directory, .gguf file or Hugging Face id ORG/NAME[@REV] (default: the offline demo model)");
  i->add_option("--remote-limit", k->remote_limit, "List at most this many remote entries")->capture_default_str();
  k->chunks.add(i);
  i->add_flag("--verify", k->verify, "Read every chunk file and check its checksum (corrupt ones are removed)");
  i->callback([k]() { run_cache(*k); });
}

}  // namespace kvboost::cli
