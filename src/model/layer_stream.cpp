// Layer streaming: see layer_stream.h for the design.
#include "layer_stream.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>

#include "kvboost/common.h"
#include "kvboost/model.h"
#include "kvboost/model_files.h"

namespace kvboost::stream {

namespace {

constexpr uint64_t kGap = uint64_t(1) << 20;  // tensors closer than this are read in one extent
constexpr uint64_t kChunk = uint64_t(64) << 20;  // bytes per pread call

uint64_t align_down(uint64_t x) { return x / LayerStreamer::kAlign * LayerStreamer::kAlign; }
uint64_t align_up(uint64_t x) { return (x + LayerStreamer::kAlign - 1) / LayerStreamer::kAlign * LayerStreamer::kAlign; }

struct Plan {
  struct Ext {
    int file;
    uint64_t file_off, len, slot_off;
  };
  std::vector<Ext> extents;
  std::vector<uint64_t> tensor_slot_off;
  uint64_t bytes = 0;
};

// Groups a layer's tensors into aligned extents and places them in a slot.
Plan plan_layer(const std::vector<TensorRef>& ts) {
  std::vector<size_t> order(ts.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return ts[a].file != ts[b].file ? ts[a].file < ts[b].file : ts[a].offset < ts[b].offset;
  });
  Plan p;
  p.tensor_slot_off.resize(ts.size());
  // Extents over raw byte ranges first, then aligned.
  std::vector<std::vector<size_t>> members;
  std::vector<std::pair<uint64_t, uint64_t>> raw;  // [begin, end)
  std::vector<int> file;
  for (size_t i : order) {
    const TensorRef& t = ts[i];
    if (!raw.empty() && file.back() == t.file && t.offset <= raw.back().second + kGap) {
      raw.back().second = std::max(raw.back().second, t.offset + t.nbytes);
      members.back().push_back(i);
    } else {
      raw.push_back({t.offset, t.offset + t.nbytes});
      file.push_back(t.file);
      members.push_back({i});
    }
  }
  uint64_t slot_off = 0;
  for (size_t e = 0; e < raw.size(); ++e) {
    const uint64_t b = align_down(raw[e].first), end = align_up(raw[e].second);
    p.extents.push_back({file[e], b, end - b, slot_off});
    for (size_t i : members[e]) p.tensor_slot_off[i] = slot_off + (ts[i].offset - b);
    slot_off += end - b;
  }
  p.bytes = slot_off;
  return p;
}

}  // namespace

uint64_t LayerStreamer::slot_bytes_for(const std::vector<std::vector<TensorRef>>& layers) {
  uint64_t m = 0;
  for (const auto& l : layers) m = std::max(m, plan_layer(l).bytes);
  return m;
}

void LayerStreamer::check_budget(const std::vector<std::vector<TensorRef>>& layers, uint64_t budget) {
  uint64_t matrices = 0, slot = 0;
  for (const auto& l : layers) {
    uint64_t m = 0;
    for (const TensorRef& t : l) m += t.nbytes;
    matrices = std::max(matrices, m);
    slot = std::max(slot, plan_layer(l).bytes);
  }
  if (budget < 2 * slot)
    fail("weight budget of ", budget, " bytes (", budget >> 20, " MiB) holds fewer than two layers: one layer's matrices take ",
         matrices, " bytes (", slot, " bytes as read with 4096-byte alignment), so the budget must be at least ",
         2 * slot, " bytes (", (2 * slot + (1 << 20) - 1) >> 20, " MiB)");
}

LayerStreamer::LayerStreamer(const std::vector<std::string>& files, const std::vector<std::vector<TensorRef>>& layers,
                             uint64_t budget, bool direct,
                             std::function<void(bool, int64_t, int64_t)> on_read)
    : paths_(files), on_read_(std::move(on_read)) {
  if (layers.empty()) fail("layer streaming: the model has no layers");
  if (slot_bytes_for(layers) == 0) fail("layer streaming: the layers have no matrices");
  check_budget(layers, budget);
  for (const auto& l : layers) {
    Plan p = plan_layer(l);
    for (const TensorRef& t : l)
      if (t.file < 0 || size_t(t.file) >= files.size()) fail("layer streaming: tensor names file ", t.file);
    LayerPlan lp;
    for (const auto& e : p.extents) lp.extents.push_back(Extent{e.file, e.file_off, e.len, e.slot_off});
    lp.tensor_slot_off = std::move(p.tensor_slot_off);
    slot_bytes_ = std::max(slot_bytes_, p.bytes);
    layers_.push_back(std::move(lp));
  }
  n_slots_ = int64_t(std::min<uint64_t>(budget / slot_bytes_, uint64_t(layers_.size())));
  n_slots_ = std::max<int64_t>(n_slots_, 2);

  stats_.direct = true;
  for (const std::string& path : files) {
    int fd = -1;
    bool d = false;
    if (direct) {
      fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
      d = fd >= 0;
    }
    if (fd < 0) fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      for (int f : fds_) ::close(f);
      fail(path, ": cannot open for layer streaming: ", std::strerror(err));
    }
    struct stat st {};
    ::fstat(fd, &st);
    fds_.push_back(fd);
    file_size_.push_back(uint64_t(st.st_size));
    file_direct_.push_back(d);
    stats_.direct = stats_.direct && d;
  }
  const size_t total = size_t(n_slots_) * size_t(slot_bytes_);
  void* mem = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    for (int f : fds_) ::close(f);
    fail("layer streaming: cannot allocate ", n_slots_, " slots of ", slot_bytes_, " bytes");
  }
  slots_ = static_cast<uint8_t*>(mem);
  slot_error_.assign(size_t(n_slots_), "");
  stats_.reads_per_layer.assign(layers_.size(), 0);
  reader_ = std::thread([this] { reader_loop(); });
}

LayerStreamer::~LayerStreamer() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (reader_.joinable()) reader_.join();
  for (int f : fds_) ::close(f);
  if (slots_) ::munmap(slots_, size_t(n_slots_) * size_t(slot_bytes_));
}

uint64_t LayerStreamer::pass_bytes() const {
  uint64_t n = 0;
  for (const auto& l : layers_)
    for (const auto& e : l.extents) n += e.len;
  return n;
}

StreamStats LayerStreamer::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

std::string LayerStreamer::read_item(int64_t layer, int64_t slot) {
  uint8_t* base = slots_ + size_t(slot) * size_t(slot_bytes_);
  for (const Extent& e : layers_[size_t(layer)].extents) {
    const int fd = fds_[size_t(e.file)];
    const uint64_t fsize = file_size_[size_t(e.file)];
    uint64_t got = 0;
    while (got < e.len) {
      const uint64_t off = e.file_off + got;
      if (off >= fsize) break;  // the aligned tail beyond the end of the file
      const size_t want = size_t(std::min(kChunk, e.len - got));
      const ssize_t r = ::pread(fd, base + e.slot_off + got, want, off_t(off));
      if (r < 0) {
        if (errno == EINTR) continue;
        return paths_[size_t(e.file)] + ": read of " + std::to_string(want) + " bytes at offset " +
               std::to_string(off) + " failed: " + std::strerror(errno);
      }
      if (r == 0) {
        return paths_[size_t(e.file)] + ": unexpected end of file at offset " + std::to_string(off) +
               " (file shrank while the model was loaded?)";
      }
      got += uint64_t(r);
    }
    if (!file_direct_[size_t(e.file)])
      ::posix_fadvise(fd, off_t(e.file_off), off_t(e.len), POSIX_FADV_DONTNEED);
  }
  return "";
}

void LayerStreamer::reader_loop() {
  const uint64_t L = uint64_t(layers_.size());
  for (;;) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return stop_ || read_ < done_ + uint64_t(n_slots_); });
    if (stop_) return;
    const uint64_t k = read_;
    const int64_t layer = int64_t(k % L), slot = int64_t(k % uint64_t(n_slots_));
    lk.unlock();
    if (on_read_) on_read_(true, layer, slot);
    const double t0 = now_ms();
    std::string err = read_item(layer, slot);
    const double t1 = now_ms();
    if (on_read_) on_read_(false, layer, slot);
    lk.lock();
    slot_error_[size_t(slot)] = std::move(err);
    stats_.read_ms += t1 - t0;
    stats_.layers_read += 1;
    stats_.reads_per_layer[size_t(layer)] += 1;
    for (const auto& e : layers_[size_t(layer)].extents) stats_.bytes_read += e.len;
    read_ = k + 1;
    lk.unlock();
    cv_.notify_all();
  }
}

LayerStreamer::Pass::Pass(LayerStreamer& s) : s_(s), pass_lock_(s.pass_mu_) {}

const std::vector<const uint8_t*>& LayerStreamer::Pass::acquire(int64_t layer) {
  if (held_ || layer != next_)
    fail("layer streaming: layer ", layer, " acquired out of order (expected ", next_, held_ ? ", previous not released)" : ")");
  std::unique_lock<std::mutex> lk(s_.mu_);
  const uint64_t k = s_.done_;  // passes are serialised: the next item to consume
  const double t0 = now_ms();
  s_.cv_.wait(lk, [&] { return s_.read_ > k; });
  s_.stats_.wait_ms += now_ms() - t0;
  held_ = true;
  const int64_t slot = int64_t(k % uint64_t(s_.n_slots_));
  if (!s_.slot_error_[size_t(slot)].empty()) fail(s_.slot_error_[size_t(slot)]);
  const uint8_t* base = s_.slots_ + size_t(slot) * size_t(s_.slot_bytes_);
  const auto& offs = s_.layers_[size_t(layer)].tensor_slot_off;
  ptrs_.resize(offs.size());
  for (size_t i = 0; i < offs.size(); ++i) ptrs_[i] = base + offs[i];
  return ptrs_;
}

void LayerStreamer::Pass::release() {
  if (!held_) fail("layer streaming: release without acquire");
  {
    std::lock_guard<std::mutex> lk(s_.mu_);
    s_.done_ += 1;
    if (next_ + 1 == s_.n_layers()) s_.stats_.passes += 1;
  }
  s_.cv_.notify_all();
  held_ = false;
  ++next_;
}

LayerStreamer::Pass::~Pass() {
  // Keep the item sequence aligned with layer order: consume what this pass left.
  if (held_) release();
  while (next_ < s_.n_layers()) {
    try {
      acquire(next_);
    } catch (const Error&) {
    }
    release();
  }
}

}  // namespace kvboost::stream

namespace kvboost {

// WeightFiles members used only by layer streaming (kept here, beside their one user).
bool WeightFiles::locate(const void* p, size_t n, std::string* path, uint64_t* offset) const {
  const uint8_t* b = static_cast<const uint8_t*>(p);
  for (const auto& f : files_) {
    if (b >= f->data() && b + n <= f->data() + f->size()) {
      if (path) *path = f->path();
      if (offset) *offset = uint64_t(b - f->data());
      return true;
    }
  }
  return false;
}

void WeightFiles::release_owned(const void* p) {
  const uint8_t* b = static_cast<const uint8_t*>(p);
  for (auto it = owned_.begin(); it != owned_.end(); ++it) {
    const uint8_t* d = (*it)->data();
    if (b < d || b >= d + (*it)->size()) continue;
    for (const auto& [name, t] : tensors_) {  // a buffer shared with another tensor stays
      const uint8_t* td = static_cast<const uint8_t*>(t.data);
      if (td >= d && td < d + (*it)->size() && td != b) return;
    }
    for (auto& [name, t] : tensors_) {
      const uint8_t* td = static_cast<const uint8_t*>(t.data);
      if (td >= d && td < d + (*it)->size()) t.data = nullptr;
    }
    owned_.erase(it);
    return;
  }
}

}  // namespace kvboost
