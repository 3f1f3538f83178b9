// Internal (every build): which tensors make up a layer on the device and, under tensor
// parallelism, which slice of each a rank holds. Plain host code, shared by the device weight
// layout (device_weights.*, CUDA builds) and tested without a device (tests/gpu/test_tp_device.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvboost/model.h"

namespace kvboost::gpu::dev {

enum PieceId { kWq, kWk, kWv, kWo, kGate, kUp, kDown, kAttnNorm, kMlpNorm, kQNorm, kKNorm, kQBias, kKBias, kVBias,
               kOBias, kNumPieces };

// Layer tensors come from the architecture's table (src/model/arch/*.cpp: the same names and
// conditions the CPU loader binds), not from names of our own. With a tensor-parallel plan
// (kvboost/model.h tp_plan) each entry is the rank's slice: rows [r0, r0 + rows) and columns
// [c0, c0 + cols) of the file's [full_rows, full_cols] tensor (TpShard's rules: Q/K/V rows and
// biases of the rank's heads, O columns, gate/up rows, down columns; norms whole; the o_proj
// bias on rank 0 only, absent elsewhere).
struct LayerEntry {
  int id;                // PieceId
  std::string name;      // model.layers.<l>.<hf name>
  int64_t rows, cols;    // the piece's shape on the device; cols 0: a vector of `rows` elements
  int64_t full_rows = 0, full_cols = 0;  // the tensor's shape in the files
  int64_t r0 = 0, c0 = 0;                // where the piece starts in it
  bool sliced() const { return rows != full_rows || cols != full_cols; }
};

// `c` is the model's config (the files' shapes); tp null or world 1: whole tensors.
std::vector<LayerEntry> layer_entries(const ModelConfig& c, int64_t l, const TpPlan* tp = nullptr);

}  // namespace kvboost::gpu::dev
