// AWQ (AutoAWQ "gemm" version) 4-bit checkpoints: quantization_config validation, the repack of
// qweight / qzeros / scales into Q4_Z rows (the kernel block the quantized matmul reads), and the
// quantizer the fixture tool uses to write such checkpoints. Internal to the model module.
//
// The format, as AutoAWQ writes it (awq/modules/linear/gemm.py WQLinear_GEMM.from_linear, and
// awq/utils/packing_utils.py dequantize_gemm, which transformers' awq integration and vLLM's
// awq loader read the same way):
//   qweight int32 [in, out / 8]            8 output columns per int32
//   qzeros  int32 [in / group, out / 8]    same packing
//   scales  f16   [in / group, out]
//   nibble i of an int32 (bits 4i .. 4i + 3) holds column order_map[i] of its group of 8,
//   order_map = {0, 2, 4, 6, 1, 3, 5, 7} (AWQ_ORDER; AWQ_REVERSE_ORDER {0, 4, 1, 5, 2, 6, 3, 7}
//   undoes it);  W[out][in] = (q - z) * s, with the group of input `in` = in / group_size.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace kvboost::awq {

// order_map[i]: the output column (within its group of 8) that nibble i of a packed int32 holds.
inline constexpr int kOrderMap[8] = {0, 2, 4, 6, 1, 3, 5, 7};

// Q4_Z: 20 bytes per 32 elements: f16 d, uint8 z (0..15), uint8 reserved (0), uint8 qs[16]
// (low nibbles = elements 0..15, high nibbles = elements 16..31, as GGUF Q4_0); x = d * (q - z).
inline constexpr int64_t kQ4ZBlockElems = 32;
inline constexpr int64_t kQ4ZBlockBytes = 20;
// Q4_Z128 (kernels.h): 68 bytes per 128 elements: f16 d, uint8 z, uint8 reserved (0), qs[64]
// (byte i: elements i | 32 + i, byte 32 + i: 64 + i | 96 + i). Layers whose group_size is a
// multiple of 128 load as Q4_Z128 (unless KVBOOST_AWQ_BLOCK=32), others as Q4_Z.
inline constexpr int64_t kQ4Z128BlockElems = 128;
inline constexpr int64_t kQ4Z128BlockBytes = 68;

struct Config {
  int64_t bits = 4;
  int64_t group_size = 128;
  bool zero_point = true;
  std::string version = "gemm";
  std::vector<std::string> modules_to_not_convert;
};

// The quantization_config of a parsed config.json: nullopt when there is none; Error naming
// `source`, the field and its value for anything but AWQ 4-bit gemm with zero points and a group
// size that is a positive multiple of 32 (group_size -1, "whole row", is accepted as 0 and
// resolved per layer).
std::optional<Config> parse_config(const nlohmann::json& config, const std::string& source);

// True when the module named `prefix` (e.g. "model.layers.0.mlp.gate_proj") is listed in
// modules_to_not_convert (a substring match, as vLLM's is_layer_skipped_awq and transformers do).
bool not_converted(const Config& c, const std::string& prefix);

// One AWQ linear layer -> Q4_Z rows: dst is [out][in / 32] blocks, row n = output feature n (the
// nn.Linear layout the matmul takes). Each group of group_size inputs becomes group_size / 32
// blocks sharing that group's d (the f16 scale, copied bit for bit) and z: exact, no rounding.
// Preconditions (checked by the caller): in % group_size == 0, group_size % 32 == 0, out % 8 == 0.
// Parallel over output columns.
void repack_q4z(const int32_t* qweight, const int32_t* qzeros, const uint16_t* scales, int64_t in,
                int64_t out, int64_t group_size, uint8_t* dst);

// Q4_Z rows [rows, K] whose 4 blocks of each 128 share one (d, z) (group_size a multiple of
// 128) -> Q4_Z128 rows: the same values, one header per 128. Error when a group's headers differ.
void q4z_to_q4z128(const uint8_t* src, int64_t rows, int64_t K, uint8_t* dst);

// Reference Q4_Z dequantizer: one row of K elements (K a multiple of 32) to f32.
void dequantize_q4z_row_ref(const uint8_t* row, float* dst, int64_t K);

// Per-group min/max asymmetric 4-bit quantization of w [out, in] (f32, nn.Linear layout), as
// AutoAWQ's pseudo_quantize_tensor with zero_point: s = max(max - min, 1e-5) / 15 rounded to f16,
// z = clamp(-round(min / s), 0, 15), q = clamp(round(w / s) + z, 0, 15); packed in AWQ order.
// qweight: [in, out / 8], qzeros: [in / group_size, out / 8], scales: [in / group_size, out] f16.
void quantize(const float* w, int64_t out, int64_t in, int64_t group_size, int32_t* qweight,
              int32_t* qzeros, uint16_t* scales);

// The exact dequantization W[n][k] = s * (q - z) of packed AWQ tensors (f32, [out, in]):
// what an AWQ fixture's reference model stores.
void dequantize(const int32_t* qweight, const int32_t* qzeros, const uint16_t* scales, int64_t in,
                int64_t out, int64_t group_size, float* w);

}  // namespace kvboost::awq
