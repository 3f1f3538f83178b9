// Chunking a prompt and the chained chunk keys (see kv.h, "chunk-level KV reuse").
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <algorithm>

#include "kvboost/kv.h"

namespace kvboost::kv {
namespace {
constexpr XXH64_hash_t kChunkSeed = 0x6b76636875686b31ULL;    // "kvchuhk1"
constexpr XXH64_hash_t kCheckSeed = 0x6b76636865636b32ULL;    // "kvcheck2"
constexpr XXH64_hash_t kContentSeed = 0x6b76636f6e746e33ULL;  // "kvcontn3"

uint64_t chain(uint64_t parent, std::span<const int32_t> tokens, XXH64_hash_t seed) {
  XXH3_state_t st;
  XXH3_64bits_reset_withSeed(&st, seed);
  uint8_t p[8];
  for (int i = 0; i < 8; ++i) p[i] = uint8_t(parent >> (8 * i));
  XXH3_64bits_update(&st, p, 8);
  XXH3_64bits_update(&st, tokens.data(), tokens.size_bytes());
  const uint64_t h = XXH3_64bits_digest(&st);
  return h ? h : 1;  // 0 means "none" in Chunk::keys
}
}  // namespace

uint64_t chunk_root(std::string_view model_id, std::string_view ns) {
  const std::string s = std::string(model_id) + '\0' + std::string(ns);
  return XXH3_64bits_withSeed(s.data(), s.size(), kChunkSeed);
}

ChunkKeys chunk_first_keys(uint64_t root) { return ChunkKeys{root, root ^ 0x9e3779b97f4a7c15ULL, 0}; }

ChunkKeys chunk_keys(const ChunkKeys& prev, uint64_t root, std::span<const int32_t> tokens) {
  ChunkKeys k;
  k.prefix = chain(prev.prefix, tokens, kChunkSeed);
  k.check = chain(prev.check, tokens, kCheckSeed);
  k.content = chain(root, tokens, kContentSeed);
  return k;
}

std::vector<ChunkSpan> cut_chunks(int64_t n_tokens, std::span<const int64_t> segment_starts, int64_t chunk_size,
                                  int64_t window, const std::function<bool(int64_t)>& is_break) {
  if (chunk_size <= 0) fail("chunk size ", chunk_size, " must be positive");
  std::vector<int64_t> bounds{0};
  for (int64_t s : segment_starts) {
    if (s <= bounds.back() || s >= n_tokens)
      fail("segment start ", s, " must be increasing and inside (0, ", n_tokens, ")");
    bounds.push_back(s);
  }
  bounds.push_back(n_tokens);
  std::vector<ChunkSpan> out;
  for (size_t seg = 0; seg + 1 < bounds.size(); ++seg) {
    const int64_t end = bounds[seg + 1];
    int64_t b = bounds[seg];
    while (b < end) {
      int64_t cut = std::min(end, b + chunk_size);
      if (cut < end && window > 0 && is_break) {
        // nearest break within the window, preferring the earlier one on a tie
        for (int64_t d = 0; d <= window; ++d) {
          if (cut - d > b && is_break(cut - d)) {
            cut -= d;
            break;
          }
          if (cut + d < end && is_break(cut + d)) {
            cut += d;
            break;
          }
        }
      }
      out.push_back(ChunkSpan{b, cut, int64_t(seg)});
      b = cut;
    }
  }
  return out;
}

}  // namespace kvboost::kv
