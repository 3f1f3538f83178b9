// Internal (CUDA builds): the device-side weight layout shared by the GPU decoder
// (gpu_decoder.cpp) and the engine's paged device runner (paged_runner.cpp). Each layer's weights
// are packed into one block (matrices in the file dtype or AWQ repacked to Q4_Z / Q4_Z128, norms
// and biases as f32, every piece 256-byte aligned); tensor names come from the architecture
// tables (src/model/arch), so both runners bind exactly what the CPU loader binds.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../kernels/cuda/cuda_kernels.h"
#include "layer_entries.h"
#include "kvboost/gpu.h"
#include "kvboost/model_files.h"

namespace kvboost::gpu::dev {

using cuda::check;
using kernels::WType;

// cudaSetDevice(device), with an Error naming the device when it is not visible.
void require_device(int device);

// A device allocation freed on destruction.
struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  DevBuf() = default;
  explicit DevBuf(size_t n) : bytes(n) {
    if (n) check(cudaMalloc(&p, n), "cudaMalloc");
  }
  DevBuf(DevBuf&& o) noexcept : p(o.p), bytes(o.bytes) { o.p = nullptr, o.bytes = 0; }
  DevBuf& operator=(DevBuf&& o) noexcept {
    std::swap(p, o.p), std::swap(bytes, o.bytes);
    return *this;
  }
  ~DevBuf() {
    if (p) cudaFree(p);
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

// Pinned (page-locked) host memory, so that cudaMemcpyAsync is a true DMA overlapping compute.
struct HostBuf {
  void* p = nullptr;
  size_t bytes = 0;
  HostBuf() = default;
  explicit HostBuf(size_t n) : bytes(n) {
    if (n) check(cudaHostAlloc(&p, n, cudaHostAllocDefault), "cudaHostAlloc");
  }
  HostBuf(HostBuf&& o) noexcept : p(o.p), bytes(o.bytes) { o.p = nullptr, o.bytes = 0; }
  HostBuf& operator=(HostBuf&& o) noexcept {
    std::swap(p, o.p), std::swap(bytes, o.bytes);
    return *this;
  }
  ~HostBuf() {
    if (p) cudaFreeHost(p);
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

// The tensor's dtype as a weight type; Error naming the tensor unless F32 / F16 / BF16.
WType wtype_of(const TensorInfo& t);
// The tensor `name` of the files with that shape (Error naming it when missing or misshapen).
const TensorInfo& tensor(const WeightFiles& f, const std::string& dir, const std::string& name,
                         const std::vector<int64_t>& shape);

// An AutoAWQ gemm layer in place of `<base>.weight` (qweight [in, out/8] I32, qzeros
// [in/group, out/8] I32, scales [in/group, out] F16): repacked at load into Q4_Z128 (group a
// multiple of 128) or Q4_Z rows, read packed by cuda::gemv_q4 / matmul_q4 (4 bits on the wire
// when streamed).
struct AwqTensors {
  const TensorInfo *qweight = nullptr, *qzeros = nullptr, *scales = nullptr;
  int64_t group = 0;
  WType wt = WType::Q4_Z;
};
// The AWQ triple standing for `weight_name` ([rows, cols]), or none when the plain weight is there.
std::optional<AwqTensors> awq_of(const WeightFiles& f, const std::string& dir, const std::string& weight_name,
                                 int64_t rows, int64_t cols);

constexpr size_t kAlign = 256;
inline size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Where a piece of a packed layer lives: byte offset in the block, its dtype.
struct Piece {
  size_t off = 0;
  WType wt = WType::F32;
  bool present = false;
};

struct LayerLayout {
  Piece piece[kNumPieces];
  size_t bytes = 0;
  int64_t window = 0;
};

// Device pointers of one layer's pieces, from the block's base address.
struct LayerPtrs {
  const void* m[7];
  const float* v[8];
};
// The pointers of a layer block of layout `lay` at `base` (device memory: resident or a slot).
LayerPtrs layer_ptrs(const uint8_t* base, const LayerLayout& lay);

// Packs layer l into `dst` (layout.bytes bytes) from the files.
void pack_layer(const WeightFiles& f, const std::string& dir, const ModelConfig& c, int64_t l, const LayerLayout& lay,
                uint8_t* dst, const TpPlan* tp = nullptr);

// The packed layout of layer l (offsets, dtypes, the layer's sliding window).
LayerLayout layout_of(const WeightFiles& f, const std::string& dir, const ModelConfig& c, int64_t l,
                      const TpPlan* tp = nullptr);

// A whole tensor on the device, as stored.
DevBuf upload(const TensorInfo& t);

// Everything a runner keeps resident for the whole model: every layer block back to back
// (layer l at dev_off[l]; kNotResident for a layer streamed from the host), the embedding table
// and the head as stored, the final norm as f32.
constexpr size_t kNotResident = ~size_t(0);
struct ResidentWeights {
  std::vector<LayerLayout> layouts;
  std::vector<size_t> dev_off;
  size_t slot_bytes = 0;  // the largest layer block
  DevBuf layers, embed_w, lm_head_w, final_norm;
  WType embed_wt = WType::F32, lm_head_wt = WType::F32;
  const void* lm_head = nullptr;  // lm_head_w, or embed_w when tied
  bool q4 = false;                // some layer holds 4-bit (AWQ) matrices
  size_t bytes() const { return layers.bytes + embed_w.bytes + lm_head_w.bytes + final_norm.bytes; }
  // Pointers of layer l's pieces on the device (Error for a streamed layer: it has none).
  LayerPtrs ptrs(int64_t l) const;
};
// Layer streaming: the layers kept off the device, packed (AWQ ones 4-bit) into pinned host
// memory, each one cudaMemcpyAsync into a slot.
struct HostLayers {
  HostBuf buf;
  std::vector<size_t> off;  // [n_layers] layer l's block at buf + off[l]; kNotResident: on the device
};
// Which layers stay on the device, decided from the packed layouts and the bytes of the embedding
// table, head and final norm (nonlayer_bytes) before anything is uploaded; [n_layers] true = resident.
using ResidentChoice = std::function<std::vector<bool>(const std::vector<LayerLayout>& layouts, size_t nonlayer_bytes)>;
// Uploads the model's weights from its files (memory-mapped again: Model keeps its Weight views
// private; GGUF quantized tensors arrive dequantized to f32). `what` names the caller in errors.
// With `choose` (and `host`), the layers it does not keep resident are packed into host->buf.
// With `tp`, the layers are the rank's shard (layer_entries); embeddings, head and final norm whole.
ResidentWeights upload_resident(const Model& model, const char* what, const ResidentChoice& choose = {},
                                HostLayers* host = nullptr, const TpPlan* tp = nullptr);

}  // namespace kvboost::gpu::dev
