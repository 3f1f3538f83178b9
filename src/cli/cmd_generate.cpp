// kvboost generate: stream a completion to stdout, statistics to stderr.
#include <cstdio>
#include <memory>

#include "cli_util.h"
#include "kvboost/chat.h"

namespace kvboost::cli {

namespace {
struct GenerateArgs {
  std::string model, prompt, prompt_file;
  int max_tokens = 256;
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int> top_k;
  uint64_t seed = 0;
  std::vector<std::string> stop;
  bool no_special = false, ignore_eos = false, quiet = false, no_echo = false;
  int threads = 0;
  int64_t block_size = 16;
  std::string kv_budget, cold_dir, cold_host_budget;
  std::string weight_budget = "0";
  std::string vram_budget = "0";
  std::string head_quant = "auto";
  std::string device = "cpu";
  int tp = 1;
  bool no_prefix_cache = false, stats = false;
  std::string cache_namespace;
  int repeat = 1;
  std::vector<std::string> segments;
  ChunkArgs chunks;
  SpecArgs spec;
  std::string reuse = "auto";
  ReusePolicy repair;  // repair parameters (the mode comes from --reuse)
  int64_t ctx_size = 0;  // -c/--ctx-size: KV memory for this many tokens (0: the model's context)
  std::string chat_template, system;
  bool chat = false;
};

void run_generate(GenerateArgs a) {
  if (a.threads > 0) set_num_threads(a.threads);
  std::string prompt = a.prompt;
  if (a.prompt_file == "-") prompt = read_stdin();
  else if (!a.prompt_file.empty()) prompt = read_file(a.prompt_file);
  else if (prompt.empty() && a.segments.empty()) fail("no prompt: give -p TEXT, -f FILE or --segment TEXT");
  parse_head_quant(a.head_quant, "--head-quant");  // a bad flag is reported before a missing model
  const kernels::Device device = parse_device_flag(a.device);
  const uint64_t vram_budget = parse_vram_budget(a.vram_budget, device);
  const std::string dir = resolve_model_dir(a.model, a.quiet);
  EngineOptions eopt;
  eopt.block_size = a.block_size;
  if (!a.kv_budget.empty()) eopt.kv_budget_bytes = parse_bytes(a.kv_budget, "--kv-budget");
  else if (a.ctx_size > 0) eopt.kv_budget_bytes = kv_bytes_for_tokens(dir, a.ctx_size, a.block_size);
  eopt.cold_dir = a.cold_dir;
  if (!a.cold_host_budget.empty())
    eopt.cold_host_bytes = a.cold_host_budget == "0" ? 0 : parse_bytes(a.cold_host_budget, "--cold-host-budget");
  // --chat / --chat-template: the prompt is one user turn (after -sys) through the chat template.
  if (a.chat || !a.chat_template.empty() || !a.system.empty()) {
    if (!a.segments.empty()) fail("--segment cannot be combined with --chat/--chat-template/--system");
    const std::string cfg = chat_config_for(dir, a.chat_template);
    nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
    if (!a.system.empty()) msgs.push_back({{"role", "system"}, {"content", a.system}});
    msgs.push_back({{"role", "user"}, {"content", prompt}});
    prompt = apply_chat_template(cfg, msgs, true);
    a.no_special = true;  // the template supplies the special tokens (as transformers' tokenize=True)
    if (const std::string end = builtin_chat_template_end(a.chat_template); !end.empty()) a.stop.push_back(end);
  }
  eopt.load.weight_budget = parse_weight_budget(a.weight_budget);
  eopt.load.head_quant = parse_head_quant(a.head_quant, "--head-quant");
  eopt.load.device = device;
  eopt.load.vram_budget = vram_budget;
  eopt.tp = a.tp;
  a.chunks.apply(eopt);
  a.spec.apply(eopt);
  auto engine = load_engine(dir, a.quiet, eopt);

  GenerateOptions opt;
  opt.max_new_tokens = a.max_tokens;
  opt.sampling.temperature = a.temperature;
  opt.sampling.top_k = a.top_k;
  opt.sampling.top_p = a.top_p;
  opt.sampling.min_p = a.min_p;
  opt.sampling.repetition_penalty = a.repetition_penalty;
  opt.sampling.seed = a.seed;
  opt.stop = a.stop;
  opt.add_special = !a.no_special;
  opt.ignore_eos = a.ignore_eos;
  opt.prefix_cache = !a.no_prefix_cache;
  opt.cache_namespace = a.cache_namespace;
  opt.reuse = a.repair;
  opt.reuse.mode = parse_reuse_mode(a.reuse);
  // Segments (RAG documents) first, each chunked on its own; the prompt text after them.
  std::vector<int32_t> ids;
  if (!a.segments.empty()) {
    std::vector<std::string> segs = a.segments;
    if (!prompt.empty()) segs.push_back(prompt);
    ids = engine->encode_segments(segs, opt.add_special, &opt.segment_starts);
    std::string all;
    for (const auto& sg : a.segments) all += sg;
    prompt = all + prompt;
  }
  opt.on_text = [](std::string_view s) {
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
    return true;
  };
  for (int rep = 0; rep < a.repeat; ++rep) {
    if (!a.no_echo) {
      std::fwrite(prompt.data(), 1, prompt.size(), stdout);
      std::fflush(stdout);
    }
    GenerateResult r = ids.empty() ? engine->generate(prompt, opt) : engine->generate_ids(ids, opt);
    std::fputc('\n', stdout);
    std::fflush(stdout);
    if (!a.quiet) {
      const Style st = Style::on(2);  // dim statistics on a terminal only
      std::fputs(st.dim(), stderr);
      std::fprintf(stderr,
                   "prompt tokens: %d (%lld from the prefix cache) | generated tokens: %zu (%s) | time to first token: %.1f ms\n"
                   "prefill: %.1f tokens/s (%.1f ms) | decode: %.2f tokens/s (%.1f ms) | threads: %d | isa: %s\n",
                   r.n_prompt(), (long long)r.n_cached, r.output_ids.size(), r.finish_reason.c_str(), r.ttft_ms,
                   r.prefill_tok_per_s(), r.prefill_ms, r.decode_tok_per_s(),
                   r.decode_ms, num_threads(), isa_name(active_isa()));
      std::fprintf(stderr, "reuse (%s): %lld tokens reused, %lld recomputed, %lld new, reuse ratio %.1f%%%s\n",
                   a.reuse.c_str(), (long long)r.n_reused, (long long)r.n_recomputed, (long long)r.n_new,
                   100.0 * r.reuse_ratio(),
                   r.guarded ? " (guard: the first token was a close call, recomputed exactly)" : "");
      std::fputs(st.reset(), stderr);
    }
    if (a.stats) std::fprintf(stderr, "%s\n", spec_summary(r).c_str());
  }
  if (a.stats) std::fprintf(stderr, "kv cache: %s\n", engine->kv_stats().to_string().c_str());
  if (auto* cs = engine->chunk_store()) {
    cs->flush();
    if (a.stats) std::fprintf(stderr, "chunk store: %s\n", cs->stats().to_string().c_str());
  }
}
}  // namespace

void add_generate(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* c = app.add_subcommand("generate", "Generate a completion and stream it to stdout");
  c->add_option("-m,--model", a->model,
                "Hugging Face model directory (config.json, *.safetensors, tokenizer.json). "
                "Default: a generated offline demo model with random weights");
  c->add_option("-p,--prompt", a->prompt, "Prompt text");
  c->add_option("-f,--prompt-file,--file", a->prompt_file, "Read the prompt from this file (exact bytes; - reads stdin)");
  c->add_option("-n,--max-tokens", a->max_tokens, "Maximum number of new tokens")->capture_default_str()->check(CLI::NonNegativeNumber);
  c->add_option("--temp,--temperature", a->temperature, "Sampling temperature; 0 = greedy (default: the model's generation_config.json, greedy if it does not sample)");
  c->add_option("--top-k", a->top_k, "Keep the k most likely tokens (0 = off)");
  c->add_option("--top-p", a->top_p, "Nucleus sampling: keep the smallest set with this much probability (1 = off)");
  c->add_option("--min-p", a->min_p, "Drop tokens less likely than min-p times the most likely one (0 = off)");
  c->add_option("--repeat-penalty,--repetition-penalty", a->repetition_penalty, "Penalise tokens already in the prompt or output (1 = off)");
  c->add_option("-s,--seed", a->seed, "Random seed (same seed, same output)")->capture_default_str();
  c->add_option("--stop", a->stop, "Stop when this text is generated (repeatable); it is not printed");
  c->add_flag("--no-special", a->no_special, "Do not add BOS/EOS special tokens to the prompt");
  c->add_flag("--ignore-eos", a->ignore_eos, "Keep generating past end-of-sequence tokens");
  c->add_flag("--no-echo", a->no_echo, "Print only the completion, not the prompt before it");
  c->add_option("-t,--threads", a->threads, "Worker threads (default: all cores; -t is threads, as in llama.cpp)");
  c->add_option("-c,--ctx-size", a->ctx_size, "KV memory for this many tokens (llama.cpp's -c; default: the model's context)")
      ->check(CLI::NonNegativeNumber);
  c->add_flag("--chat", a->chat, "Format the prompt as one user turn through the model's chat template");
  c->add_option("--chat-template", a->chat_template, std::string(kChatTemplateHelp) + "; implies --chat");
  c->add_option("--system", a->system, "System message before the user turn (-sys works too; implies --chat)");
  c->add_flag("-q,--quiet", a->quiet, "No progress or statistics on stderr");
  c->add_option("--block-size", a->block_size, "Tokens per KV block")->capture_default_str()->check(CLI::PositiveNumber);
  c->add_option("--kv-budget", a->kv_budget, "Bytes of KV memory, e.g. 512MiB (default: the whole context, at most 2GiB)");
  c->add_option("--kv-cold-dir", a->cold_dir, "Spill KV blocks beyond --kv-budget to a file in this directory and page them back when needed");
  c->add_option("--cold-host-budget", a->cold_host_budget, "With --device cuda and --kv-cold-dir: pinned host memory for spilled KV blocks before the files, e.g. 2GiB (default 1GiB; 0: straight to the files)");
  c->add_option("--weight-budget", a->weight_budget, kWeightBudgetHelp);
  c->add_option("--head-quant", a->head_quant, kHeadQuantHelp)->capture_default_str();
  c->add_option("--device", a->device, kDeviceHelp)->capture_default_str();
  c->add_option("--vram-budget", a->vram_budget, kVramBudgetHelp);
  c->add_option("--tp", a->tp, kTpHelp)->capture_default_str();
  c->add_flag("--no-prefix-cache", a->no_prefix_cache, "Do not reuse cached K/V of earlier requests");
  c->add_option("--cache-namespace", a->cache_namespace, "Tenant: K/V cached under one namespace is never reused by another");
  c->add_option("--repeat", a->repeat, "Run the same request this many times (later runs hit the prefix cache)")->capture_default_str()->check(CLI::PositiveNumber);
  c->add_option("--segment", a->segments, "A prompt segment (system prompt, RAG document), chunked on its own (repeatable; the -p text follows them)");
  c->add_option("--reuse", a->reuse, "Chunk reuse: auto (ladder selective -> cacheblend -> exact recompute, chosen by the guard) | prefix (exact only) | none | selective | cacheblend")->capture_default_str();
  add_repair_options(c, a->repair);
  a->chunks.add(c);
  a->spec.add(c);
  c->add_flag("--stats", a->stats, "Print KV cache statistics (blocks used, cached, hit rate) at the end");
  c->callback([a]() { run_generate(*a); });
}

}  // namespace kvboost::cli
