// testing/fixture.h — the kvboost_testing library: random-weight model directories for tests,
// benchmarks, the `kvboost-fixture` tool and the CLI's offline demo. Not part of the public API
// (include/kvboost/); links kvboost_model and kvboost_tokenizer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvboost {

// Writes a random-weight model directory of the given architecture (config.json,
// generation_config.json, model.safetensors or shards, and a tokenizer when tokenizer_kind is
// not empty) for tests, benchmarks and the offline demo.
struct FixtureSpec {
  std::string arch = "llama";  // llama | mistral | qwen2 | qwen3
  std::string dtype = "f32";   // f32 | f16 | bf16
  int64_t hidden = 64, intermediate = 172, layers = 2, heads = 8, kv_heads = 4, head_dim = 0;
  int64_t vocab = 0;  // 0: the tokenizer's size (or 512 without tokenizer)
  int64_t max_pos = 2048;
  bool tie = true;
  std::string rope_scaling;  // "" | "llama3"
  int64_t sliding_window = 0;
  int shards = 1;
  uint64_t seed = 1;
  double rope_theta = 10000.0;
  std::string tokenizer_kind = "bytelevel";  // "" | bytelevel | sentencepiece
  std::string tokenizer_dir;                 // copy tokenizer files from here instead
  float init_std = 0.02f;
  // "awq": every q/k/v/o/gate/up/down projection not named in awq_not_convert is written as an
  // AutoAWQ 4-bit gemm layer (qweight/qzeros/scales, per-group min/max asymmetric quantization
  // of the same random weights) and config.json gets the quantization_config; the other tensors
  // stay in `dtype`. In features must be multiples of group_size (a multiple of 32).
  std::string quant;  // "" | "awq"
  int64_t group_size = 128;
  std::vector<std::string> awq_not_convert;  // modules_to_not_convert (substring match)
  // With quant: also write the model that the quantized one exactly represents (dequantized
  // projections, other tensors as rounded to `dtype`) as a plain f32 directory here.
  std::string dequant_dir;
};
FixtureSpec fixture_preset(const std::string& name);  // tiny | qwen2.5-0.5b | qwen2.5-1.5b | llama3.2-1b
void write_fixture_model(const std::string& dir, const FixtureSpec& spec);

// A larger Llama grown around a small one, so that the small one drafts for it with meaningful
// acceptance (speculative decoding's draft/target pair; docs/speculative.md). Deterministic in
// the spec, no weights shipped:
//   - the base's layers, their gate/up rows and down columns padded with zeros to `intermediate`
//     (the padded units compute SiLU(0) * 0 = 0: each layer adds exactly what the base's adds);
//   - then `extra_layers` random layers (q/k/v/gate/up normal(0, init_std), norms 1) whose o_proj
//     and down_proj are further scaled by `residual_scale`: each nudges the residual stream a
//     little, so the grown model's next-token choice departs from the base's now and then;
//   - the base's embeddings, final norm and head; its tokenizer files and config otherwise.
// residual_scale = 0 gives the base's logits (up to rounding); larger values lower acceptance.
struct GrownSpec {
  std::string base_dir;           // a llama safetensors directory (f32/f16/bf16): stories260K
  int64_t extra_layers = 16;
  int64_t intermediate = 0;       // 0: the base's
  float residual_scale = 5.0f;
  float init_std = 0.02f;
  std::string dtype = "f32";      // f32 | f16 | bf16 (the written tensors)
  uint64_t seed = 1;
};
void write_grown_model(const std::string& dir, const GrownSpec& spec);

}  // namespace kvboost
