// Encoding of a chunk's K/V (f32, or KIVI-style 8/4-bit) and its file format.
//
// Quantization (Liu et al., "KIVI", ICML 2024): keys have outlier *channels*, so keys are
// quantized per channel over groups of kQuantGroup tokens; values are quantized per token over
// groups of kQuantGroup channels. Asymmetric: q = round((x - min) / scale), x ≈ min + q * scale.
// Per layer: [K block][V block]; K block = for each channel, for each token group: scale, min
// (f32), then the codes of the group's tokens; V block = for each token, for each channel group:
// scale, min, codes. 4-bit codes pack two per byte (low nibble first), each group padded to a
// whole byte.
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "chunk_file.h"
#include "kvboost/kv.h"

namespace kvboost::kv {
namespace {

int bits_of(KvQuant q) { return q == KvQuant::kInt8 ? 8 : 4; }

size_t group_bytes(KvQuant q, int64_t n) {  // one quantized group of n codes with its scale/min
  return 2 * sizeof(float) + (q == KvQuant::kInt8 ? size_t(n) : size_t(n + 1) / 2);
}

// Quantizes n values read with stride `stride` from x into out (scale, min, codes).
uint8_t* quant_group(const float* x, int64_t n, int64_t stride, KvQuant q, uint8_t* out) {
  float lo = x[0], hi = x[0];
  for (int64_t i = 1; i < n; ++i) lo = std::min(lo, x[i * stride]), hi = std::max(hi, x[i * stride]);
  const int qmax = (1 << bits_of(q)) - 1;
  const float scale = hi > lo ? (hi - lo) / float(qmax) : 1.0f;
  std::memcpy(out, &scale, 4);
  std::memcpy(out + 4, &lo, 4);
  uint8_t* c = out + 8;
  const size_t nc = group_bytes(q, n) - 8;
  std::memset(c, 0, nc);
  for (int64_t i = 0; i < n; ++i) {
    const int v = std::clamp(int(std::lround((x[i * stride] - lo) / scale)), 0, qmax);
    if (q == KvQuant::kInt8)
      c[i] = uint8_t(v);
    else
      c[i / 2] |= uint8_t(v << (4 * (i % 2)));
  }
  return out + group_bytes(q, n);
}

const uint8_t* dequant_group(const uint8_t* in, int64_t n, int64_t stride, KvQuant q, float* x) {
  float scale, lo;
  std::memcpy(&scale, in, 4);
  std::memcpy(&lo, in + 4, 4);
  const uint8_t* c = in + 8;
  for (int64_t i = 0; i < n; ++i) {
    const int v = q == KvQuant::kInt8 ? c[i] : (c[i / 2] >> (4 * (i % 2))) & 15;
    x[i * stride] = lo + float(v) * scale;
  }
  return in + group_bytes(q, n);
}

size_t kblock_bytes(const ChunkShape& s, KvQuant q, int64_t n) {
  if (q == KvQuant::kF32) return size_t(n * s.row()) * sizeof(float);
  size_t b = 0;
  for (int64_t t0 = 0; t0 < n; t0 += kQuantGroup) b += group_bytes(q, std::min(kQuantGroup, n - t0));
  return b * size_t(s.row());
}

size_t vblock_bytes(const ChunkShape& s, KvQuant q, int64_t n) {
  if (q == KvQuant::kF32) return size_t(n * s.row()) * sizeof(float);
  size_t b = 0;
  for (int64_t c0 = 0; c0 < s.row(); c0 += kQuantGroup) b += group_bytes(q, std::min(kQuantGroup, s.row() - c0));
  return b * size_t(n);
}

}  // namespace

const char* kv_quant_name(KvQuant q) {
  switch (q) {
    case KvQuant::kF32: return "f32";
    case KvQuant::kInt8: return "int8";
    case KvQuant::kInt4: return "int4";
  }
  return "?";
}

KvQuant parse_kv_quant(std::string_view s) {
  if (s == "f32" || s == "none") return KvQuant::kF32;
  if (s == "int8" || s == "8") return KvQuant::kInt8;
  if (s == "int4" || s == "4") return KvQuant::kInt4;
  fail("unknown KV quantization \"", s, "\" (expected f32, int8 or int4)");
}

size_t chunk_layer_bytes(const ChunkShape& s, KvQuant q, int64_t n) { return kblock_bytes(s, q, n) + vblock_bytes(s, q, n); }

void chunk_init(Chunk& c, const ChunkShape& s, KvQuant q, int64_t n_tokens) {
  c.quant = q;
  c.data.assign(chunk_layer_bytes(s, q, n_tokens) * size_t(s.n_layers), 0);
}

void chunk_put_layer(Chunk& c, const ChunkShape& s, int64_t layer, const float* k, const float* v) {
  const int64_t n = int64_t(c.tokens.size()), row = s.row();
  uint8_t* p = c.data.data() + chunk_layer_bytes(s, c.quant, n) * size_t(layer);
  if (c.quant == KvQuant::kF32) {
    std::memcpy(p, k, size_t(n * row) * sizeof(float));
    std::memcpy(p + size_t(n * row) * sizeof(float), v, size_t(n * row) * sizeof(float));
    return;
  }
  for (int64_t ch = 0; ch < row; ++ch)
    for (int64_t t0 = 0; t0 < n; t0 += kQuantGroup) p = quant_group(k + t0 * row + ch, std::min(kQuantGroup, n - t0), row, c.quant, p);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c0 = 0; c0 < row; c0 += kQuantGroup) p = quant_group(v + t * row + c0, std::min(kQuantGroup, row - c0), 1, c.quant, p);
}

void chunk_get_layer(const Chunk& c, const ChunkShape& s, int64_t layer, float* k, float* v) {
  const int64_t n = int64_t(c.tokens.size()), row = s.row();
  const uint8_t* p = c.data.data() + chunk_layer_bytes(s, c.quant, n) * size_t(layer);
  if (c.quant == KvQuant::kF32) {
    std::memcpy(k, p, size_t(n * row) * sizeof(float));
    std::memcpy(v, p + size_t(n * row) * sizeof(float), size_t(n * row) * sizeof(float));
    return;
  }
  for (int64_t ch = 0; ch < row; ++ch)
    for (int64_t t0 = 0; t0 < n; t0 += kQuantGroup) p = dequant_group(p, std::min(kQuantGroup, n - t0), row, c.quant, k + t0 * row + ch);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c0 = 0; c0 < row; c0 += kQuantGroup) p = dequant_group(p, std::min(kQuantGroup, row - c0), 1, c.quant, v + t * row + c0);
}

// ---- file format ---------------------------------------------------------------------------------
// Little-endian: magic "KVBCHNK1", then the Header below, the tokens (int32), the payload. The
// checksum (XXH3-64) covers the header (checksum field zeroed), tokens and payload.
namespace {
constexpr char kMagic[8] = {'K', 'V', 'B', 'C', 'H', 'N', 'K', '1'};
struct Header {
  uint32_t version, quant;
  int64_t n_layers, n_kv_heads, head_dim, n_tokens, pos0;
  uint64_t model_hash, prefix, check, content, parent_prefix, payload_bytes, checksum;
};
static_assert(sizeof(Header) == 8 + 5 * 8 + 7 * 8);

uint64_t checksum(const Header& h0, const void* tokens, size_t tb, const void* payload, size_t pb) {
  Header h = h0;
  h.checksum = 0;
  XXH3_state_t st;
  XXH3_64bits_reset(&st);
  XXH3_64bits_update(&st, &h, sizeof h);
  XXH3_64bits_update(&st, tokens, tb);
  XXH3_64bits_update(&st, payload, pb);
  return XXH3_64bits_digest(&st);
}

// A file of the store, opened so that nothing planted in the folder can hang or redirect us:
// O_NOFOLLOW (a symlink is refused), O_NONBLOCK (a FIFO does not block the open), then it must be
// a regular file.
int open_regular(const std::string& path, off_t* size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) fail(path, ": cannot open: ", std::strerror(errno));
  struct stat sb;
  if (::fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    ::close(fd);
    fail(path, ": not a regular file (a chunk file must be one)");
  }
  *size = sb.st_size;
  return fd;
}

std::string read_regular(const std::string& path, size_t max_bytes) {
  off_t size = 0;
  const int fd = open_regular(path, &size);
  if (size < 0 || uint64_t(size) > max_bytes) {
    ::close(fd);
    fail(path, ": chunk file of ", size, " bytes exceeds the limit of ", max_bytes);
  }
  std::string bytes(size_t(size), '\0');
  size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t n = ::pread(fd, bytes.data() + got, bytes.size() - got, off_t(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += size_t(n);
  }
  ::close(fd);
  bytes.resize(got);
  return bytes;
}

void write_all(int fd, const void* p, size_t n, const std::string& path) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, c, n);
    if (w < 0) fail(path, ": write failed: ", std::strerror(errno));
    c += w;
    n -= size_t(w);
  }
}
}  // namespace

std::string encode_chunk(const Chunk& c, const ChunkShape& s, uint64_t model_hash) {
  Header h{};
  h.version = 1;
  h.quant = uint32_t(c.quant);
  h.n_layers = s.n_layers, h.n_kv_heads = s.n_kv_heads, h.head_dim = s.head_dim;
  h.n_tokens = int64_t(c.tokens.size()), h.pos0 = c.pos0;
  h.model_hash = model_hash, h.prefix = c.keys.prefix, h.check = c.keys.check, h.content = c.keys.content;
  h.parent_prefix = c.parent_prefix, h.payload_bytes = c.data.size();
  h.checksum = checksum(h, c.tokens.data(), c.tokens.size() * 4, c.data.data(), c.data.size());
  std::string out;
  out.reserve(chunk_encoded_bytes(c.tokens.size(), c.data.size()));
  out.append(kMagic, 8);
  out.append(reinterpret_cast<const char*>(&h), sizeof h);
  out.append(reinterpret_cast<const char*>(c.tokens.data()), c.tokens.size() * 4);
  out.append(reinterpret_cast<const char*>(c.data.data()), c.data.size());
  return out;
}

size_t chunk_encoded_bytes(size_t n_tokens, size_t payload_bytes) { return 8 + sizeof(Header) + n_tokens * 4 + payload_bytes; }

void write_chunk_file(const std::string& path, const Chunk& c, const ChunkShape& s, uint64_t model_hash) {
  const std::string bytes = encode_chunk(c, s, model_hash);
  // Atomic: a reader sees the old file, no file, or the whole new one.
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) fail(tmp, ": cannot create: ", std::strerror(errno));
  try {
    write_all(fd, bytes.data(), bytes.size(), tmp);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    fail(path, ": rename failed: ", std::strerror(errno));
  }
}

Chunk read_chunk_file(const std::string& path, const ChunkShape& s, uint64_t model_hash) {
  return decode_chunk(read_regular(path, size_t(1) << 34), s, model_hash, path);
}

Chunk decode_chunk(std::string_view bytes, const ChunkShape& s, uint64_t model_hash, const std::string& path) {
  if (bytes.size() < 8 + sizeof(Header)) fail(path, ": truncated chunk file (", bytes.size(), " bytes, header needs ", 8 + sizeof(Header), ")");
  if (std::memcmp(bytes.data(), kMagic, 8) != 0) fail(path, ": not a KVBoost chunk file (bad magic)");
  Header h;
  std::memcpy(&h, bytes.data() + 8, sizeof h);
  if (h.version != 1) fail(path, ": chunk file version ", h.version, " (supported: 1)");
  if (h.model_hash != model_hash) fail(path, ": chunk file belongs to another model");
  if (h.n_layers != s.n_layers || h.n_kv_heads != s.n_kv_heads || h.head_dim != s.head_dim)
    fail(path, ": chunk shape [", h.n_layers, ", ", h.n_kv_heads, ", ", h.head_dim, "] does not match the model's [",
         s.n_layers, ", ", s.n_kv_heads, ", ", s.head_dim, "]");
  if (h.quant > 2) fail(path, ": unknown quantization ", h.quant);
  if (h.n_tokens <= 0 || h.n_tokens > (int64_t(1) << 24)) fail(path, ": bad token count ", h.n_tokens);
  if (h.payload_bytes > (uint64_t(1) << 40)) fail(path, ": bad payload size ", h.payload_bytes);
  const size_t need = 8 + sizeof h + size_t(h.n_tokens) * 4 + h.payload_bytes;
  if (bytes.size() != need) fail(path, ": truncated chunk file (", bytes.size(), " bytes, expected ", need, ")");
  if (h.payload_bytes != chunk_layer_bytes(s, KvQuant(h.quant), h.n_tokens) * size_t(s.n_layers))
    fail(path, ": payload size ", h.payload_bytes, " does not match its shape");
  const char* tok = bytes.data() + 8 + sizeof h;
  const char* payload = tok + h.n_tokens * 4;
  if (checksum(h, tok, size_t(h.n_tokens) * 4, payload, h.payload_bytes) != h.checksum)
    fail(path, ": checksum mismatch (corrupt chunk file)");
  Chunk c;
  c.tokens.resize(size_t(h.n_tokens));
  std::memcpy(c.tokens.data(), tok, size_t(h.n_tokens) * 4);
  c.pos0 = h.pos0;
  c.keys = ChunkKeys{h.prefix, h.check, h.content};
  c.parent_prefix = h.parent_prefix;
  c.quant = KvQuant(h.quant);
  c.data.assign(reinterpret_cast<const uint8_t*>(payload), reinterpret_cast<const uint8_t*>(payload) + h.payload_bytes);
  return c;
}


ChunkFileInfo peek_chunk_file(const std::string& path, const ChunkShape& s, uint64_t model_hash) {
  off_t size = 0;
  const int fd = open_regular(path, &size);
  char buf[8 + sizeof(Header)];
  const ssize_t n = ::pread(fd, buf, sizeof buf, 0);
  ::close(fd);
  if (n != ssize_t(sizeof buf)) fail(path, ": truncated chunk file (no complete header)");
  if (std::memcmp(buf, kMagic, 8) != 0) fail(path, ": not a KVBoost chunk file (bad magic)");
  Header h;
  std::memcpy(&h, buf + 8, sizeof h);
  if (h.version != 1 || h.model_hash != model_hash || h.n_layers != s.n_layers || h.n_kv_heads != s.n_kv_heads ||
      h.head_dim != s.head_dim)
    fail(path, ": chunk file of another model or format");
  if (h.n_tokens <= 0 || h.n_tokens > (int64_t(1) << 24) || h.payload_bytes > (uint64_t(1) << 34) ||
      size_t(size) != sizeof buf + size_t(h.n_tokens) * 4 + h.payload_bytes)
    fail(path, ": truncated chunk file (", size, " bytes)");
  return ChunkFileInfo{ChunkKeys{h.prefix, h.check, h.content}, h.n_tokens, size_t(size)};
}

}  // namespace kvboost::kv
