#include "cli_util.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <iterator>

#include "kvboost/chat.h"
#include "kvboost/hub.h"
#include "testing/fixture.h"

namespace kvboost::cli {

std::string default_model_dir() {
  if (const char* d = std::getenv("KVBOOST_DEMO_MODEL"); d && *d) return d;
  std::string base;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) base = x;
  else if (const char* h = std::getenv("HOME"); h && *h) base = std::string(h) + "/.cache";
  else base = "/tmp";
  return base + "/kvboost/demo-model-v1";
}

std::string resolve_model_dir(const std::string& dir, bool quiet) {
  if (!dir.empty()) return resolve_model(dir).path;  // a directory, a .gguf file or a Hub id (hub.h)
  const std::string d = default_model_dir();
  if (!file_exists(path_join(d, "model.safetensors"))) {
    if (!quiet)
      std::fprintf(stderr, "kvboost: no --model given; generating the offline demo model in %s\n", d.c_str());
    FixtureSpec spec = fixture_preset("tiny");
    spec.hidden = 128, spec.intermediate = 344, spec.layers = 4, spec.heads = 8, spec.kv_heads = 4;
    spec.vocab = 1024;
    const std::string tmp = d + ".tmp";
    std::filesystem::remove_all(tmp);
    write_fixture_model(tmp, spec);
    std::filesystem::remove_all(d);
    std::filesystem::create_directories(std::filesystem::path(d).parent_path());
    std::filesystem::rename(tmp, d);
  }
  if (!quiet) {
    const Style st = Style::on(2);
    std::fprintf(stderr,
                 "%skvboost: using the generated demo model (random weights: its text is not meaningful).\n"
                 "         Point --model at a Hugging Face model directory or a .gguf file (models/stories260K in\n"
                 "         the source tree is a real one) for real output.%s\n",
                 st.yellow(), st.reset());
  }
  return d;
}

size_t parse_bytes(const std::string& s, const std::string& what) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  std::string unit(end);
  double mul = 1;
  if (unit == "" || unit == "B") mul = 1;
  else if (unit == "K" || unit == "KiB" || unit == "k") mul = 1024.0;
  else if (unit == "M" || unit == "MiB") mul = 1024.0 * 1024;
  else if (unit == "G" || unit == "GiB") mul = 1024.0 * 1024 * 1024;
  else fail(what, ": \"", s, "\" is not a byte count (e.g. 512MiB, 2GiB)");
  if (end == s.c_str() || !(v > 0)) fail(what, ": \"", s, "\" is not a positive byte count");
  return size_t(v * mul);
}

kernels::Device parse_device_flag(const std::string& s) {
  const kernels::Device d = kernels::parse_device(s, "--device");
  kernels::require_device(d, "--device");
  return d;
}

uint64_t parse_vram_budget(const std::string& s, const kernels::Device& device) {
  const uint64_t b = s == "0" ? 0 : uint64_t(parse_bytes(s, "--vram-budget"));
  if (b > 0 && device.is_cpu())
    fail("--vram-budget ", s, " is for a CUDA device (--device cuda); on the CPU, layers stream from disk under "
         "--weight-budget");
  return b;
}

uint64_t parse_weight_budget(const std::string& s) {
  return s == "0" ? 0 : uint64_t(parse_bytes(s, "--weight-budget"));
}

std::unique_ptr<Engine> load_engine(const std::string& dir, bool quiet, EngineOptions eopt) {
  LoadOptions& opt = eopt.load;
  // A bar on a terminal only: paging in mapped weights (GGUF, or what packing left) and packing
  // safetensors matrices into the kernels' layout, which is most of a safetensors load.
  const bool tty = isatty(STDERR_FILENO);
  if (!quiet && tty) {
    auto last = std::make_shared<double>(0);
    const Style st = Style::on(STDERR_FILENO);
    opt.progress = [dir, last, st](const std::string& stage, size_t done, size_t total) {
      if ((stage != "weights" && stage != "packing") || total == 0) return;
      const double t = now_ms();
      if (done < total && t - *last < 100) return;
      *last = t;
      const int pct = int(done * 100 / total);
      const int bar = pct / 4;
      std::fprintf(stderr, "\r%s%s %s [%.*s%*s] %3d%% %.0f/%.0f MiB%s%s", st.cyan(),
                   stage == "packing" ? "packing" : "loading", dir.c_str(), bar, "#########################",
                   25 - bar, "", pct, done / 1048576.0, total / 1048576.0, st.reset(), done == total ? "\n" : "");
    };
  }
  return Engine::load(dir, eopt);
}

Style Style::on(int fd) {
  const char* no = std::getenv("NO_COLOR");
  const char* term = std::getenv("TERM");
  Style s;
  s.enabled = isatty(fd) && !(no && *no) && !(term && std::string(term) == "dumb");
  return s;
}

const char* const kChatTemplateHelp =
    "Chat template: a Jinja file, or a built-in name (chatml, llama3, gemma, mistral); "
    "default: the model's own (tokenizer_config.json or the GGUF's tokenizer.chat_template)";

std::string chat_config_for(const std::string& model_dir, const std::string& chat_template, bool require) {
  std::string dir = model_dir;
  const std::string gguf = gguf_model_file(model_dir);
  if (!gguf.empty()) dir = std::filesystem::path(gguf).parent_path().string();
  if (dir.empty()) dir = ".";
  std::string cfg;
  const std::string beside = path_join(dir, "tokenizer_config.json");
  if (file_exists(beside)) cfg = read_file(beside);
  else if (!gguf.empty()) cfg = gguf_tokenizer_files(gguf).tokenizer_config_json;
  if (!chat_template.empty()) {
    std::string source;
    if (file_exists(chat_template)) {
      source = read_file(chat_template);
    } else if (auto b = builtin_chat_template(chat_template)) {
      source = *b;
    } else {
      std::string names;
      for (const auto& n : builtin_chat_template_names()) names += (names.empty() ? "" : ", ") + n;
      fail("--chat-template: \"", chat_template, "\" is neither a file nor a built-in template (", names, ")");
    }
    ChatTemplate::parse(source, chat_template);  // a syntax error names the file, line and column
    return with_chat_template(cfg, source);
  }
  bool has = false;
  if (!cfg.empty()) {
    try {
      chat_template_source(cfg);
      has = true;
    } catch (const Error&) {
    }
  }
  if (!has) {
    if (!require) return "";
    fail("the model ", model_dir,
         " has no chat template (no chat_template in its tokenizer_config.json or GGUF metadata); "
         "give one with --chat-template FILE|NAME (built-in: chatml, llama3, gemma, mistral)");
  }
  return cfg;
}

size_t kv_bytes_for_tokens(const std::string& dir, int64_t n_tokens, int64_t block_size) {
  if (n_tokens <= 0) return 0;
  const std::string gguf = gguf_model_file(dir);
  const ModelConfig c = gguf.empty() ? ModelConfig::from_dir(dir) : ModelConfig::from_gguf(gguf);
  const double per_token = double(2 * c.n_layers * c.n_kv_heads * c.head_dim) * sizeof(float);
  return size_t(per_token * double(n_tokens + block_size));
}

std::string read_stdin() {
  std::freopen(nullptr, "rb", stdin);
  return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
}

void add_repair_options(CLI::App* c, ReusePolicy& p) {
  c->add_option("--repair-tokens", p.repair_tokens, "selective: tokens recomputed at the start of each reused run")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  c->add_option("--overlap", p.overlap_tokens, "selective: also recompute this many tokens before each run")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  c->add_option("--sink-tokens", p.sink_tokens, "Tokens at the start of the prompt that are always computed")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  c->add_option("--blend-ratio", p.blend_ratio, "cacheblend: fraction of reused tokens recomputed")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  c->add_option("--blend-run-starts", p.blend_run_starts,
                "cacheblend: first tokens of each reused run recomputed ahead of the deviation pick (same budget)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  c->add_option("--blend-first-ratio", p.blend_first_ratio,
                "cacheblend gradual filtering: fraction selected at the check layer, narrowed to --blend-ratio")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  c->add_option("--blend-taper", p.blend_taper_layers,
                "cacheblend gradual filtering: layers after the check layer over which the selection narrows")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  c->add_option("--guard-lead", p.guard_lead,
                "Recompute an approximate prompt in full when its first token leads the runner-up by fewer logits (0: off)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  c->add_option("--guard-risk", p.guard_risk,
                "Adaptive guard: largest chance of a first token that differs from a full prefill's a prompt may keep, "
                "estimated from the errors the guard has seen; the threshold starts at --guard-lead (0: fixed --guard-lead)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  c->add_option("--guard-tokens", p.guard_tokens,
                "Guard the first N generated tokens, not only the first: held back until each leads by the threshold, "
                "else the prompt escalates and they are discarded (1: the first token only)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  c->add_option("--check-layer", p.blend_check_layer, "cacheblend: layer whose K/V deviation selects the tokens")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
}

void SpecArgs::add(CLI::App* c) {
  c->add_option("--spec", mode, "Speculative decoding: lookup (prompt lookup, the default), draft (--draft-model), off");
  c->add_option("--draft-model", draft_model, "Draft model directory for --spec draft (shares the tokenizer; implies --spec draft)");
  c->add_option("--draft-tokens", draft_tokens, "Most tokens drafted per step (the adaptive length's ceiling; 0 = off)")
      ->capture_default_str();
  c->add_option("--lookup-ngram", ngram, "Prompt lookup: longest n-gram matched against prompt + output")->capture_default_str();
  c->add_option("--spec-max-batch", max_batch, "No speculation in steps with more decoding requests than this")
      ->capture_default_str();
  c->add_flag("--no-spec-adaptive", no_adaptive, "Always draft --draft-tokens (no adaptive length)");
}

void SpecArgs::apply(EngineOptions& eo) const {
  eo.spec.draft_model = draft_model;
  eo.spec.mode = !mode.empty() ? parse_spec_mode(mode) : draft_model.empty() ? SpecMode::kLookup : SpecMode::kDraft;
  eo.spec.sampled = !mode.empty() || !draft_model.empty();  // asked for: sampled requests speculate too
  eo.spec.draft_tokens = draft_tokens;
  eo.spec.lookup_ngram = ngram;
  eo.spec.max_batch = max_batch;
  eo.spec.adaptive = !no_adaptive;
}

std::string spec_summary(const GenerateResult& r) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "speculation: %lld drafted, %lld accepted (acceptance %.1f%%), %.2f tokens per decode pass (%lld passes)",
                (long long)r.spec_drafted, (long long)r.spec_accepted, 100.0 * r.acceptance_rate(), r.tokens_per_pass(),
                (long long)r.decode_passes);
  return buf;
}

}  // namespace kvboost::cli
