// Layer streaming (internal to the model module): runs a model whose layer matrices do not all
// fit in memory by keeping only a budget of them resident.
//
// Design. The per-layer matrices of a model are read from the weight files into a ring of
// n_slots equal slots (n_slots = budget / slot_bytes, at least 2), one layer per slot, by one
// reader thread. Forward passes consume layers strictly in order 0 .. n_layers - 1, every
// pass all of them (prefill, decode step, batch or blend alike), so the reader and the passes
// walk the same endless sequence of items k = 0, 1, 2, ...: item k is layer k % n_layers and
// lives in slot k % n_slots. Two counters are the whole synchronisation:
//   read_   items whose read has finished (ok or failed), written by the reader;
//   done_   items the passes have released, written by the consumer.
// The reader starts item k only when k < done_ + n_slots, i.e. when item k - n_slots (the
// previous tenant of slot k % n_slots) has been released, so a slot in use is never
// overwritten; a pass acquires item k only when k < read_. The reader therefore runs up to
// n_slots - 1 layers ahead of the layer being computed, and across passes: after the last
// layer of a decode step it is already reading layers 0, 1, ... of the next step. At most one
// pass runs at a time (Pass holds a mutex for its lifetime), which keeps Model::forward safe
// to call from several threads: concurrent passes queue. A pass that ends early (an exception
// in the layers) drains the rest of its layers so that the sequence stays aligned.
//
// Read method: pread into page-aligned slots, with O_DIRECT (page cache bypassed: the file is
// never cached, RSS and page cache stay within the budget). Tensor offsets in safetensors are
// arbitrary, so each layer's tensors are grouped into extents (tensors of one file closer than
// 1 MiB are read together) whose start and end are rounded out to 4096 bytes; a tensor then
// sits in its slot at the same address modulo 4096 as in a memory map, so the kernels see the
// same alignment as with mmap. When the file system refuses O_DIRECT (tmpfs), reads are
// buffered and each extent's pages are dropped from the page cache afterwards with
// posix_fadvise(DONTNEED). The alternative, mmap with MADV_WILLNEED ahead and
// MADV_DONTNEED + fadvise(DONTNEED) behind, is measured by `kvboost bench stream`, which also
// measures this disk's O_DIRECT limit (numbers: docs/layer-streaming.md and
// docs/measurements/2026-11-30-layer-streaming.md). No method won consistently on a noisy host.
// pread + O_DIRECT is the default because its memory is exactly the slots (page-cache pages of a
// mapping are charged to the process while mapped and kept by the kernel after MADV_DONTNEED
// until fadvise drops them) and because end to end it decoded faster than buffered reads there;
// KVBOOST_STREAM_IO=buffered selects buffered reads for disks where readahead wins.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kvboost::stream {

// One tensor a layer needs: `nbytes` at `offset` of file `file` (index into the file list).
struct TensorRef {
  int file = 0;
  uint64_t offset = 0;
  uint64_t nbytes = 0;
};

// Counters since construction.
struct StreamStats {
  uint64_t bytes_read = 0;     // bytes the reader read (aligned extents)
  uint64_t layers_read = 0;    // items read
  uint64_t passes = 0;         // passes completed
  double read_ms = 0;          // reader time inside pread
  double wait_ms = 0;          // time passes spent waiting for a slot to be read
  std::vector<uint64_t> reads_per_layer;  // [n_layers]
  bool direct = false;         // every file opened with O_DIRECT
};

class LayerStreamer {
 public:
  static constexpr uint64_t kAlign = 4096;

  // Reads tensors of `layers[l]` from `files` (paths; opened now). `budget` bytes of slots.
  // Throws Error when the budget holds fewer than two slots (naming both numbers) or a file
  // cannot be opened. `direct`: try O_DIRECT (falls back to buffered reads per file).
  // `on_read` (tests): called by the reader thread before (begin = true) and after reading an
  // item, with the item's layer and slot; set here so that it is in place before the thread runs.
  LayerStreamer(const std::vector<std::string>& files, const std::vector<std::vector<TensorRef>>& layers,
                uint64_t budget, bool direct = true,
                std::function<void(bool begin, int64_t layer, int64_t slot)> on_read = {});
  ~LayerStreamer();
  LayerStreamer(const LayerStreamer&) = delete;
  LayerStreamer& operator=(const LayerStreamer&) = delete;

  // Slot bytes a model needs per layer (largest layer's extents, aligned), without a streamer.
  static uint64_t slot_bytes_for(const std::vector<std::vector<TensorRef>>& layers);
  // Error naming the budget, one layer's matrix bytes and the minimum when `budget` holds
  // fewer than two slots.
  static void check_budget(const std::vector<std::vector<TensorRef>>& layers, uint64_t budget);

  int64_t n_layers() const { return int64_t(layers_.size()); }
  int64_t n_slots() const { return n_slots_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint64_t pass_bytes() const;  // bytes read per pass
  StreamStats stats() const;

  // One forward pass: acquire(l) for l = 0, 1, ... n_layers - 1 in order, each followed by
  // release(). acquire returns the tensors of layer l (same order as given), valid until
  // release. Only one Pass exists at a time (the constructor waits for the previous one).
  class Pass {
   public:
    explicit Pass(LayerStreamer& s);
    ~Pass();  // drains unconsumed layers
    Pass(const Pass&) = delete;
    Pass& operator=(const Pass&) = delete;
    const std::vector<const uint8_t*>& acquire(int64_t layer);  // throws Error on a read error
    void release();

   private:
    LayerStreamer& s_;
    std::unique_lock<std::mutex> pass_lock_;
    int64_t next_ = 0;  // next layer to acquire
    bool held_ = false;
    std::vector<const uint8_t*> ptrs_;
  };

 private:
  struct Extent {
    int file;
    uint64_t file_off, len, slot_off;  // aligned
  };
  struct LayerPlan {
    std::vector<Extent> extents;
    std::vector<uint64_t> tensor_slot_off;  // per tensor: offset inside the slot
  };
  void reader_loop();
  std::string read_item(int64_t layer, int64_t slot);  // "" or an error message

  std::vector<std::string> paths_;
  std::vector<int> fds_;
  std::vector<uint64_t> file_size_;
  std::vector<bool> file_direct_;
  std::vector<LayerPlan> layers_;
  uint64_t slot_bytes_ = 0;
  int64_t n_slots_ = 0;
  uint8_t* slots_ = nullptr;  // n_slots_ * slot_bytes_, page-aligned (anonymous mapping)

  std::mutex pass_mu_;  // held by the running Pass
  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t read_ = 0, done_ = 0;
  std::vector<std::string> slot_error_;  // per slot: error of the item it holds
  bool stop_ = false;
  StreamStats stats_;
  std::function<void(bool, int64_t, int64_t)> on_read_;
  std::thread reader_;
};

}  // namespace kvboost::stream
