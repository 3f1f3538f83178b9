// Block hashing and the block pool: ref counts, the LRU free list, the hash -> block map.
#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack (header and library: one package)
#include <xxhash.h>

#include <algorithm>
#include <cassert>

#include "kvboost/kv.h"

namespace kvboost::kv {

namespace {
// Seed of the namespace root hash; any fixed value, changing it invalidates nothing persistent
// (the hot cache is process-private).
constexpr XXH64_hash_t kRootSeed = 0x6b76626f6f737431ULL;  // "kvboost1"
}  // namespace

uint64_t namespace_root_hash(std::string_view ns) {
  return XXH3_64bits_withSeed(ns.data(), ns.size(), kRootSeed);
}

uint64_t block_hash(uint64_t parent, std::span<const int32_t> tokens) {
  // Hashed as [parent: 8 bytes LE][tokens: int32 LE]; x86 and ARM are both little endian.
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  XXH3_64bits_update(&state, &parent, sizeof(parent));
  XXH3_64bits_update(&state, tokens.data(), tokens.size_bytes());
  return XXH3_64bits_digest(&state);
}

BlockPool::BlockPool(int64_t n_blocks, int64_t block_size) : block_size_(block_size) {
  if (n_blocks <= 0 || n_blocks > INT32_MAX) fail("BlockPool: n_blocks ", n_blocks, " must be in [1, 2^31)");
  if (block_size <= 0) fail("BlockPool: block_size ", block_size, " must be positive");
  blocks_.resize(size_t(n_blocks));
  prev_.assign(size_t(n_blocks), -1);
  next_.assign(size_t(n_blocks), -1);
  in_free_.assign(size_t(n_blocks), 0);
  for (int64_t b = 0; b < n_blocks; ++b) list_push_back(BlockId(b));
}

int64_t BlockPool::blocks_for_budget(size_t bytes, int64_t block_size, int64_t n_layers,
                                     int64_t n_kv_heads, int64_t head_dim) {
  const size_t per = PagedKvStorage::bytes_per_block(block_size, n_layers, n_kv_heads, head_dim);
  return per ? int64_t(bytes / per) : 0;
}

void BlockPool::check(BlockId b) const {
  if (b < 0 || b >= n_blocks()) fail("BlockPool: block id ", b, " outside [0, ", n_blocks(), ")");
}

void BlockPool::list_remove(BlockId b) {
  assert(in_free_[size_t(b)]);
  const int32_t p = prev_[size_t(b)], n = next_[size_t(b)];
  (p >= 0 ? next_[size_t(p)] : head_) = n;
  (n >= 0 ? prev_[size_t(n)] : tail_) = p;
  prev_[size_t(b)] = next_[size_t(b)] = -1;
  in_free_[size_t(b)] = 0;
  --n_free_;
}

void BlockPool::list_push_back(BlockId b) {
  assert(!in_free_[size_t(b)]);
  prev_[size_t(b)] = tail_;
  next_[size_t(b)] = -1;
  (tail_ >= 0 ? next_[size_t(tail_)] : head_) = b;
  tail_ = b;
  in_free_[size_t(b)] = 1;
  ++n_free_;
}

std::optional<BlockId> BlockPool::allocate() {
  if (head_ < 0) return std::nullopt;
  const BlockId b = head_;
  list_remove(b);
  if (blocks_[size_t(b)].cached) {
    drop_hash(b);
    ++n_evictions_;
  }
  blocks_[size_t(b)].ref_count = 1;
  high_water_ = std::max<int64_t>(high_water_, int64_t(b) + 1);
  return b;
}

bool BlockPool::allocate_n(int64_t n, std::vector<BlockId>* out) {
  if (n > n_free_) return false;
  for (int64_t i = 0; i < n; ++i) out->push_back(*allocate());
  return true;
}

void BlockPool::ref(BlockId b) {
  check(b);
  if (in_free_[size_t(b)]) list_remove(b);
  ++blocks_[size_t(b)].ref_count;
}

void BlockPool::unref(BlockId b) {
  check(b);
  BlockInfo& info = blocks_[size_t(b)];
  if (info.ref_count <= 0) fail("BlockPool: unref of free block ", b);
  if (--info.ref_count == 0) list_push_back(b);
}

std::optional<BlockId> BlockPool::find(uint64_t hash) const {
  auto it = map_.find(hash);
  if (it == map_.end()) return std::nullopt;
  return it->second;
}

uint64_t BlockPool::register_full(BlockId b, uint64_t hash, std::span<const int32_t> tokens,
                                  int32_t ns, uint64_t parent_reg) {
  if (int64_t(tokens.size()) != block_size_)
    fail("BlockPool: registering ", tokens.size(), " tokens, blocks hold ", block_size_);
  return register_block(b, hash, tokens, ns, parent_reg);
}

uint64_t BlockPool::register_tail(BlockId b, uint64_t hash, std::span<const int32_t> tokens, int32_t ns,
                                  uint64_t parent_reg) {
  if (tokens.empty() || int64_t(tokens.size()) >= block_size_)
    fail("BlockPool: a tail holds 1 .. ", block_size_ - 1, " tokens, not ", tokens.size());
  return register_block(b, hash, tokens, ns, parent_reg);
}

uint64_t BlockPool::register_block(BlockId b, uint64_t hash, std::span<const int32_t> tokens, int32_t ns,
                                   uint64_t parent_reg) {
  check(b);
  BlockInfo& info = blocks_[size_t(b)];
  if (info.cached) fail("BlockPool: block ", b, " is already registered");
  if (!map_.emplace(hash, b).second) fail("BlockPool: hash already registered");
  info.cached = true;
  info.hash = hash;
  info.reg_id = next_reg_++;
  info.parent_reg = parent_reg;
  info.ns = ns;
  info.tokens.assign(tokens.begin(), tokens.end());
  return info.reg_id;
}

void BlockPool::drop_hash(BlockId b) {
  check(b);
  BlockInfo& info = blocks_[size_t(b)];
  if (!info.cached) return;
  auto it = map_.find(info.hash);
  if (it != map_.end() && it->second == b) map_.erase(it);
  const int32_t ref = info.ref_count;
  info = BlockInfo{};
  info.ref_count = ref;
}

const BlockInfo& BlockPool::info(BlockId b) const {
  check(b);
  return blocks_[size_t(b)];
}

std::vector<BlockId> BlockPool::free_list() const {
  std::vector<BlockId> out;
  out.reserve(size_t(n_free_));
  for (int32_t b = head_; b >= 0; b = next_[size_t(b)]) out.push_back(b);
  return out;
}

}  // namespace kvboost::kv
