// kvboost-fixture: writes a random-weight Hugging Face model directory of any supported
// architecture and shape, e.g.
//   kvboost-fixture --preset qwen2.5-0.5b --tokenizer ../shared/tokenizers/qwen2.5 --out /tmp/q05
//   kvboost-fixture --arch qwen3 --dtype bf16 --out /tmp/q3
//   kvboost-fixture --preset qwen2.5-0.5b --dtype f16 --quant awq --group-size 128 --out /tmp/q05-awq
//   kvboost-fixture --arch llama --intermediate 192 --quant awq --group-size 32 --out /tmp/a
//       --dequant-out /tmp/a-ref     (also the f32 model the AWQ one exactly represents)
//   kvboost-fixture --grow-from ../shared/models/stories260K --extra-layers 16 --intermediate 1024
//       --residual-scale 5 --out /tmp/grown   (a larger Llama stories260K drafts for; fixture.h)
#include <CLI/CLI.hpp>
#include <cstdio>

#include "kvboost/model.h"
#include "testing/fixture.h"

int main(int argc, char** argv) {
  CLI::App app{"Write a random-weight model directory (config.json, generation_config.json, "
               "safetensors weights, tokenizer) for tests and benchmarks"};
  std::string preset = "tiny", out, tokenizer_dir, tokenizer_kind = "bytelevel";
  std::optional<std::string> arch, dtype, rope_scaling;
  std::optional<int64_t> hidden, intermediate, layers, heads, kv_heads, head_dim, vocab, window, max_pos;
  std::optional<uint64_t> seed;
  std::optional<int> shards;
  bool tie = false, no_tie = false;
  std::string quant, dequant_out;
  std::optional<int64_t> group_size;
  std::vector<std::string> not_convert;
  app.add_option("--preset", preset, "Base shape: tiny | qwen2.5-0.5b | qwen2.5-1.5b | llama3.2-1b")->capture_default_str();
  app.add_option("--out", out, "Output directory")->required();
  app.add_option("--arch", arch, "llama | mistral | qwen2 | qwen3");
  app.add_option("--dtype", dtype, "f32 | f16 | bf16");
  app.add_option("--hidden", hidden);
  app.add_option("--intermediate", intermediate);
  app.add_option("--layers", layers);
  app.add_option("--heads", heads);
  app.add_option("--kv-heads", kv_heads);
  app.add_option("--head-dim", head_dim, "Explicit head_dim (written to config.json)");
  app.add_option("--vocab", vocab, "Vocabulary size (default: the tokenizer's)");
  app.add_option("--max-pos", max_pos, "max_position_embeddings");
  app.add_flag("--tie", tie, "Tie lm_head to the embeddings");
  app.add_flag("--no-tie", no_tie, "Separate lm_head.weight");
  app.add_option("--rope-scaling", rope_scaling, "llama3");
  app.add_option("--sliding-window", window, "Sliding-window size (mistral, qwen2, qwen3)");
  app.add_option("--shards", shards, "Split weights into this many safetensors shards");
  app.add_option("--seed", seed);
  app.add_option("--tokenizer", tokenizer_dir, "Copy tokenizer files from this directory");
  app.add_option("--tokenizer-kind", tokenizer_kind, "Generated tokenizer: bytelevel | sentencepiece | none")->capture_default_str();
  app.add_option("--quant", quant, "Write quantized projections: awq (AutoAWQ 4-bit gemm)");
  app.add_option("--group-size", group_size, "AWQ group size (a multiple of 32; default 128)");
  app.add_option("--awq-not-convert", not_convert, "AWQ modules_to_not_convert (kept in --dtype)")->delimiter(',');
  app.add_option("--dequant-out", dequant_out,
                 "With --quant: also write the exactly dequantized model here (f32 safetensors)");
  std::string grow_from;
  int64_t extra_layers = 16;
  float residual_scale = 5.0f;
  app.add_option("--grow-from", grow_from,
                 "Write a larger Llama grown around this one instead (its layers zero-padded to --intermediate, "
                 "then --extra-layers random layers with o/down projections scaled by --residual-scale)");
  app.add_option("--extra-layers", extra_layers, "With --grow-from")->capture_default_str();
  app.add_option("--residual-scale", residual_scale, "With --grow-from")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    if (!grow_from.empty()) {
      kvboost::GrownSpec g;
      g.base_dir = grow_from;
      g.extra_layers = extra_layers;
      g.residual_scale = residual_scale;
      if (intermediate) g.intermediate = *intermediate;
      if (dtype) g.dtype = *dtype;
      if (seed) g.seed = *seed;
      kvboost::write_grown_model(out, g);
      std::printf("wrote %s (grown from %s: +%lld layers, residual scale %g)\n", out.c_str(), grow_from.c_str(),
                  (long long)extra_layers, double(residual_scale));
      return 0;
    }
    kvboost::FixtureSpec s = kvboost::fixture_preset(preset);
    if (arch) s.arch = *arch;
    if (dtype) s.dtype = *dtype;
    if (hidden) s.hidden = *hidden;
    if (intermediate) s.intermediate = *intermediate;
    if (layers) s.layers = *layers;
    if (heads) s.heads = *heads;
    if (kv_heads) s.kv_heads = *kv_heads;
    if (head_dim) s.head_dim = *head_dim;
    if (vocab) s.vocab = *vocab;
    if (max_pos) s.max_pos = *max_pos;
    if (tie) s.tie = true;
    if (no_tie) s.tie = false;
    if (rope_scaling) s.rope_scaling = *rope_scaling;
    if (window) s.sliding_window = *window;
    if (shards) s.shards = *shards;
    if (seed) s.seed = *seed;
    s.quant = quant;
    if (group_size) s.group_size = *group_size;
    s.awq_not_convert = not_convert;
    s.dequant_dir = dequant_out;
    s.tokenizer_dir = tokenizer_dir;
    s.tokenizer_kind = tokenizer_kind == "none" ? "" : tokenizer_kind;
    kvboost::write_fixture_model(out, s);
    std::printf("wrote %s (%s, %s%s)\n", out.c_str(), s.arch.c_str(), s.dtype.c_str(),
                quant.empty() ? "" : (", " + quant + " group " + std::to_string(s.group_size)).c_str());
    if (!dequant_out.empty()) std::printf("wrote %s (dequantized reference, f32)\n", dequant_out.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvboost-fixture: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
