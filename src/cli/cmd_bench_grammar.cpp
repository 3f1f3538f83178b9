// kvboost bench grammar — the cost of constrained decoding per token against the decode time.
//
// Generates --runs outputs constrained by a JSON schema (temperature 1, different seeds) and the
// same number unconstrained (ignore_eos, as many tokens), through the Engine. Then replays each
// constrained output through a fresh matcher, timing mask (apply over the full logits row) +
// accept per token: "cold" on a new compilation (empty mask cache: every state's mask is built,
// from the split table made at compile time, whose time is reported on its own, and for
// comparison by walking the vocabulary trie from the state), "warm" on the grammar the runs
// already used. The ratio is mask time over the
// unconstrained decode time per token. Medians over runs.
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli_util.h"
#include "kvboost/runtime.h"

namespace kvboost::cli {
namespace {

struct GrammarArgs {
  std::string model, schema_file;
  int new_tokens = 96, runs = 5;
};

const char* kDefaultSchema = R"({"type":"object","properties":{
  "name":{"type":"string","maxLength":24},"age":{"type":"integer","minimum":0,"maximum":120},
  "email":{"type":"string","pattern":"^[a-z]{1,12}@[a-z]{1,12}\\.com$"},
  "tags":{"type":"array","items":{"type":"string","maxLength":12},"maxItems":4},
  "address":{"type":"object","properties":{"city":{"type":"string","maxLength":20},"zip":{"type":"string","pattern":"^[0-9]{5}$"}},
             "required":["city","zip"]}},
  "required":["name","age","email","tags","address"]})";

double med(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// This thread's CPU time (µs): on a shared machine it leaves out the time spent waiting for a core.
double cpu_us() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e6 + double(ts.tv_nsec) / 1e3;
}

// Mask + accept time per token (µs) replaying `ids` on a matcher of `cg`; *cpu: the same in this
// thread's CPU time.
double replay_us(const std::shared_ptr<const grammar::CompiledGrammar>& cg, const std::vector<int32_t>& ids,
                 const std::vector<int32_t>& eos, int64_t n_logits, double* cpu = nullptr) {
  grammar::Matcher m(cg);
  std::vector<float> logits(size_t(n_logits), 0.5f);
  double total = 0, total_cpu = 0;
  int n = 0;
  for (int32_t t : ids) {
    const double t0 = now_us(), c0 = cpu_us();
    m.apply(logits.data(), n_logits, eos);
    const bool ok = m.accept(t, eos);
    total += now_us() - t0;
    total_cpu += cpu_us() - c0;
    ++n;
    if (!ok) break;
    std::fill(logits.begin(), logits.end(), 0.5f);  // (not timed)
  }
  if (cpu) *cpu = n ? total_cpu / n : 0;
  return n ? total / n : 0;
}

void run_grammar(const GrammarArgs& a) {
  const std::string dir = resolve_model_dir(a.model, true);
  auto e = load_engine(dir, true);
  std::string schema_text = kDefaultSchema;
  if (!a.schema_file.empty()) {
    std::ifstream f(a.schema_file);
    if (!f) fail("cannot read --schema ", a.schema_file);
    std::stringstream ss;
    ss << f.rdbuf();
    schema_text = ss.str();
  }
  const std::string gbnf = grammar::json_schema_to_gbnf(nlohmann::ordered_json::parse(schema_text));
  const double tv0 = now_us();
  const auto vocab = grammar::TokenVocab::of(e->tokenizer());
  const double vocab_ms = (now_us() - tv0) / 1000;
  const auto cg = grammar::CompiledGrammar::get(gbnf, vocab);
  const std::vector<int32_t> eos = e->model().config().eos_token_ids.empty() && e->tokenizer().eos_id()
                                       ? std::vector<int32_t>{*e->tokenizer().eos_id()}
                                       : e->model().config().eos_token_ids;
  const int64_t n_logits = e->model().config().vocab_size;
  const std::string prompt = "Write the user's profile as JSON.\n";
  std::vector<double> dec_free, dec_con, cold, cold_cpu, warm;
  std::vector<std::vector<int32_t>> outs;
  int n_valid = 0;
  for (int r = 0; r < a.runs; ++r) {
    GenerateOptions o;
    o.max_new_tokens = a.new_tokens;
    o.sampling.temperature = 1.0f;
    o.sampling.seed = uint64_t(r + 1);
    o.prefix_cache = false;
    o.grammar = cg;
    const GenerateResult c = e->generate(prompt, o);
    outs.push_back(c.output_ids);
    if (c.output_ids.size() > 1) dec_con.push_back(c.decode_ms / double(c.output_ids.size() - 1));
    try {
      (void)nlohmann::json::parse(c.text);
      ++n_valid;
    } catch (const std::exception&) {
    }
    GenerateOptions f = o;
    f.grammar = nullptr;
    f.ignore_eos = true;
    f.max_new_tokens = std::max<int>(2, int(c.output_ids.size()));
    const GenerateResult u = e->generate(prompt, f);
    if (u.output_ids.size() > 1) dec_free.push_back(u.decode_ms / double(u.output_ids.size() - 1));
  }
  // Cold: a fresh compilation per run, split (KVBOOST_GRAMMAR_SPLIT=1) and the per-state trie walk (the default)
  // (MaskMode::kWalk) in the same run; the split's compile time is timed on its own.
  std::vector<double> walk_cold, walk_cold_cpu, compile_ms, compile_cpu_ms;
  grammar::CompiledGrammar::CacheStats split_stats;
  for (const auto& ids : outs) {
    const auto parsed = grammar::parse_gbnf(gbnf);
    const double c0 = now_us(), cc0 = cpu_us();
    auto fresh = std::make_shared<const grammar::CompiledGrammar>(parsed, vocab, grammar::MaskMode::kSplit);
    compile_ms.push_back((now_us() - c0) / 1000);
    compile_cpu_ms.push_back((cpu_us() - cc0) / 1000);
    double c = 0;
    cold.push_back(replay_us(fresh, ids, eos, n_logits, &c));
    cold_cpu.push_back(c);
    split_stats = fresh->cache_stats();
    auto walked = std::make_shared<const grammar::CompiledGrammar>(parsed, vocab, grammar::MaskMode::kWalk);
    walk_cold.push_back(replay_us(walked, ids, eos, n_logits, &c));
    walk_cold_cpu.push_back(c);
    warm.push_back(replay_us(cg, ids, eos, n_logits));
  }
  const double d = med(dec_free) * 1000;  // µs per decoded token
  std::printf("model %s: vocabulary %d tokens (%zu trie nodes, built in %.0f ms); %d runs, %d complete JSON\n", dir.c_str(),
              vocab->size(), vocab->nodes().size(), vocab_ms, a.runs, n_valid);
  std::printf("| | µs/token | share of decode |\n|---|---|---|\n");
  std::printf("| decode, unconstrained | %.0f | 100%% |\n", d);
  std::printf("| decode, constrained (engine, mask included) | %.0f | %.1f%% |\n", med(dec_con) * 1000,
              d > 0 ? 100.0 * med(dec_con) * 1000 / d : 0);
  std::printf("| mask + accept, cold cache | %.1f | %.2f%% |\n", med(cold), d > 0 ? 100.0 * med(cold) / d : 0);
  std::printf("| mask + accept, cold cache, thread CPU time | %.1f | |\n", med(cold_cpu));
  std::printf("| mask + accept, cold cache, per-state trie walk (MaskMode::kWalk) | %.1f | %.2f%% |\n", med(walk_cold),
              d > 0 ? 100.0 * med(walk_cold) / d : 0);
  std::printf("| ... thread CPU time | %.1f | |\n", med(walk_cold_cpu));
  std::printf("| mask + accept, warm cache | %.1f | %.2f%% |\n", med(warm), d > 0 ? 100.0 * med(warm) / d : 0);
  std::printf("split table: compiled in %.0f ms (%.0f ms thread CPU), %lld entries (%lld built after compile), %lld uncertain "
              "tokens checked by the cold replay\n",
              med(compile_ms), med(compile_cpu_ms), (long long)split_stats.split_entries, (long long)split_stats.split_late,
              (long long)split_stats.split_checked);
  const auto cs = cg->cache_stats();
  std::printf("mask cache: %lld entries, %lld hits, %lld misses; %lld trie subtrees accepted whole\n", (long long)cs.entries,
              (long long)cs.hits, (long long)cs.misses, (long long)cs.subtrees);
}

}  // namespace

void add_bench_grammar(CLI::App* bench) {
  auto a = std::make_shared<GrammarArgs>();
  CLI::App* c = bench->add_subcommand("grammar", "Constrained decoding: per-token mask cost vs decode time");
  c->add_option("--model", a->model, "Model directory (default: the offline demo model)");
  c->add_option("--schema", a->schema_file, "JSON Schema file (default: a built-in profile schema)");
  c->add_option("-n,--new-tokens", a->new_tokens, "Max tokens per constrained output")->capture_default_str();
  c->add_option("--runs", a->runs, "Outputs (median)")->capture_default_str();
  c->callback([a] { run_grammar(*a); });
}

}  // namespace kvboost::cli
