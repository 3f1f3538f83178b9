// HostColdStore (kvboost/kv.h): host-memory slots in front of a slower cold tier, moving blocks
// with a caller's copy primitive (memcpy for host hot tiers; cudaMemcpyAsync for the device
// pools, src/gpu/paged_spill.cpp). The logic lives here, the same in every build, so that slot
// accounting, overflow to the next tier, staging and merging are tested without a device.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "kvboost/kv.h"

namespace kvboost::kv {

SlotCopy memcpy_slot_copy() {
  SlotCopy c;
  c.copy = [](void*, void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); };
  return c;
}

HostColdStore::HostColdStore(size_t slot_bytes, int64_t n_host_slots, SlotCopy copy, ColdStore* next,
                             size_t piece_bytes, size_t staging_bytes)
    : slot_bytes_(slot_bytes), piece_bytes_(piece_bytes ? piece_bytes : slot_bytes),
      staging_bytes_(staging_bytes), n_host_(n_host_slots), copy_(copy), next_(next) {
  if (slot_bytes == 0) fail("HostColdStore: slot_bytes must be positive");
  if (n_host_slots < 0) fail("HostColdStore: n_host_slots ", n_host_slots, " is negative");
  if (slot_bytes_ % piece_bytes_ != 0)
    fail("HostColdStore: piece_bytes ", piece_bytes_, " does not divide slot_bytes ", slot_bytes_);
  if (!copy_.copy) fail("HostColdStore: no copy function");
  if ((copy_.alloc == nullptr) != (copy_.release == nullptr))
    fail("HostColdStore: SlotCopy needs both alloc and release, or neither");
  if (next_ && next_->slot_bytes() != slot_bytes_)
    fail("HostColdStore: the next tier's slots hold ", next_->slot_bytes(), " bytes, these ", slot_bytes_);
}

HostColdStore::~HostColdStore() {
  for (char* p : {arena_, staging_}) {
    if (!p) continue;
    if (copy_.release) copy_.release(copy_.ctx, p);
    else std::free(p);
  }
}

void* HostColdStore::alloc(size_t bytes) {
  void* p = copy_.alloc ? copy_.alloc(copy_.ctx, bytes) : std::malloc(bytes);
  if (!p) fail("HostColdStore: cannot allocate ", bytes, " bytes of host memory (", n_host_, " slots of ", slot_bytes_, ")");
  return p;
}

std::optional<int64_t> HostColdStore::allocate_slot() {
  if (!free_host_.empty()) {
    std::pop_heap(free_host_.begin(), free_host_.end(), std::greater<>());
    const int64_t slot = free_host_.back();
    free_host_.pop_back();
    ++n_host_used_;
    return slot;
  }
  if (host_high_ < n_host_) {
    // The whole budget at the first host slot: one arena keeps the striped layout's pieces of
    // adjacent slots adjacent (and pinned allocations are slow: one, not one per slot).
    if (!arena_) arena_ = static_cast<char*>(alloc(size_t(n_host_) * slot_bytes_));
    ++n_host_used_;
    return host_high_++;
  }
  if (!next_) return std::nullopt;
  const auto s = next_->allocate_slot();
  if (!s) return std::nullopt;
  ++n_next_used_;
  return n_host_ + *s;
}

void HostColdStore::release_slot(int64_t slot) {
  if (slot >= 0 && slot < host_high_) {
    free_host_.push_back(slot);
    std::push_heap(free_host_.begin(), free_host_.end(), std::greater<>());
    --n_host_used_;
  } else if (slot >= n_host_ && next_) {
    next_->release_slot(slot - n_host_);
    --n_next_used_;
  } else {
    fail("HostColdStore: release of unknown slot ", slot);
  }
}

char* HostColdStore::host_addr(int64_t slot, size_t o) const {
  const size_t pb = piece_bytes_;
  return arena_ + ((o / pb) * size_t(n_host_) + size_t(slot)) * pb + o % pb;
}

namespace {

// Appends the copies between a block's pieces and its host image, byte o of the block at
// addr(o), split where the host image's stripes end (every piece_bytes). Error unless the pieces
// total slot_bytes.
template <class Addr>
void add_ops(std::vector<char*>& host, std::vector<char*>& other, std::vector<size_t>& bytes,
             std::span<const IoPiece> pieces, size_t slot_bytes, size_t piece_bytes, Addr addr) {
  size_t total = 0;
  for (const IoPiece& p : pieces) total += p.bytes;
  if (total != slot_bytes) fail("HostColdStore: block of ", total, " bytes, slots hold ", slot_bytes);
  size_t o = 0;
  for (const IoPiece& p : pieces)
    for (size_t done = 0; done < p.bytes;) {
      const size_t take = std::min(p.bytes - done, piece_bytes - o % piece_bytes);
      host.push_back(addr(o));
      other.push_back(static_cast<char*>(p.data) + done);
      bytes.push_back(take);
      done += take, o += take;
    }
}

}  // namespace

void HostColdStore::issue(std::vector<Op>& ops, bool to_host) {
  // Sorted by host address, then merged where both sides continue each other.
  std::sort(ops.begin(), ops.end(), [](const Op& a, const Op& b) { return a.host < b.host; });
  size_t w = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (w > 0 && ops[w - 1].host + ops[w - 1].bytes == ops[i].host &&
        ops[w - 1].other + ops[w - 1].bytes == ops[i].other) {
      ops[w - 1].bytes += ops[i].bytes;
      continue;
    }
    ops[w++] = ops[i];
  }
  ops.resize(w);
  for (const Op& op : ops) {
    if (to_host) copy_.copy(copy_.ctx, op.host, op.other, op.bytes);
    else copy_.copy(copy_.ctx, op.other, op.host, op.bytes);
  }
  n_copies_ += int64_t(ops.size());
}

void HostColdStore::wait() {
  if (copy_.wait) copy_.wait(copy_.ctx);
}

void HostColdStore::host_io(bool to_host, std::span<const int64_t> slots, std::span<const std::vector<IoPiece>> pieces) {
  std::vector<char*> host, other;
  std::vector<size_t> bytes;
  for (size_t k = 0; k < slots.size(); ++k) {
    const int64_t s = slots[k];
    if (s < 0 || s >= host_high_) fail("HostColdStore: ", to_host ? "write to" : "read of", " unknown slot ", s);
    add_ops(host, other, bytes, pieces[k], slot_bytes_, piece_bytes_, [&](size_t o) { return host_addr(s, o); });
  }
  std::vector<Op> ops(host.size());
  for (size_t i = 0; i < ops.size(); ++i) ops[i] = {host[i], other[i], bytes[i]};
  issue(ops, to_host);
}

void HostColdStore::next_io(bool to_next, std::span<const int64_t> slots, std::span<const std::vector<IoPiece>> pieces) {
  if (slots.empty()) return;
  if (!next_) fail("HostColdStore: slot ", slots[0], " past the ", n_host_, " host slots and no next tier");
  const size_t cap = std::max<size_t>(1, staging_bytes_ / slot_bytes_);
  if (!staging_) {
    staging_cap_ = cap;
    staging_ = static_cast<char*>(alloc(cap * slot_bytes_));
  }
  std::vector<int64_t> sub;
  std::vector<std::vector<IoPiece>> stage;
  for (size_t g = 0; g < slots.size(); g += staging_cap_) {
    const size_t n = std::min(staging_cap_, slots.size() - g);
    sub.clear(), stage.clear();
    std::vector<char*> host, other;
    std::vector<size_t> bytes;
    for (size_t j = 0; j < n; ++j) {
      sub.push_back(slots[g + j] - n_host_);
      char* base = staging_ + j * slot_bytes_;
      stage.push_back({{base, slot_bytes_}});
      add_ops(host, other, bytes, pieces[g + j], slot_bytes_, piece_bytes_, [&](size_t o) { return base + o; });
    }
    std::vector<Op> ops(host.size());
    for (size_t i = 0; i < ops.size(); ++i) ops[i] = {host[i], other[i], bytes[i]};
    if (to_next) {
      issue(ops, true);
      wait();  // the staged bytes, before the next tier reads them
      next_->write_batch(sub, stage);
    } else {
      next_->read(sub, stage);
      issue(ops, false);
      wait();  // before the staging buffer is refilled
    }
  }
}

void HostColdStore::write(int64_t slot, std::span<const IoPiece> pieces) {
  const std::vector<IoPiece> p(pieces.begin(), pieces.end());
  write_batch(std::span(&slot, 1), std::span(&p, 1));
}

void HostColdStore::transfer(bool to_store, std::span<const int64_t> slots, std::span<const std::vector<IoPiece>> io) {
  // Host slots first, then the next tier's; one wait at the end: the manager hands out the hot
  // blocks (after a write) or releases the slots (after a read) as soon as this returns.
  std::vector<int64_t> hs, ns;
  std::vector<std::vector<IoPiece>> hp, np;
  for (size_t i = 0; i < slots.size(); ++i) {
    const bool host = slots[i] < n_host_;
    (host ? hs : ns).push_back(slots[i]);
    (host ? hp : np).push_back(io[i]);
  }
  host_io(to_store, hs, hp);
  next_io(to_store, ns, np);
  wait();
}

void HostColdStore::write_batch(std::span<const int64_t> slots, std::span<const std::vector<IoPiece>> srcs) {
  if (slots.size() != srcs.size()) fail("HostColdStore::write_batch: ", slots.size(), " slots, ", srcs.size(), " sources");
  transfer(true, slots, srcs);
}

void HostColdStore::read(std::span<const int64_t> slots, std::span<const std::vector<IoPiece>> dsts) {
  if (slots.size() != dsts.size()) fail("HostColdStore::read: ", slots.size(), " slots, ", dsts.size(), " destinations");
  transfer(false, slots, dsts);
}

}  // namespace kvboost::kv
