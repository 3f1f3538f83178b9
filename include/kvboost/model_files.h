// kvboost/model_files.h — the model module's weight-file layer: the tensors of a model
// directory's safetensors files or a GGUF file, memory-mapped, under Hugging Face names. For
// consumers that bind weights themselves (the GPU decoder, format tests, fuzzers); users load a
// kvboost::Model (kvboost/model.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kvboost/common.h"

namespace kvboost {

// One tensor inside a mapped safetensors file.
struct TensorInfo {
  std::string name;
  std::string dtype;  // as written in the file ("BF16", "F32", "I64", ...)
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;
  std::string file;
};

// All tensors of a model directory: model.safetensors, or the shards listed by
// model.safetensors.index.json. Files are memory-mapped; tensors are not copied.
class WeightFiles {
 public:
  static WeightFiles open_dir(const std::string& dir);
  static WeightFiles open_file(const std::string& path);  // one .safetensors file
  // A GGUF model file, its tensors presented under Hugging Face names and shapes
  // (model.layers.N.self_attn.q_proj.weight [rows, cols], ...). F32/F16/BF16 tensors stay in
  // the mapping, and so do quantized matrices (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K; dtype = that name,
  // the matmul reads the blocks); llama's Q/K rows are un-permuted back to HF order (whole
  // quantized rows, into owned copies made once at load). keep_quantized = false dequantizes
  // quantized tensors once into owned f32 buffers instead (for a consumer without quantized
  // kernels: the GPU decoder).
  static WeightFiles open_gguf(const std::string& path, bool keep_quantized = true);
  const TensorInfo* find(const std::string& name) const;
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  size_t total_bytes() const;
  // The mapped weight files, in load order.
  std::vector<std::string> paths() const;
  // Touches every page so that the first forward pass does not pay for page faults.
  void prefault(const std::function<void(size_t done, size_t total)>& progress) const;
  // Layer streaming (defined in layer_stream.cpp): the mapped file and offset holding
  // [p, p + n), or false when the bytes live in an owned buffer (re-laid-out at load).
  bool locate(const void* p, size_t n, std::string* path, uint64_t* offset) const;
  // Frees the owned buffer holding p (after streaming copied it elsewhere); tensors whose data
  // was in it get data = nullptr.
  void release_owned(const void* p);

 private:
  void add_file(const std::string& path, const std::vector<std::string>* only);
  // config.json's quantization_config (AWQ 4-bit gemm): validates it and repacks every
  // <prefix>.qweight/.qzeros/.scales into one "Q4_Z" tensor <prefix>.weight [out, in] held in
  // owned_ (src/model/awq.cpp). No-op without quantization_config.
  void apply_quantization(const std::string& dir);
  std::vector<std::shared_ptr<MappedFile>> files_;
  std::map<std::string, TensorInfo> tensors_;
  std::vector<std::shared_ptr<std::vector<uint8_t>>> owned_;  // realigned / dequantized / repacked
};

}  // namespace kvboost
