// Model identity for keys of stored K/V (model.h: model_identity, weight_files_hash).
//
// Stored K/V of token ids [0, n) are a function of the weights and of the architecture options
// that the forward pass reads (a tokenizer only decides which ids a text becomes; it is mixed in
// so that a store is never shared across vocabularies). The identity is XXH3-128 over:
//   - every weight file's full contents, in load order (contents only: a renamed or copied file
//     has the same identity; a GGUF file's metadata -- its tokenizer, its quantization -- is in
//     the hash with its tensors). The whole file, lm_head and metadata included: a change that
//     does not alter K/V then only costs misses, never a wrong hit;
//   - the ModelConfig fields the forward pass reads;
//   - the tokenizer's vocabulary (id -> token string, special flag);
//   - the caller's `kv_format` (how stored K/V are encoded: "f32", "int8", ...).
// The full hash reads every weight byte once; docs/chunk-identity.md has its measured cost (a
// few tenths of a second for a 250 MB file in the page cache). Per-file hashes are cached in
// memory and, when the caller names a cache file, on disk, keyed by path, device, inode, size
// and mtime (nanoseconds), so a restart does not read the weights again.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "kvboost/model.h"
#include "kvboost/tokenizer.h"

namespace kvboost {

namespace {

// Bumped when what the identity covers changes (old stores then miss instead of mixing).
constexpr const char* kIdentityVersion = "kvboost-model-identity-v1";

std::string hex128(const XXH128_hash_t& h) {
  char b[33];
  std::snprintf(b, sizeof b, "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return b;
}

struct Stamp {
  uint64_t dev = 0, ino = 0, size = 0;
  int64_t mtime_ns = 0;
  std::string key(const std::string& path) const {
    std::ostringstream os;
    os << dev << ' ' << ino << ' ' << size << ' ' << mtime_ns << ' ' << path;
    return os.str();
  }
};

Stamp stamp_of(const std::string& path) {
  struct stat sb;
  if (::stat(path.c_str(), &sb) != 0) fail(path, ": cannot stat the weight file (", std::strerror(errno), ")");
  Stamp s;
  s.dev = uint64_t(sb.st_dev);
  s.ino = uint64_t(sb.st_ino);
  s.size = uint64_t(sb.st_size);
  s.mtime_ns = int64_t(sb.st_mtim.tv_sec) * 1000000000 + int64_t(sb.st_mtim.tv_nsec);
  return s;
}

// XXH3-128 of a file's bytes, read sequentially in 4 MiB pieces.
std::string hash_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, ": cannot open the weight file to hash it (", std::strerror(errno), ")");
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  XXH3_state_t st;
  XXH3_128bits_reset(&st);
  std::vector<uint8_t> buf(size_t(4) << 20);
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      fail(path, ": read error while hashing the weight file (", std::strerror(err), ")");
    }
    if (n == 0) break;
    XXH3_128bits_update(&st, buf.data(), size_t(n));
  }
  ::close(fd);
  return hex128(XXH3_128bits_digest(&st));
}

std::mutex g_mu;
std::map<std::string, std::string> g_memo;  // Stamp::key -> hex

// The disk cache: one line per file, "<hex> <dev> <ino> <size> <mtime_ns> <path>".
std::map<std::string, std::string> read_cache(const std::string& file) {
  std::map<std::string, std::string> m;
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    const size_t sp = line.find(' ');
    if (sp != 32 || line.size() < 34) continue;  // not ours or damaged: ignored (and rewritten)
    m[line.substr(33)] = line.substr(0, 32);
  }
  return m;
}

void write_cache(const std::string& file, const std::map<std::string, std::string>& m) {
  const std::string tmp = file + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) return;  // a read-only place: no cache, the hash is recomputed next time
    for (const auto& [k, h] : m) out << h << ' ' << k << '\n';
    if (!out.good()) {
      ::unlink(tmp.c_str());
      return;
    }
  }
  if (std::rename(tmp.c_str(), file.c_str()) != 0) ::unlink(tmp.c_str());
}

void put_u64(XXH3_state_t& st, uint64_t v) { XXH3_128bits_update(&st, &v, sizeof v); }
void put_f64(XXH3_state_t& st, double v) { XXH3_128bits_update(&st, &v, sizeof v); }
void put_str(XXH3_state_t& st, std::string_view s) {
  put_u64(st, s.size());
  XXH3_128bits_update(&st, s.data(), s.size());
}

}  // namespace

std::string weight_file_hash(const std::string& path, const std::string& cache_file) {
  const Stamp s = stamp_of(path);
  const std::string key = s.key(path);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (auto it = g_memo.find(key); it != g_memo.end()) return it->second;
  }
  std::map<std::string, std::string> disk;
  if (!cache_file.empty()) {
    disk = read_cache(cache_file);
    if (auto it = disk.find(key); it != disk.end()) {
      std::lock_guard<std::mutex> lock(g_mu);
      g_memo[key] = it->second;
      return it->second;
    }
  }
  const std::string h = hash_file(path);
  if (stamp_of(path).key(path) != key) fail(path, ": the weight file changed while it was being hashed");
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_memo[key] = h;
  }
  if (!cache_file.empty()) {
    // Entries of files that are gone or changed are dropped, so the cache does not grow forever.
    for (auto it = disk.begin(); it != disk.end();) {
      std::istringstream is(it->first);
      Stamp old;
      std::string p;
      is >> old.dev >> old.ino >> old.size >> old.mtime_ns;
      std::getline(is >> std::ws, p);
      bool live = false;
      try {
        live = stamp_of(p).key(p) == it->first;
      } catch (const Error&) {
      }
      it = live ? std::next(it) : disk.erase(it);
    }
    disk[key] = h;
    write_cache(cache_file, disk);
  }
  return h;
}

std::string model_identity(const Model& m, const Tokenizer& tok, std::string_view kv_format,
                           const std::string& cache_file) {
  XXH3_state_t st;
  XXH3_128bits_reset(&st);
  put_str(st, kIdentityVersion);
  const std::vector<std::string> paths = m.weight_paths();
  put_u64(st, paths.size());
  for (const auto& p : paths) put_str(st, weight_file_hash(p, cache_file));
  // Architecture options the forward pass reads (K/V of a given id sequence depend on them).
  const ModelConfig& c = m.config();
  put_str(st, c.model_type);
  for (int64_t v : {c.hidden_size, c.intermediate_size, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.vocab_size,
                    c.max_position_embeddings, c.rope_scaling.original_max_position_embeddings})
    put_u64(st, uint64_t(v));
  for (double v : {c.rms_norm_eps, c.rope_theta, c.rope_scaling.factor, c.rope_scaling.low_freq_factor,
                   c.rope_scaling.high_freq_factor, double(c.embed_scale), c.query_pre_attn_scalar, c.rope_local_theta,
                   double(c.norm_weight_offset)})
    put_f64(st, v);
  put_str(st, c.rope_scaling.type);
  put_str(st, c.hidden_act);
  put_u64(st, uint64_t(c.tie_word_embeddings) | uint64_t(c.attention_bias) << 1 | uint64_t(c.qk_norm) << 2 |
                  uint64_t(c.sandwich_norms) << 3);
  put_u64(st, c.layer_window.size());
  for (int64_t w : c.layer_window) put_u64(st, uint64_t(w));
  // The vocabulary, id by id.
  const int32_t nv = tok.vocab_size();
  put_u64(st, uint64_t(nv));
  for (int32_t id = 0; id < nv; ++id) {
    put_str(st, tok.id_to_token(id));
    put_u64(st, tok.is_special(id));
  }
  put_str(st, kv_format);
  return std::string("kvb1-") + hex128(XXH3_128bits_digest(&st));
}

}  // namespace kvboost
