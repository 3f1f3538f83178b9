// kvboost/kv.h — paged KV memory: block pool, per-sequence block tables, automatic prefix caching
// (chained block hashes), copy-on-write, and a cold tier that running sequences spill to.
// Uses kvboost/common.h only. Modelled on vLLM v1 (core/block_pool.py, core/kv_cache_manager.py).
//
// Two halves, kept apart (GUIDE convention 5):
//   bookkeeping  BlockPool, KvCacheManager — block ids, ref counts, hashes, LRU free list. No
//                tensors; testable without a model. Running out of blocks returns std::nullopt
//                (the scheduler admits later or preempts); only misuse (unknown sequence id, ...)
//                throws kvboost::Error.
//   storage      PagedKvStorage — the K/V floats, indexed by the block ids the bookkeeping hands
//                out (a HotTier; a device's pools are another); ColdStore — the slower tier:
//                FileColdStore (disk), HostColdStore (host slots in front of another tier).
//
// Life cycle of a request (seq = any caller-chosen int64 id, unique among live sequences):
//
//   auto p = mgr.allocate_for_prompt(seq, prompt_ids, tenant);  // nullopt: no room, retry later
//   for (auto c : p->copies) storage.copy_block(c.src, c.dst);  // before any other mgr call
//   // run the model on prompt_ids[p->n_cached ..] at positions p->n_cached ..; token at position
//   // pos writes its K/V to block  mgr.block_table(seq)[pos / block_size], row  pos % block_size.
//   mgr.commit_full_blocks(seq, prompt_ids);   // full blocks become findable by later requests
//   loop per generated token t (its K/V goes at position mgr.n_tokens(seq)):
//     auto s = mgr.append_slot(seq);           // nullopt: no room, preempt/free someone
//     if (s->copy) storage.copy_block(s->copy->src, s->copy->dst);
//     // forward(t) writes K/V at (s->block, s->offset); attention reads the block table
//     mgr.commit_full_blocks(seq, all_ids_so_far);   // cheap: only newly full blocks are hashed
//   mgr.free(seq);                             // blocks stay cached in the LRU free list
//
// With a cold tier attached (attach_cold_tier), append_slot spills least-recently-used blocks of
// running sequences when the hot pool is empty, and the engine calls
// ensure_resident(seq, first_block, n) before attention reads a range of the block table; entries
// outside the ensured ranges may be kColdBlock. Residency holds until the next manager call that
// can spill (append_slot, ensure_resident). Tip: attention that scans a sequence in ranges should
// alternate the scan direction per step; LRU then keeps the blocks needed first.
#pragma once

#include <cstddef>
#include <thread>
#include <mutex>
#include <deque>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kvboost/common.h"
#include "kvboost/kv_layout.h"  // BlockId, SeqId, kColdBlock; KvLayout, Pager

namespace kvboost::kv {

inline constexpr int64_t kDefaultBlockSize = 16;

// ---- hashing -----------------------------------------------------------------------------------
// Chained block hash H(parent, tokens): XXH3-64 over [parent as 8 LE bytes][token ids as int32].
// The namespace (tenant or salt) is mixed in once, as the parent of the first block:
// root = XXH3-64(namespace bytes, seed). A 64-bit hash is enough because a hash is only a lookup
// key: every hit is verified (token ids, namespace, and the parent block's registration id), so a
// collision costs a cache miss, never wrong K/V.
uint64_t namespace_root_hash(std::string_view ns);
uint64_t block_hash(uint64_t parent, std::span<const int32_t> tokens);
using BlockHashFn = std::function<uint64_t(uint64_t parent, std::span<const int32_t> tokens)>;

// ---- block pool --------------------------------------------------------------------------------
struct BlockInfo {
  int32_t ref_count = 0;
  bool cached = false;           // registered in the hash map (a full block; immutable)
  uint64_t hash = 0;             // chained hash when cached
  uint64_t reg_id = 0;           // unique, never reused id of this registration (0 = none)
  uint64_t parent_reg = 0;       // reg_id of the parent block's registration (0: first block)
  int32_t ns = -1;               // namespace id (KvCacheManager interns namespace strings)
  std::vector<int32_t> tokens;   // the token ids the block holds, for verifying hits
};

// A fixed set of blocks. Free blocks (ref count 0) form an LRU list: freed blocks go to the tail,
// allocation takes the head. A free block that is still cached stays findable by hash until it is
// allocated again; then its hash entry is evicted. Initially the free list is 0, 1, ..., n-1.
class BlockPool {
 public:
  explicit BlockPool(int64_t n_blocks, int64_t block_size = kDefaultBlockSize);

  // Blocks that fit in `bytes` of f32 K and V for all layers.
  static int64_t blocks_for_budget(size_t bytes, int64_t block_size, int64_t n_layers,
                                   int64_t n_kv_heads, int64_t head_dim);

  int64_t n_blocks() const { return int64_t(blocks_.size()); }
  int64_t block_size() const { return block_size_; }
  int64_t n_free() const { return n_free_; }  // allocatable (ref 0), cached ones included
  int64_t n_used() const { return n_blocks() - n_free_; }
  int64_t n_cached() const { return int64_t(map_.size()); }
  int64_t n_evictions() const { return n_evictions_; }  // cached blocks reused for new data
  // 1 + the highest block id ever allocated. Blocks never allocated are handed out in id order
  // (the free list starts 0 .. n-1 and freed blocks go to its tail, behind all of them), so
  // [0, high_water) is exactly the set of blocks whose memory has been used.
  int64_t high_water() const { return high_water_; }

  std::optional<BlockId> allocate();  // head of the free list, ref count 1; nullopt when empty
  // All or nothing: appends n blocks to *out, or returns false and changes nothing.
  bool allocate_n(int64_t n, std::vector<BlockId>* out);
  void ref(BlockId b);    // ref count + 1; a free (cached) block leaves the free list ("touch")
  void unref(BlockId b);  // ref count - 1; at 0 the block goes to the free list's tail

  std::optional<BlockId> find(uint64_t hash) const;
  // Registers a full block under `hash` (which must not be in the map); returns its reg_id.
  uint64_t register_full(BlockId b, uint64_t hash, std::span<const int32_t> tokens, int32_t ns,
                         uint64_t parent_reg);
  // Registers a partly filled last block (1 .. block_size - 1 tokens) under `hash`: a finished
  // sequence's tail, found again by a prompt that continues the same prefix (chat turns).
  uint64_t register_tail(BlockId b, uint64_t hash, std::span<const int32_t> tokens, int32_t ns,
                         uint64_t parent_reg);
  void drop_hash(BlockId b);  // forget b's registration (no-op when not cached)

  const BlockInfo& info(BlockId b) const;
  std::vector<BlockId> free_list() const;  // head (next allocated) to tail

 private:
  // The registration both register_full and register_tail do once the token count is checked.
  uint64_t register_block(BlockId b, uint64_t hash, std::span<const int32_t> tokens, int32_t ns,
                          uint64_t parent_reg);
  void check(BlockId b) const;
  void list_remove(BlockId b);
  void list_push_back(BlockId b);

  int64_t block_size_;
  std::vector<BlockInfo> blocks_;
  std::vector<int32_t> prev_, next_;  // intrusive doubly linked free list, -1 = none
  std::vector<uint8_t> in_free_;
  int32_t head_ = -1, tail_ = -1;
  int64_t n_free_ = 0;
  std::unordered_map<uint64_t, BlockId> map_;
  uint64_t next_reg_ = 1;
  int64_t n_evictions_ = 0;
  int64_t high_water_ = 0;
};

// ---- tensor storage ----------------------------------------------------------------------------
// One piece of a block's memory, for gathered I/O.
struct IoPiece {
  void* data;
  size_t bytes;
};

// The memory the manager's block ids index, as the tiers below it see it: whole blocks as
// gathered pieces. PagedKvStorage (host RAM) is one; the CUDA device pools (gpu::DeviceHotTier,
// kvboost/gpu.h) another, whose pieces are device pointers that only a ColdStore with a device
// copy (HostColdStore over gpu::spill_copy) may touch. One call per block moved, never per row.
class HotTier {
 public:
  virtual ~HotTier() = default;
  virtual int64_t n_blocks() const = 0;
  virtual int64_t block_size() const = 0;
  virtual size_t block_bytes() const = 0;  // the sum of block_pieces(b)'s bytes
  virtual std::vector<IoPiece> block_pieces(BlockId b) = 0;  // Error for b outside [0, n_blocks)
};

// K and V of every layer, f32. Per layer, K and V are each a pool laid out as
//   [n_blocks][block_size][n_kv_heads][head_dim]
// so the row for position pos of a sequence is k_block(layer, table[pos / bs]) +
// (pos % bs) * n_kv_heads * head_dim. One anonymous mapping, zeroed lazily by the kernel and not
// reserved up front (MAP_NORESERVE): untouched blocks cost no memory.
class PagedKvStorage final : public HotTier {
 public:
  PagedKvStorage(int64_t n_blocks, int64_t block_size, int64_t n_layers, int64_t n_kv_heads,
                 int64_t head_dim);
  PagedKvStorage(PagedKvStorage&& o) noexcept;
  PagedKvStorage& operator=(PagedKvStorage&& o) noexcept;
  PagedKvStorage(const PagedKvStorage&) = delete;
  PagedKvStorage& operator=(const PagedKvStorage&) = delete;
  ~PagedKvStorage() override;

  // Bytes of one block over all layers, K and V.
  static size_t bytes_per_block(int64_t block_size, int64_t n_layers, int64_t n_kv_heads,
                                int64_t head_dim);
  size_t block_bytes() const override { return bytes_per_block(block_size_, n_layers_, n_kv_heads_, head_dim_); }

  int64_t n_blocks() const override { return n_blocks_; }
  int64_t block_size() const override { return block_size_; }
  int64_t n_layers() const { return n_layers_; }
  int64_t n_kv_heads() const { return n_kv_heads_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t block_floats() const { return block_size_ * n_kv_heads_ * head_dim_; }  // per K or V

  // The storage as a KvLayout (kvboost/kv_layout.h), under a sequence's block table (null: for
  // block-level access only). Every K/V access below goes through it.
  KvLayout layout(const BlockId* block_table = nullptr) const {
    return KvLayout{k_ptrs_.data(), v_ptrs_.data(), block_table, block_size_, n_kv_heads_, head_dim_};
  }
  float* k_pool(int64_t layer) { return k_ptrs_[size_t(layer)]; }
  float* v_pool(int64_t layer) { return v_ptrs_[size_t(layer)]; }
  float* k_block(int64_t layer, BlockId b) { return layout().k_block(layer, b); }
  float* v_block(int64_t layer, BlockId b) { return layout().v_block(layer, b); }
  const float* k_block(int64_t layer, BlockId b) const { return layout().k_block(layer, b); }
  const float* v_block(int64_t layer, BlockId b) const { return layout().v_block(layer, b); }

  void copy_block(BlockId src, BlockId dst);   // all layers, K and V (copy-on-write)
  // Commits the memory of blocks [first, first + n) (all layers, K and V) without changing what
  // it holds (MADV_POPULATE_WRITE), so that a later request's first write to them does not
  // fault page by page. False where the kernel refuses (before Linux 5.14): nothing changes.
  bool prefault(BlockId first, int64_t n);
  std::vector<IoPiece> block_pieces(BlockId b) override;  // layer 0 K, layer 0 V, layer 1 K, ...

 private:
  int64_t pool_offset(int64_t layer, int kv) const {
    return (layer * 2 + kv) * n_blocks_ * block_floats();
  }
  void release();
  int64_t n_blocks_, block_size_, n_layers_, n_kv_heads_, head_dim_;
  float* base_ = nullptr;
  size_t bytes_ = 0;
  std::vector<float*> k_ptrs_, v_ptrs_;  // per layer: the K and V pools inside base_
};

// ---- cold tier ---------------------------------------------------------------------------------
// A slower tier holding whole blocks in numbered slots. The interface is in terms of gathered
// pieces so that another hot tier (GPU memory) or cold tier (host memory) can implement it.
class ColdStore {
 public:
  virtual ~ColdStore() = default;
  virtual size_t slot_bytes() const = 0;
  virtual std::optional<int64_t> allocate_slot() = 0;  // nullopt when the store is full
  virtual void release_slot(int64_t slot) = 0;
  virtual int64_t n_slots_used() const = 0;
  // Writes one block (pieces totalling slot_bytes()).
  virtual void write(int64_t slot, std::span<const IoPiece> pieces) = 0;
  // Writes a batch of blocks: srcs[i] into slots[i]. The default writes them one by one; a
  // store whose copies are cheaper together (HostColdStore: one copy per run) coalesces.
  virtual void write_batch(std::span<const int64_t> slots, std::span<const std::vector<IoPiece>> srcs);
  // Reads a batch of blocks: slots[i] into dsts[i]. Implementations coalesce adjacent slots.
  virtual void read(std::span<const int64_t> slots, std::span<const std::vector<IoPiece>> dsts) = 0;
};

// Blocks in an unlinked temporary file under `dir` (process-private: no checksums), with
// pwritev/preadv. Slots are reused lowest first so that a sequence's spilled run stays contiguous.
// max_slots < 0: unlimited (bounded by the disk). I/O failures throw Error naming the directory.
class FileColdStore : public ColdStore {
 public:
  FileColdStore(const std::string& dir, size_t slot_bytes, int64_t max_slots = -1);
  ~FileColdStore() override;
  FileColdStore(const FileColdStore&) = delete;
  FileColdStore& operator=(const FileColdStore&) = delete;

  size_t slot_bytes() const override { return slot_bytes_; }
  std::optional<int64_t> allocate_slot() override;
  void release_slot(int64_t slot) override;
  int64_t n_slots_used() const override { return n_used_; }
  void write(int64_t slot, std::span<const IoPiece> pieces) override;
  void read(std::span<const int64_t> slots, std::span<const std::vector<IoPiece>> dsts) override;
  int64_t n_read_calls() const { return n_read_calls_; }  // preadv calls issued (tests)

 private:
  std::string dir_;
  size_t slot_bytes_;
  int64_t max_slots_;
  int fd_ = -1;
  int64_t high_water_ = 0, n_used_ = 0, n_read_calls_ = 0;
  std::vector<int64_t> free_slots_;  // min-heap
};

// What HostColdStore copies with: plain function pointers (no virtual call, no std::function),
// so that the store's logic is the same, and host-tested with memcpy, whatever the hot tier's
// memory is. The CUDA one (gpu::spill_copy, kvboost/gpu.h) issues cudaMemcpyAsync with
// cudaMemcpyDefault (UVA: either side may be device memory) on the device runner's stream and
// allocates pinned host memory (cudaHostAlloc). Failures throw Error.
struct SlotCopy {
  // bytes from src to dst; may return before the copy is done (see wait).
  void (*copy)(void* ctx, void* dst, const void* src, size_t bytes) = nullptr;
  // Returns once every copy issued so far is done. Null: copy is synchronous.
  void (*wait)(void* ctx) = nullptr;
  // Host memory for the slots and the staging buffer (pinned for a device). Null: malloc / free.
  void* (*alloc)(void* ctx, size_t bytes) = nullptr;
  void (*release)(void* ctx, void* p) = nullptr;
  void* ctx = nullptr;
};
SlotCopy memcpy_slot_copy();  // std::memcpy, malloc: host hot tiers and tests

// A cold tier of host-memory slots in front of a slower one: the device chain VRAM -> pinned
// host -> disk. Slots [0, n_host_slots) are host memory (one arena, allocated at the first
// host slot); when they are all taken, allocate_slot hands out slots of `next` (numbered
// n_host_slots + its slot), nullopt when there is no `next` or it is full. Host slots are reused
// lowest first, like FileColdStore's, so that a sequence's spilled run stays contiguous.
//
// Host layout: striped by piece_bytes (0: slot_bytes, must divide it): byte o of slot s lives at
// ((o / piece_bytes) * n_host_slots + s) * piece_bytes + o % piece_bytes, so that with
// piece_bytes = one layer's K (or V) of a block, the same piece of adjacent slots is adjacent as
// it is in the hot pools ([layer][block] per K and V). A batch's copies are sorted by host
// address and merged wherever both sides are contiguous: a run of adjacent slots moving to or
// from a run of adjacent blocks costs one copy per piece, not one per piece and block.
// `next` never sees the hot tier's pieces (they may be device memory, which read/write syscalls
// cannot touch): its blocks pass through a staging buffer of staging_bytes (at least one slot)
// in host memory from copy.alloc. `next` must outlive the store; the store never calls it from
// its destructor.
class HostColdStore : public ColdStore {
 public:
  HostColdStore(size_t slot_bytes, int64_t n_host_slots, SlotCopy copy = memcpy_slot_copy(),
                ColdStore* next = nullptr, size_t piece_bytes = 0, size_t staging_bytes = size_t(16) << 20);
  ~HostColdStore() override;
  HostColdStore(const HostColdStore&) = delete;
  HostColdStore& operator=(const HostColdStore&) = delete;

  // Host slots that fit in `bytes` (at least 0).
  static int64_t slots_for_budget(size_t bytes, size_t slot_bytes) { return slot_bytes ? int64_t(bytes / slot_bytes) : 0; }

  size_t slot_bytes() const override { return slot_bytes_; }
  std::optional<int64_t> allocate_slot() override;
  void release_slot(int64_t slot) override;
  int64_t n_slots_used() const override { return n_host_used_ + n_next_used_; }
  void write(int64_t slot, std::span<const IoPiece> pieces) override;
  void write_batch(std::span<const int64_t> slots, std::span<const std::vector<IoPiece>> srcs) override;
  void read(std::span<const int64_t> slots, std::span<const std::vector<IoPiece>> dsts) override;

  int64_t n_host_slots() const { return n_host_; }
  int64_t n_host_used() const { return n_host_used_; }
  int64_t n_next_used() const { return n_next_used_; }  // slots overflowed to `next`
  int64_t n_copies() const { return n_copies_; }        // copy calls issued (after merging; tests)

 private:
  struct Op {
    char* host;
    char* other;
    size_t bytes;
  };
  char* host_addr(int64_t slot, size_t o) const;
  // The host side of moving srcs[i] <-> host slot slots[i], merged; to_host: a write.
  void host_io(bool to_host, std::span<const int64_t> slots, std::span<const std::vector<IoPiece>> pieces);
  void next_io(bool to_next, std::span<const int64_t> slots, std::span<const std::vector<IoPiece>> pieces);
  // Splits a batch between the host slots and the next tier, runs both, waits once.
  void transfer(bool to_store, std::span<const int64_t> slots, std::span<const std::vector<IoPiece>> io);
  void issue(std::vector<Op>& ops, bool to_host);
  void wait();
  void* alloc(size_t bytes);

  size_t slot_bytes_, piece_bytes_, staging_bytes_;
  int64_t n_host_;
  SlotCopy copy_;
  ColdStore* next_;
  char* arena_ = nullptr;
  char* staging_ = nullptr;
  size_t staging_cap_ = 0;
  int64_t host_high_ = 0, n_host_used_ = 0, n_next_used_ = 0, n_copies_ = 0;
  std::vector<int64_t> free_host_;  // min-heap
};

// ---- manager -----------------------------------------------------------------------------------
struct CopyOp {
  BlockId src, dst;  // copy all of src's K/V to dst (PagedKvStorage::copy_block)
};

struct PromptAlloc {
  int64_t n_cached = 0;         // prompt tokens whose K/V are already in the block table
  std::vector<CopyOp> copies;   // to perform before anything else touches the pool (≤ 1)
  int64_t n_tail = 0;           // of n_cached, tokens copied from a cached tail (commit_tail)
};

struct SlotAlloc {
  BlockId block = 0;            // where the new token's K/V go
  int64_t offset = 0;           // row within the block
  std::optional<CopyOp> copy;   // copy-on-write of the previous (shared) last block
};

struct KvStats {
  int64_t n_blocks = 0, blocks_used = 0, blocks_free = 0;
  int64_t blocks_cached = 0;  // registered (findable) blocks, in use or free
  int64_t blocks_cold = 0;    // block-table entries held by the cold tier
  int64_t n_queries = 0, query_tokens = 0, hit_tokens = 0;  // successful allocate_for_prompt calls
  int64_t evictions = 0, spills = 0, page_ins = 0;
  double hit_rate() const { return query_tokens ? double(hit_tokens) / double(query_tokens) : 0.0; }
  std::string to_string() const;
};

class KvCacheManager {
 public:
  explicit KvCacheManager(int64_t n_blocks, int64_t block_size = kDefaultBlockSize);

  // Enables spilling: block data moves between `hot` (indexed by this manager's block ids: the
  // host PagedKvStorage, or a device's pools) and `cold`. Both must outlive the manager;
  // cold->slot_bytes() == hot->block_bytes(). Attaching again replaces the pair (only while no
  // block is cold: the engine on a device swaps the host pair for the device one at start).
  void attach_cold_tier(HotTier* hot, ColdStore* cold);

  // Starts sequence `seq` with its prompt: shares the longest verified run of cached full blocks,
  // allocates the rest. All prompt tokens cached: n_cached = n - 1 and the last block is copied
  // (CopyOp) so the recomputed last token never writes into a cached block. nullopt when the
  // pool cannot hold the prompt; the pool is then unchanged. Never spills.
  std::optional<PromptAlloc> allocate_for_prompt(SeqId seq, std::span<const int32_t> tokens,
                                                 std::string_view ns = "");
  // Reserves the slot for the next token (position n_tokens(seq)). A new block when the last is
  // full; copy-on-write when the last block is shared. nullopt (state unchanged) when no block.
  std::optional<SlotAlloc> append_slot(SeqId seq);
  // Registers the full blocks among tokens[0 .. tokens.size()) (K/V written) not yet registered.
  // Returns the number of blocks newly made findable.
  int64_t commit_full_blocks(SeqId seq, std::span<const int32_t> tokens);
  // Also makes the partly filled block after the last full one findable (call when the sequence
  // is about to be freed, with every full block of `tokens` committed): a later prompt that
  // continues the same verified chain copies the first r matching rows (a CopyOp in its
  // PromptAlloc) instead of recomputing them — token-granular reuse of a chat turn's last,
  // incomplete block. Keyed by the chain's parent (one tail per parent: a newer one replaces an
  // older one). Returns whether a tail was registered.
  bool commit_tail(SeqId seq, std::span<const int32_t> tokens);
  // dst shares all of src's blocks (parallel sampling, beam search); src must be fully resident.
  void fork(SeqId src, SeqId dst);
  // Drops the sequence. Blocks reach the free list's tail last block first, so among a prefix the
  // deepest blocks are evicted first and the shared beginning survives longest (as vLLM).
  void free(SeqId seq);
  // Speculative decoding's rollback: keeps only the first n_tokens slots of seq (slots reserved
  // for rejected draft tokens are given back; blocks left empty return to the pool). Committed
  // (prefix-cache) blocks are never cut: n_tokens below them is an Error.
  void truncate(SeqId seq, int64_t n_tokens);

  // Makes blocks [first, first + n) of seq's table resident, reading all cold ones in one batch
  // and spilling LRU blocks of other ranges/sequences as needed. Returns the number paged in, or
  // nullopt (nothing changed) when the hot pool cannot hold them.
  std::optional<int64_t> ensure_resident(SeqId seq, int64_t first_block, int64_t n_blocks);

  bool has_seq(SeqId seq) const { return seqs_.count(seq) != 0; }
  std::span<const BlockId> block_table(SeqId seq) const;  // kColdBlock for spilled entries
  int64_t n_tokens(SeqId seq) const;
  int64_t block_size() const { return pool_.block_size(); }
  const BlockPool& pool() const { return pool_; }
  KvStats stats() const;

  // Tests: replace the block hash (e.g. a constant, to force collisions).
  void set_hash_fn_for_testing(BlockHashFn fn) { hash_fn_ = std::move(fn); }

 private:
  struct Seq {
    std::vector<BlockId> blocks;  // hot block id, or kColdBlock
    std::vector<int64_t> cold;    // cold slot per entry, -1 when hot
    int64_t n_tokens = 0;         // slots reserved
    int32_t ns = 0;
    int64_t n_committed = 0;      // leading blocks whose chain (hash, reg) is known
    uint64_t chain_hash = 0;      // hash of block n_committed - 1 (the root when 0)
    uint64_t chain_reg = 0;       // its reg_id (0 when n_committed == 0)
    bool chain_broken = false;    // a collision or spill stopped registration
  };
  Seq& get(SeqId seq, const char* what);
  const Seq& get(SeqId seq, const char* what) const;
  int32_t intern_ns(std::string_view ns);
  uint64_t hash(uint64_t parent, std::span<const int32_t> tokens) const;
  // Key of the cached tail after a chain: the parent hashed with a token id no block can hold.
  uint64_t tail_key(uint64_t parent) const {
    static constexpr int32_t kMarker[1] = {-1};
    return hash(parent, kMarker);
  }
  void touch(BlockId b) { last_use_[size_t(b)] = ++tick_; }
  std::optional<BlockId> allocate_one();
  bool spill(int64_t n, SeqId pin_seq, int64_t pin_first, int64_t pin_end);

  BlockPool pool_;
  std::map<SeqId, Seq> seqs_;  // ordered: deterministic victim choice
  std::unordered_map<std::string, int32_t> ns_ids_;
  std::vector<uint64_t> last_use_;
  uint64_t tick_ = 0;
  BlockHashFn hash_fn_;
  HotTier* hot_ = nullptr;
  ColdStore* cold_ = nullptr;
  int64_t n_queries_ = 0, query_tokens_ = 0, hit_tokens_ = 0, spills_ = 0, page_ins_ = 0;
  int64_t n_cold_ = 0;
};

// ==============================================================================================
// ---- chunk-level KV reuse. Prompts are cut into chunks; each chunk has a prefix key (chained over all
// preceding tokens: an exact hit) and a content key (its tokens alone: a hit at any position).
// Computed chunks live in a ChunkStore: a RAM tier with a byte budget (evicted by frequency with
// recency; pinned chunks stay) over an optional disk tier that survives restarts (checksummed
// files written atomically; a corrupt or truncated file is a reported miss, never used).
// Stored K/V may be quantized (KIVI-style: keys per channel, values per token, in groups).


// ---- chunking and keys -------------------------------------------------------------------------
struct ChunkSpan {
  int64_t begin = 0, end = 0;  // token positions [begin, end)
  int64_t segment = 0;         // index of the segment it belongs to
};
// Cuts n tokens into chunks of chunk_size. Segments (starting at 0 and at each of
// segment_starts) are chunked independently: no chunk straddles a segment boundary. When
// is_break is given, each cut inside a segment may move by up to `window` tokens to the nearest
// position p where is_break(p) (a cut before token p), e.g. after a newline or a sentence end.
std::vector<ChunkSpan> cut_chunks(int64_t n_tokens, std::span<const int64_t> segment_starts,
                                  int64_t chunk_size, int64_t window = 0,
                                  const std::function<bool(int64_t)>& is_break = {});

// Keys carry the model identity and the tenant namespace (root). Prefix keys chain:
// key(c) = H(key(c - 1), tokens of c), key(-1) = root. A second, independently seeded chain
// (`check`) is stored with every prefix entry and compared on lookup, so a prefix hit is verified
// by its own tokens plus a 128-bit fingerprint of everything before it.
struct ChunkKeys {
  uint64_t prefix = 0, check = 0, content = 0;
};
uint64_t chunk_root(std::string_view model_id, std::string_view ns);
ChunkKeys chunk_keys(const ChunkKeys& prev, uint64_t root, std::span<const int32_t> tokens);
ChunkKeys chunk_first_keys(uint64_t root);  // the `prev` of the first chunk

// ---- stored chunks -----------------------------------------------------------------------------
enum class KvQuant : uint32_t { kF32 = 0, kInt8 = 1, kInt4 = 2 };
const char* kv_quant_name(KvQuant q);
KvQuant parse_kv_quant(std::string_view s);  // f32 | int8 | int4
inline constexpr int64_t kQuantGroup = 32;   // tokens (keys) or channels (values) per scale

struct ChunkShape {
  int64_t n_layers = 0, n_kv_heads = 0, head_dim = 0;
  int64_t row() const { return n_kv_heads * head_dim; }  // floats per token per layer, K or V
};

struct Chunk {
  std::vector<int32_t> tokens;
  int64_t pos0 = 0;                // position of tokens[0] when its K/V were computed
  ChunkKeys keys;                  // keys.prefix == 0: a content-only entry (not exact at pos0)
  uint64_t parent_prefix = 0;      // prefix key of the chunk that preceded it when computed
  KvQuant quant = KvQuant::kF32;
  std::vector<uint8_t> data;       // per layer: K then V, encoded (chunk_layer_bytes each)
  size_t bytes() const { return data.size() + tokens.size() * sizeof(int32_t) + sizeof(Chunk); }
};
size_t chunk_layer_bytes(const ChunkShape& s, KvQuant q, int64_t n_tokens);
// An empty chunk sized for n_tokens; fill it layer by layer.
void chunk_init(Chunk& c, const ChunkShape& s, KvQuant q, int64_t n_tokens);
// k, v: [n_tokens, row] f32 of one layer -> encoded into the chunk.
void chunk_put_layer(Chunk& c, const ChunkShape& s, int64_t layer, const float* k, const float* v);
// The reverse: decoded (dequantized) K and V of one layer, [n_tokens, row] each.
void chunk_get_layer(const Chunk& c, const ChunkShape& s, int64_t layer, float* k, float* v);

// ---- the store ---------------------------------------------------------------------------------
struct ChunkStoreOptions {
  size_t ram_bytes = size_t(512) << 20;
  std::string disk_dir;       // "" = RAM only
  size_t disk_bytes = 0;      // 0 = unlimited
  KvQuant quant = KvQuant::kF32;
  std::string model_id;       // disk files written for another model id are ignored
  // Pinned chunks (warm) count against ram_bytes and never exceed it; each owner (tenant) may
  // pin at most this many bytes (0 = no per-owner cap). A pin over either limit is refused.
  size_t max_pinned_per_owner = 0;
  // Remote tier shared by many servers (Redis/Valkey; docs/chunk-remote.md): "" = none, else
  // redis://[USER:PASSWORD@]HOST[:PORT][/DB][?prefix=P] or unix:///PATH[?db=N&prefix=P]. It never
  // fails a request: unreachable, slow, full or corrupt is a miss (logged once per episode, counted).
  std::string remote_url;
  int64_t remote_ttl_s = 0;                          // expiry of written entries, seconds (0: none)
  size_t remote_max_entry_bytes = size_t(64) << 20;  // larger entries are neither written nor used
  size_t remote_queue = 64;                          // writes waiting; more are dropped (counted)
  int remote_timeout_ms = 250;                       // connect and command timeout
};

// Upper bounds (ms) of the remote fetch latency histogram's buckets; one more bucket: +Inf.
inline constexpr double kRemoteFetchBucketsMs[] = {0.5, 1, 2, 5, 10, 20, 50, 100, 250, 1000};
inline constexpr size_t kRemoteFetchBuckets = sizeof(kRemoteFetchBucketsMs) / sizeof(double) + 1;

struct RemoteStats {
  bool enabled = false, up = false;
  int64_t hits = 0, misses = 0, bytes = 0;     // chunks found / asked for and absent; bytes fetched
  int64_t corrupt = 0;                         // fetched values that failed verification (not used)
  int64_t errors = 0;                          // failed commands (connection, timeout, error reply)
  int64_t skipped = 0;                         // chunks not fetched: recomputing them is cheaper
  int64_t unavailable = 0;                     // chunks not looked up: the remote was down (backoff)
  int64_t fetches = 0;                         // round trips (one per prompt)
  int64_t writes = 0, write_bytes = 0, write_drops = 0, write_errors = 0, too_big = 0;
  double fetch_ms_sum = 0;
  int64_t fetch_ms_buckets[kRemoteFetchBuckets] = {};  // per bucket, not cumulative
  double rtt_ms = 0, mb_per_s = 0, prefill_tok_per_s = 0;  // the cost model's current estimates
};

struct ChunkStats {
  int64_t entries = 0, entries_ram = 0, entries_disk = 0, pinned = 0;
  int64_t pinned_bytes = 0, pins_refused = 0;
  int64_t bytes_ram = 0, bytes_disk = 0;
  int64_t lookups = 0, prefix_hits = 0, content_hits = 0, disk_loads = 0, corrupt = 0;
  int64_t stores = 0, evictions_ram = 0, evictions_disk = 0;
  std::vector<std::string> corrupt_files;  // the most recent few
  RemoteStats remote;
  double hit_rate() const { return lookups ? double(prefix_hits + content_hits) / double(lookups) : 0; }
  std::string to_string() const;
};

class RemoteStore;  // the remote tier (src/kv/remote_store.h)

// One remote entry as `kvboost cache --chunk-remote` lists it.
struct RemoteEntryInfo {
  std::string key;
  size_t bytes = 0;
  int64_t ttl_s = -1;        // -1: no expiry
  int64_t n_tokens = 0;
  std::string ns, quant;
  std::string problem;       // "" = verified
};

// A chunk of a prompt, for the remote tier's one-round-trip lookup.
struct ChunkQuery {
  ChunkKeys keys;
  std::span<const int32_t> tokens;
};

// An asynchronous remote lookup (ChunkStore::fetch_remote_async): done once its verified chunks
// are in the RAM tier (or it failed, or was dropped: n = 0). expected_ms: the cost model's
// estimate of the round trip when it was issued; compute_ms: of recomputing what it asks for
// (infinity until a prefill was measured).
struct RemoteFetch {
  double t0 = 0, expected_ms = 0, compute_ms = 0;
  int64_t first_token = 0;  // the first position (in the prompt) of a chunk it asks for (caller's)
  bool wait_for(double ms);  // true when done (waits at most ms)
  bool ready();
  int64_t n = 0;             // chunks promoted (valid once done)
  double ms = 0;             // how long it took
  void finish(int64_t n_promoted);
 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
};

// Thread-safe. Disk and remote writes happen on background threads (flush() waits for them).
class ChunkStore {
 public:
  ChunkStore(const ChunkShape& shape, const ChunkStoreOptions& opt);
  ~ChunkStore();
  ChunkStore(const ChunkStore&) = delete;
  ChunkStore& operator=(const ChunkStore&) = delete;

  const ChunkShape& shape() const { return shape_; }
  const ChunkStoreOptions& options() const { return opt_; }

  // Lookups verify the tokens (and the prefix fingerprint); nullptr on a miss. A hit on a
  // disk-only entry reads and checks the file; a bad file is dropped, counted and reported.
  std::shared_ptr<const Chunk> find_prefix(const ChunkKeys& keys, std::span<const int32_t> tokens);
  std::shared_ptr<const Chunk> find_content(uint64_t content_key, std::span<const int32_t> tokens);
  bool contains_prefix(uint64_t prefix_key) const;
  bool contains_content(uint64_t content_key) const;
  // Adds a chunk (its keys say under which indexes). An existing entry with the same prefix key
  // (or, for content-only chunks, content key) is kept and only pinned if asked. Returns false
  // when a pin was refused (over ram_bytes or the owner's max_pinned_per_owner): the chunk is
  // then stored unpinned, evictable like any other.
  // `ns`: the tenant namespace, which the remote tier's keys and values carry; `owner`: who pins.
  bool put(std::shared_ptr<Chunk> c, bool pin = false, std::string_view ns = {}, const std::string& owner = "");
  size_t pinned_bytes(const std::string& owner) const;  // what that owner has pinned
  void unpin_all();
  // Reads every disk-tier file in full and checks its checksum (start-up only checks headers and
  // sizes); corrupt files are removed, counted and listed in stats(). Returns how many.
  int64_t verify_disk();
  void flush();  // waits until queued disk (and remote) writes are done
  ChunkStats stats() const;

  // Remote tier. fetch_remote looks up, in one pipelined round trip, the chunks of a prompt that
  // the local tiers lack and that the cost model says are cheaper to fetch than to recompute
  // (content: also by content key); verified entries go to the RAM tier, where the usual
  // find_prefix / find_content find them. Returns the number promoted. Never throws for a
  // remote failure. note_prefill feeds the cost model's prefill rate.
  bool has_remote() const { return remote_ != nullptr; }
  int64_t fetch_remote(std::string_view ns, std::span<const ChunkQuery> chunks, bool content);
  // The same on the remote tier's lookup thread, so that a prefill can run meanwhile; the chunks
  // are copied. Lookups run one at a time, in order; dropped (done, n = 0) when the store closes.
  std::shared_ptr<RemoteFetch> fetch_remote_async(std::string ns, std::vector<ChunkKeys> keys,
                                                  std::vector<std::vector<int32_t>> tokens, bool content);
  void note_prefill(int64_t n_tokens, double ms);
  // Lists and verifies up to `limit` remote entries of this model (throws Error if unreachable).
  std::vector<RemoteEntryInfo> list_remote(size_t limit) const;

 private:
  struct Entry;
  void scan_disk();
  std::shared_ptr<const Chunk> load_locked(Entry& e);
  void touch(Entry& e);
  void evict_ram_locked(size_t incoming);
  void evict_disk_locked();
  void drop_locked(uint64_t id);
  void writer_loop();
  void note_corrupt_locked(const std::string& path, const std::string& why);
  bool put_locked(std::shared_ptr<Chunk> c, bool pin, const std::string& owner, bool* refused);

  ChunkShape shape_;
  ChunkStoreOptions opt_;
  uint64_t model_hash_ = 0;
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, std::unique_ptr<Entry>> entries_;  // by entry id
  std::unordered_map<uint64_t, uint64_t> by_prefix_, by_content_;
  std::unordered_map<std::string, size_t> pinned_by_owner_;
  bool may_pin_locked(const std::string& owner, size_t bytes) const;
  void unpin_locked(Entry& e);
  uint64_t next_id_ = 1, tick_ = 0;
  ChunkStats st_;
  // disk writer
  std::deque<std::pair<uint64_t, std::shared_ptr<const Chunk>>> queue_;
  std::condition_variable cv_, idle_cv_;
  bool stop_ = false, writing_ = false;
  std::thread writer_;
  std::unique_ptr<RemoteStore> remote_;
};

// Disk format of one chunk (exposed for tests): write atomically (temporary file + rename) /
// read and verify (throws Error naming the file and the problem: truncated, bad magic, checksum).
void write_chunk_file(const std::string& path, const Chunk& c, const ChunkShape& s, uint64_t model_hash);
Chunk read_chunk_file(const std::string& path, const ChunkShape& s, uint64_t model_hash);

}  // namespace kvboost::kv
