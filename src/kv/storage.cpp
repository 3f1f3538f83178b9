// Tensor side of the KV cache: the paged K/V arrays (PagedKvStorage) and the file-backed cold
// tier (FileColdStore).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <functional>
#include <numeric>
#include <utility>

#include "kvboost/kv.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; Debian 12's glibc headers predate it
#endif

namespace kvboost::kv {

// ---- PagedKvStorage ----------------------------------------------------------------------------

size_t PagedKvStorage::bytes_per_block(int64_t block_size, int64_t n_layers, int64_t n_kv_heads,
                                       int64_t head_dim) {
  if (block_size <= 0 || n_layers <= 0 || n_kv_heads <= 0 || head_dim <= 0) return 0;
  return size_t(2 * n_layers * block_size * n_kv_heads * head_dim) * sizeof(float);
}

PagedKvStorage::PagedKvStorage(int64_t n_blocks, int64_t block_size, int64_t n_layers,
                               int64_t n_kv_heads, int64_t head_dim)
    : n_blocks_(n_blocks), block_size_(block_size), n_layers_(n_layers), n_kv_heads_(n_kv_heads),
      head_dim_(head_dim) {
  const size_t per = bytes_per_block(block_size, n_layers, n_kv_heads, head_dim);
  if (n_blocks <= 0 || per == 0)
    fail("PagedKvStorage: bad shape n_blocks=", n_blocks, " block_size=", block_size,
         " n_layers=", n_layers, " n_kv_heads=", n_kv_heads, " head_dim=", head_dim);
  bytes_ = per * size_t(n_blocks);
  // Anonymous private mapping: zero-filled on first touch, nothing committed up front.
  void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    fail("PagedKvStorage: mmap of ", bytes_, " bytes failed: ", std::strerror(errno));
  base_ = static_cast<float*>(p);
  // Transparent huge pages where the kernel offers them (THP "madvise" mode, Debian's default):
  // the pool is touched first by a request's copy-ins and prefill, and with 4 KiB pages a
  // re-ordered RAG prompt of ~1,900 tokens faulted in ~60 MB page by page -- a third of its
  // time to first token on Gemma 3 270M (perf, 2026-12-05). Advice only: ignored where refused.
  (void)::madvise(p, bytes_, MADV_HUGEPAGE);
  for (int64_t l = 0; l < n_layers; ++l) {
    k_ptrs_.push_back(base_ + pool_offset(l, 0));
    v_ptrs_.push_back(base_ + pool_offset(l, 1));
  }
}

PagedKvStorage::PagedKvStorage(PagedKvStorage&& o) noexcept
    : n_blocks_(o.n_blocks_), block_size_(o.block_size_), n_layers_(o.n_layers_),
      n_kv_heads_(o.n_kv_heads_), head_dim_(o.head_dim_), base_(o.base_), bytes_(o.bytes_),
      k_ptrs_(std::move(o.k_ptrs_)), v_ptrs_(std::move(o.v_ptrs_)) {
  o.base_ = nullptr;
  o.bytes_ = 0;
  o.k_ptrs_.clear(), o.v_ptrs_.clear();
}

PagedKvStorage& PagedKvStorage::operator=(PagedKvStorage&& o) noexcept {
  if (this != &o) {
    release();
    n_blocks_ = o.n_blocks_;
    block_size_ = o.block_size_;
    n_layers_ = o.n_layers_;
    n_kv_heads_ = o.n_kv_heads_;
    head_dim_ = o.head_dim_;
    base_ = o.base_;
    bytes_ = o.bytes_;
    k_ptrs_ = std::move(o.k_ptrs_), v_ptrs_ = std::move(o.v_ptrs_);
    o.base_ = nullptr;
    o.bytes_ = 0;
    o.k_ptrs_.clear(), o.v_ptrs_.clear();
  }
  return *this;
}

PagedKvStorage::~PagedKvStorage() { release(); }

bool PagedKvStorage::prefault(BlockId first, int64_t n) {
  if (!base_ || first < 0 || n <= 0 || first >= n_blocks_) return false;
  n = std::min<int64_t>(n, n_blocks_ - first);
  const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  const size_t per = size_t(block_floats()) * sizeof(float);
  for (int64_t l = 0; l < n_layers_; ++l)
    for (int kv = 0; kv < 2; ++kv) {
      // madvise takes page-aligned bounds: the pages wholly inside the range.
      const uintptr_t a = reinterpret_cast<uintptr_t>(base_ + pool_offset(l, kv)) + uintptr_t(first) * per;
      const uintptr_t lo = (a + page - 1) & ~(page - 1), hi = (a + size_t(n) * per) & ~(page - 1);
      if (hi > lo && ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_POPULATE_WRITE) != 0) return false;
    }
  return true;
}

void PagedKvStorage::release() {
  if (base_) ::munmap(base_, bytes_);
  base_ = nullptr;
  bytes_ = 0;
  k_ptrs_.clear(), v_ptrs_.clear();
}

void PagedKvStorage::copy_block(BlockId src, BlockId dst) {
  if (src < 0 || src >= n_blocks_ || dst < 0 || dst >= n_blocks_)
    fail("PagedKvStorage::copy_block: block ", src, " -> ", dst, " outside [0, ", n_blocks_, ")");
  if (src == dst) return;
  const size_t n = size_t(block_floats()) * sizeof(float);
  const KvLayout L = layout();
  for (int64_t l = 0; l < n_layers_; ++l) {
    std::memcpy(L.k_block(l, dst), L.k_block(l, src), n);
    std::memcpy(L.v_block(l, dst), L.v_block(l, src), n);
  }
}

std::vector<IoPiece> PagedKvStorage::block_pieces(BlockId b) {
  if (b < 0 || b >= n_blocks_) fail("PagedKvStorage: block ", b, " outside [0, ", n_blocks_, ")");
  const size_t n = size_t(block_floats()) * sizeof(float);
  std::vector<IoPiece> out;
  out.reserve(size_t(2 * n_layers_));
  const KvLayout L = layout();  // the spill tier moves whole blocks: every layer's K and V rows
  for (int64_t l = 0; l < n_layers_; ++l) {
    out.push_back({L.k_block(l, b), n});
    out.push_back({L.v_block(l, b), n});
  }
  return out;
}

// ---- ColdStore -----------------------------------------------------------------------------------

void ColdStore::write_batch(std::span<const int64_t> slots, std::span<const std::vector<IoPiece>> srcs) {
  if (slots.size() != srcs.size()) fail("ColdStore::write_batch: ", slots.size(), " slots, ", srcs.size(), " sources");
  for (size_t i = 0; i < slots.size(); ++i) write(slots[i], srcs[i]);
}

// ---- FileColdStore -----------------------------------------------------------------------------

namespace {

// preadv/pwritev until every byte of iov moved (short transfers are legal on regular files).
void full_io(bool write, int fd, std::vector<iovec> iov, off_t off, const std::string& dir) {
  size_t i = 0;
  while (i < iov.size()) {
    const int cnt = int(std::min<size_t>(iov.size() - i, IOV_MAX));
    const ssize_t r = write ? ::pwritev(fd, &iov[i], cnt, off) : ::preadv(fd, &iov[i], cnt, off);
    if (r < 0) {
      if (errno == EINTR) continue;
      fail("cold KV store in ", dir, ": ", write ? "write" : "read", " failed: ", std::strerror(errno));
    }
    if (r == 0) fail("cold KV store in ", dir, ": unexpected end of file at offset ", int64_t(off));
    off += r;
    size_t left = size_t(r);
    while (i < iov.size() && left >= iov[i].iov_len) left -= iov[i++].iov_len;
    if (left) {
      iov[i].iov_base = static_cast<char*>(iov[i].iov_base) + left;
      iov[i].iov_len -= left;
    }
  }
}

}  // namespace

FileColdStore::FileColdStore(const std::string& dir, size_t slot_bytes, int64_t max_slots)
    : dir_(dir), slot_bytes_(slot_bytes), max_slots_(max_slots) {
  if (slot_bytes == 0) fail("FileColdStore: slot_bytes must be positive");
  // O_TMPFILE: an unnamed file that disappears with the process; mkstemp + unlink where the file
  // system lacks it.
  fd_ = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd_ < 0) {
    std::string tmpl = path_join(dir, "kvboost-cold-XXXXXX");
    fd_ = ::mkostemp(tmpl.data(), O_CLOEXEC);
    if (fd_ < 0) fail("cold KV store: cannot create a file in ", dir, ": ", std::strerror(errno));
    ::unlink(tmpl.c_str());
  }
}

FileColdStore::~FileColdStore() {
  if (fd_ >= 0) ::close(fd_);
}

std::optional<int64_t> FileColdStore::allocate_slot() {
  int64_t slot;
  if (!free_slots_.empty()) {
    std::pop_heap(free_slots_.begin(), free_slots_.end(), std::greater<>());
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else {
    if (max_slots_ >= 0 && high_water_ >= max_slots_) return std::nullopt;
    slot = high_water_++;
  }
  ++n_used_;
  return slot;
}

void FileColdStore::release_slot(int64_t slot) {
  if (slot < 0 || slot >= high_water_) fail("FileColdStore: release of unknown slot ", slot);
  free_slots_.push_back(slot);
  std::push_heap(free_slots_.begin(), free_slots_.end(), std::greater<>());
  --n_used_;
}

void FileColdStore::write(int64_t slot, std::span<const IoPiece> pieces) {
  if (slot < 0 || slot >= high_water_) fail("FileColdStore: write to unknown slot ", slot);
  std::vector<iovec> iov;
  size_t total = 0;
  for (const IoPiece& p : pieces) {
    iov.push_back({p.data, p.bytes});
    total += p.bytes;
  }
  if (total != slot_bytes_) fail("FileColdStore: block of ", total, " bytes, slots hold ", slot_bytes_);
  full_io(true, fd_, std::move(iov), off_t(slot) * off_t(slot_bytes_), dir_);
}

void FileColdStore::read(std::span<const int64_t> slots, std::span<const std::vector<IoPiece>> dsts) {
  if (slots.size() != dsts.size()) fail("FileColdStore::read: ", slots.size(), " slots, ", dsts.size(), " destinations");
  // Sort by slot and issue one preadv per run of consecutive slots.
  std::vector<size_t> order(slots.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return slots[a] < slots[b]; });
  size_t i = 0;
  while (i < order.size()) {
    size_t j = i + 1;
    while (j < order.size() && slots[order[j]] == slots[order[j - 1]] + 1) ++j;
    std::vector<iovec> iov;
    for (size_t k = i; k < j; ++k) {
      const int64_t s = slots[order[k]];
      if (s < 0 || s >= high_water_) fail("FileColdStore: read of unknown slot ", s);
      size_t total = 0;
      for (const IoPiece& p : dsts[order[k]]) {
        iov.push_back({p.data, p.bytes});
        total += p.bytes;
      }
      if (total != slot_bytes_) fail("FileColdStore: block of ", total, " bytes, slots hold ", slot_bytes_);
    }
    ++n_read_calls_;
    full_io(false, fd_, std::move(iov), off_t(slots[order[i]]) * off_t(slot_bytes_), dir_);
    i = j;
  }
}

}  // namespace kvboost::kv
