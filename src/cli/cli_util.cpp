#include "cli_util.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <iterator>

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
  if (!dir.empty()) return dir;
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
  if (!quiet)
    std::fprintf(stderr,
                 "kvboost: using the generated demo model (random weights: its text is not meaningful).\n"
                 "         Point --model at a Hugging Face model directory for real output.\n");
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

uint64_t parse_weight_budget(const std::string& s) {
  return s == "0" ? 0 : uint64_t(parse_bytes(s, "--weight-budget"));
}

std::unique_ptr<Engine> load_engine(const std::string& dir, bool quiet, EngineOptions eopt) {
  LoadOptions& opt = eopt.load;
  const bool tty = isatty(STDERR_FILENO);
  double last = 0;
  if (!quiet) {
    opt.progress = [&](const std::string& stage, size_t done, size_t total) {
      if (stage != "weights" || total == 0) return;
      const double t = now_ms();
      if (tty && done < total && t - last < 100) return;
      last = t;
      const int pct = int(done * 100 / total);
      const int bar = pct / 4;
      if (tty || done == total)
        std::fprintf(stderr, "%sloading %s [%.*s%*s] %3d%% %.0f/%.0f MiB%s", tty ? "\r" : "",
                     dir.c_str(), bar, "#########################", 25 - bar, "", pct,
                     done / 1048576.0, total / 1048576.0, done == total ? "\n" : "");
    };
  }
  return Engine::load(dir, eopt);
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
