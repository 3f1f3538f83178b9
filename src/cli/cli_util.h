// Internal to the CLI: shared option handling and the default demo model.
#pragma once
#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "kvboost/runtime.h"

namespace kvboost::cli {

// Where `kvboost` puts its generated demo model when --model is not given.
std::string default_model_dir();
// Returns what `dir` names (resolve_model: a directory, a .gguf file, or a Hugging Face id in the
// local cache) if given, else the demo model directory, generating it on first use.
std::string resolve_model_dir(const std::string& dir, bool quiet);
// Loads an engine, drawing a progress line on stderr while weights are paged in.
std::unique_ptr<Engine> load_engine(const std::string& dir, bool quiet, EngineOptions opt = {});
// Parses a byte count with an optional K/M/G/KiB/MiB/GiB suffix ("512MiB", "2G").
size_t parse_bytes(const std::string& s, const std::string& what);
// --weight-budget: a byte count as parse_bytes, or "0" (every weight resident).
uint64_t parse_weight_budget(const std::string& s);
inline constexpr const char* kWeightBudgetHelp =
    "Stream layer weights from disk, keeping at most this many bytes of layer matrices in memory, e.g. 768M "
    "(embeddings and norms stay resident; default 0: the whole model resident)";
// --vram-budget: a byte count as parse_bytes, or "0" (every layer resident on the device); with
// `device` the CPU, a nonzero budget is an Error naming --device (the CPU streams by --weight-budget).
uint64_t parse_vram_budget(const std::string& s, const kernels::Device& device);
inline constexpr const char* kVramBudgetHelp =
    "With --device cuda: device bytes for weights, K/V pools and scratch, e.g. 6GiB; layers that do not fit stream "
    "from pinned host memory through two device slots while the layer before them computes (default 0: every "
    "layer resident)";
// --device cpu|cuda|cuda:N: parsed and checked (built with CUDA, device present) before anything
// is loaded, so a bad value or a missing device is the first error.
kernels::Device parse_device_flag(const std::string& s);
inline constexpr const char* kDeviceHelp =
    "Where the model runs: cpu (default), cuda (= cuda:0) or cuda:N; CUDA needs a -DKVBOOST_CUDA=ON build (docs/gpu.md)";
inline constexpr const char* kTpHelp =
    "Tensor parallelism over this many ranks (default 1: off): each holds its share of the attention heads, K/V "
    "heads and MLP, joined by all-reduces; with --device cuda:N, rank r runs on cuda:N+r over NCCL (docs/gpu.md)";
inline constexpr const char* kHeadQuantHelp =
    "Quantize the output projection (lm_head / tied embeddings as head) at load: auto (q8_0 for AWQ "
    "checkpoints, else none), none, q8_0, q6_k, q4_0; a head already quantized (GGUF) is kept";
// Reads all of standard input as bytes.
std::string read_stdin();

void add_generate(CLI::App& app);
void add_tokenize(CLI::App& app);
void add_logits(CLI::App& app);
// `kvboost bench` with its roofline and model subcommands (cmd_bench.cpp). Returns the bench
// command so that other bench subcommands can be added to it: add_bench(app)->add_subcommand(...).
CLI::App* add_bench(CLI::App& app);
void add_bench_reuse(CLI::App* bench);  // kvboost bench reuse (cmd_bench_reuse.cpp)
void add_bench_stream(CLI::App* bench);  // kvboost bench stream (cmd_bench_stream.cpp)
void add_bench_batch(CLI::App* bench);  // kvboost bench batch (cmd_bench_batch.cpp)
void add_bench_grammar(CLI::App* bench);  // kvboost bench grammar (cmd_bench_grammar.cpp)
void add_cache_commands(CLI::App& app);  // kvboost warm, kvboost cache (cmd_cache.cpp)

// Chunk store options (--chunk-size, --chunk-store, --chunk-ram, --chunk-disk, --kv-quant,
// --chunk-remote, --chunk-remote-ttl).
struct ChunkArgs {
  int64_t chunk_size = 128;
  std::string disk_dir, ram = "512MiB", disk = "0", quant = "f32";
  std::string remote;  // --chunk-remote URL (the shared tier on Redis / Valkey)
  int64_t remote_ttl = 0;
  std::string guard_file;  // --guard-file: the guard's calibration (default: beside --chunk-store)
  void add(CLI::App* c);
  void apply(EngineOptions& eo) const;
};
// Speculative decoding options (--spec, --draft-model, --draft-tokens, --lookup-ngram,
// --spec-max-batch, --no-spec-adaptive); docs/speculative.md.
struct SpecArgs {
  std::string mode, draft_model;  // mode "": lookup, or draft when --draft-model is given
  int draft_tokens = 8, ngram = 3;
  int64_t max_batch = SpecOptions{}.max_batch;
  bool no_adaptive = false;
  void add(CLI::App* c);
  void apply(EngineOptions& eo) const;
};
// One line of a result's speculation statistics (drafted, accepted, rate, tokens per pass).
std::string spec_summary(const GenerateResult& r);
void add_serve(CLI::App& app);
void add_chat(CLI::App& app);  // kvboost chat (cmd_chat.cpp)

// ANSI colours for status lines on a terminal: none when the stream is not a TTY or NO_COLOR is
// set (https://no-color.org), so pipes and logs get plain text.
struct Style {
  bool enabled = false;
  static Style on(int fd);
  const char* red() const { return enabled ? "\033[31m" : ""; }
  const char* green() const { return enabled ? "\033[32m" : ""; }
  const char* yellow() const { return enabled ? "\033[33m" : ""; }
  const char* cyan() const { return enabled ? "\033[36m" : ""; }
  const char* dim() const { return enabled ? "\033[2m" : ""; }
  const char* bold() const { return enabled ? "\033[1m" : ""; }
  const char* reset() const { return enabled ? "\033[0m" : ""; }
};

// --json on every subcommand of `kvboost bench` (bench_json.cpp): the subcommand's markdown tables
// on stdout are captured and printed by finish_json_output(true) as JSON; finish_json_output(false)
// (an error) drops them. markdown_tables_to_json: [{title, notes, columns, rows: [{column: cell}]}].
void add_json_output(CLI::App* bench);
void finish_json_output(bool ok);
nlohmann::ordered_json markdown_tables_to_json(const std::string& text);

// --chat-template FILE|NAME: the help text, and the tokenizer_config.json text a model's chat
// template renders with: the model's own (tokenizer_config.json in the directory or beside the
// .gguf, else the GGUF's tokenizer.chat_template), its template replaced by `chat_template` (a
// file, or a built-in name: chatml, llama3, gemma, mistral) when given. Throws Error naming
// --chat-template when the model has no template and none is given; require = false returns ""
// then instead.
extern const char* const kChatTemplateHelp;
std::string chat_config_for(const std::string& model_dir, const std::string& chat_template, bool require = true);
// -c/--ctx-size N (llama.cpp's spelling): bytes of paged KV memory for N tokens of this model
// (K and V, every layer, f32) plus one block. 0: 0 (the engine's default).
size_t kv_bytes_for_tokens(const std::string& model_dir, int64_t n_tokens, int64_t block_size);
// Chunk-reuse repair options (--repair-tokens, --overlap, --sink-tokens, --blend-ratio,
// --blend-run-starts, --blend-first-ratio, --blend-taper, --check-layer) bound to `p`, whose
// values are the defaults shown.
void add_repair_options(CLI::App* c, ReusePolicy& p);

// kvboost bench reuse --task needle (cmd_bench_needle.cpp): exact-match accuracy of answers whose
// facts sit in documents reused at other positions, full prefill vs each reuse mode.
struct NeedleArgs {
  std::string model, corpus, quant = "f32", per_prompt;
  std::string modes = "prefix,selective,cacheblend,auto";
  std::string device = "cpu";  // --device (parse_device_flag)
  std::string calibrate;  // non-empty: write the guard's calibration there (save_calibration)
  std::string guard_file;     // the guard's starting calibration (EngineOptions::guard_file)
  std::string chat_template;  // a Jinja file or built-in name; empty: the model's own, if any
  int prompts = 8, docs = 6, pool = 24, doc_words = 120, chunk = 128, max_tokens = 32;
  uint64_t seed = 1;
  ReusePolicy repair;
};
void run_needle(const NeedleArgs& a);
// Writes the engine's guard calibration to `path`, or to path/guard-<model_id>.txt when `path`
// is a directory (what `--chunk-store DIR` then loads); prints where.
void save_calibration(const Engine& e, const std::string& path);

}  // namespace kvboost::cli
