// kvboost bench batch — continuous-batching decode throughput through the Engine (no HTTP):
// B requests decoded together vs one alone, on the same model in the same process.
//
// Each batch size B submits B greedy requests with different short prompts (ignore_eos, N new
// tokens each), steps the engine until all are done, and times only the steps in which every
// request is decoding (prefill excluded). Aggregate decode tokens/s = decode tokens / decode
// time; the scaling column divides by B = 1's. Per step it also splits the wall time into the
// model's forward pass and the engine's own work (scheduling, sampling, streaming), so a
// shortfall can be attributed. Medians over --runs.
#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "cli_util.h"
#include "kvboost/runtime.h"

namespace kvboost::cli {
namespace {

struct BatchArgs {
  std::string model;
  std::string batches = "1,2,4,8";
  int new_tokens = 32, runs = 3, prompt_words = 12;
  bool no_pack = false;
  std::string weight_budget = "0";
  SpecArgs spec;
};

struct Sample {
  double tok_s = 0, step_ms = 0, forward_ms = 0;
};

double med(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

Sample run_once(Engine& e, int B, const BatchArgs& a, int run) {
  static const char* words[] = {"cache", "block", "token", "layer", "river", "stone", "light", "model", "query", "value"};
  std::vector<std::shared_ptr<Request>> reqs;
  for (int b = 0; b < B; ++b) {
    std::string p = "Story " + std::to_string(run * 100 + b) + ":";
    for (int w = 0; w < a.prompt_words; ++w) p += std::string(" ") + words[(b * 7 + w * 3 + run) % 10];
    GenerateOptions o;
    o.max_new_tokens = a.new_tokens;
    o.ignore_eos = true;
    o.sampling.temperature = 0.0f;
    o.prefix_cache = false;  // every run pays its prefill alike; decode is what is measured
    reqs.push_back(e.submit(e.tokenizer().encode(p), o));
  }
  double decode_ms = 0, fwd_ms = 0;
  int64_t decode_tokens = 0, decode_steps = 0;
  auto emitted = [&] {  // tokens so far (a speculating step emits more than one per request)
    int64_t n = 0;
    for (auto& r : reqs) n += int64_t(r->result().output_ids.size());
    return n;
  };
  while (e.has_work()) {
    const int64_t before = emitted();
    const double t0 = now_ms();
    const StepStats s = e.step();
    const double dt = now_ms() - t0;
    if (s.n_prefill_tokens == 0 && s.n_decode == B) {
      decode_ms += dt;
      fwd_ms += s.forward_ms;
      decode_tokens += emitted() - before;
      ++decode_steps;
    }
  }
  for (auto& r : reqs)
    if (r->result().output_ids.size() != size_t(a.new_tokens)) fail("bench batch: a request ended early");
  Sample out;
  out.tok_s = decode_ms > 0 ? double(decode_tokens) * 1000.0 / decode_ms : 0;
  out.step_ms = decode_steps ? decode_ms / double(decode_steps) : 0;
  out.forward_ms = decode_steps ? fwd_ms / double(decode_steps) : 0;
  return out;
}

void run_batch(const BatchArgs& a) {
  std::vector<int> bs;
  std::stringstream ss(a.batches);
  for (std::string t; std::getline(ss, t, ',');) bs.push_back(std::stoi(t));
  if (bs.empty()) fail("--batches: no batch sizes");
  EngineOptions eo;
  eo.max_batch = *std::max_element(bs.begin(), bs.end());
  eo.load.pack_weights = !a.no_pack;
  eo.load.weight_budget = parse_weight_budget(a.weight_budget);
  a.spec.apply(eo);
  auto e = load_engine(resolve_model_dir(a.model, false), true, eo);
  std::printf("model %s, %d new tokens per request, greedy, decode steps only, medians of %d runs, %d threads, weights %s\n\n",
              e->model().dir().c_str(), a.new_tokens, a.runs, num_threads(),
              e->model().n_packed() ? "packed at load" : "as stored");
  std::printf("| batch | decode tok/s (aggregate) | per stream tok/s | vs batch 1 | step ms | forward ms | engine ms |\n"
              "|---|---|---|---|---|---|---|\n");
  run_once(*e, 1, a, 99);  // warm-up: page in the weights, grow the buffers
  double base = 0;
  for (int B : bs) {
    std::vector<double> tok, step, fwd;
    for (int r = 0; r < a.runs; ++r) {
      const Sample s = run_once(*e, B, a, r);
      tok.push_back(s.tok_s);
      step.push_back(s.step_ms);
      fwd.push_back(s.forward_ms);
    }
    const double t = med(tok);
    if (B == bs.front()) base = t / B;
    std::printf("| %d | %.1f | %.1f | %.2fx | %.1f | %.1f | %.1f |\n", B, t, t / B, base > 0 ? t / base : 0, med(step),
                med(fwd), med(step) - med(fwd));
    std::fflush(stdout);
  }
}

}  // namespace

void add_bench_batch(CLI::App* bench) {
  auto a = std::make_shared<BatchArgs>();
  CLI::App* c = bench->add_subcommand("batch", "Continuous-batching decode tokens/s: B requests together vs one alone");
  c->add_option("--model", a->model, "Model directory, .gguf file or Hugging Face id ORG/NAME[@REV] (default: the offline demo model)");
  c->add_option("--batches", a->batches, "Comma-separated batch sizes (the first is the baseline)")->capture_default_str();
  c->add_option("-n,--new-tokens", a->new_tokens, "Tokens generated per request")->capture_default_str();
  c->add_option("--runs", a->runs, "Runs per batch size (median)")->capture_default_str();
  c->add_option("--prompt-words", a->prompt_words, "Words per prompt")->capture_default_str();
  c->add_flag("--no-pack", a->no_pack, "Keep the matrices in the stored layout (LoadOptions::pack_weights off)");
  c->add_option("--weight-budget", a->weight_budget, kWeightBudgetHelp);
  a->spec.add(c);
  c->callback([a] { run_batch(*a); });
}

}  // namespace kvboost::cli
