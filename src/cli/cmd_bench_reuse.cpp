// kvboost bench reuse: time-to-first-token and quality of chunk-level KV reuse in three
// scenarios, each mode measured side by side with a full prefill of the same prompt in the same
// run (issue 5's "must show"), the modes of each prompt in a rotating order:
//   coding   a long system prompt + different questions (prefix reuse)
//   rag      system prompt + K documents drawn in random order from a pool + a question
//            (chunk reuse at other positions with none / selective / cacheblend repair)
//   chat     a multi-turn conversation whose history grows each turn
// Text is generated English-like prose from a fixed word list (seeded), tokenized by the model's
// own tokenizer. Quality compares the first generated token's logits with the full prefill's:
// top-1 agreement, cosine, KL(full || reuse).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cli_util.h"
#include "kvboost/runtime.h"

namespace kvboost::cli {
namespace {

const char* kWords[] = {"the", "a", "little", "house", "river", "garden", "said", "and", "went", "to", "with", "old",
                        "friend", "because", "morning", "light", "small", "dog", "played", "near", "tree", "happy",
                        "found", "under", "bright", "water", "quiet", "town", "every", "day", "they", "walked",
                        "through", "green", "field", "saw", "bird", "sang", "song", "boat", "rain", "window",
                        "function", "returns", "value", "list", "error", "server", "request", "cache", "memory",
                        "table", "system", "user", "answer", "question", "data", "file", "model", "time"};

std::string prose(std::mt19937& rng, int n_words) {
  std::uniform_int_distribution<int> w(0, int(std::size(kWords)) - 1), len(6, 14);
  std::string s;
  int left = 0;
  for (int i = 0; i < n_words; ++i) {
    if (left == 0) left = len(rng);
    std::string word = kWords[w(rng)];
    if (s.empty() || s.back() == '.') word[0] = char(std::toupper(word[0]));
    s += (s.empty() ? "" : " ") + word;
    if (--left == 0) s += ".";
  }
  return s + ".";
}

// Real text for the prompts: --corpus files read as one stream of words (whitespace folded).
// Documents, system prompt and chat messages are windows of consecutive words taken in turn
// (no window repeats until the stream wraps); a RAG question quotes words of one of the request's
// documents, so the answer depends on text that was reused.
class Corpus {
 public:
  explicit Corpus(const std::string& files) {
    for (const std::string& f : split(files, ',')) {
      const std::string text = read_file(f);
      std::string w;
      for (char ch : text) {
        if (std::isspace(static_cast<unsigned char>(ch))) {
          if (!w.empty()) words_.push_back(std::move(w)), w.clear();
        } else {
          w += ch;
        }
      }
      if (!w.empty()) words_.push_back(std::move(w));
    }
    if (words_.size() < 1000)
      fail("--corpus ", files, ": ", words_.size(), " words; at least 1,000 are needed for distinct documents");
  }
  bool empty() const { return words_.empty(); }
  std::string take(int n_words) {
    std::string s;
    for (int i = 0; i < n_words; ++i) {
      s += (i ? " " : "") + words_[next_];
      next_ = (next_ + 1) % words_.size();
    }
    return s;
  }

 private:
  static std::vector<std::string> split(const std::string& s, char sep) {
    std::vector<std::string> out;
    size_t a = 0;
    while (a <= s.size()) {
      const size_t b = std::min(s.find(sep, a), s.size());
      if (b > a) out.push_back(s.substr(a, b - a));
      a = b + 1;
    }
    return out;
  }
  std::vector<std::string> words_;
  size_t next_ = 0;
};

// A phrase of n words from the middle of a text (the RAG question's topic).
std::string quote(const std::string& text, std::mt19937& rng, int n) {
  std::vector<std::string> w;
  size_t a = 0;
  while (a < text.size()) {
    const size_t b = std::min(text.find(' ', a), text.size());
    if (b > a) w.push_back(text.substr(a, b - a));
    a = b + 1;
  }
  if (int(w.size()) <= n) return text;
  const size_t from = std::uniform_int_distribution<size_t>(0, w.size() - size_t(n))(rng);
  std::string s;
  for (int i = 0; i < n; ++i) s += (i ? " " : "") + w[from + size_t(i)];
  return s;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / double(v.size());
}

struct Quality {
  double cosine = 0, kl = 0, top1 = 0;
};
Quality compare(const std::vector<float>& p, const std::vector<float>& q) {
  const LogitAgreement g = compare_logits(p.data(), q.data(), int64_t(p.size()));
  return Quality{g.cosine, g.kl, g.top1 ? 1.0 : 0.0};
}

struct Mode {
  std::string name;
  bool cache;
  ReuseMode mode;
};
const std::vector<Mode> kModes = {{"full prefill", false, ReuseMode::kPrefixOnly},
                                  {"prefix", true, ReuseMode::kPrefixOnly},
                                  {"chunk none", true, ReuseMode::kNone},
                                  {"selective", true, ReuseMode::kSelective},
                                  {"cacheblend", true, ReuseMode::kCacheBlend},
                                  {"auto", true, ReuseMode::kAuto}};

// "--modes" (comma-separated names: prefix, none, selective, cacheblend) -> kModes indices, the
// full prefill first; an unknown name is an Error naming it and the choices.
std::vector<size_t> parse_modes(const std::string& list) {
  std::vector<size_t> out = {0};
  size_t a = 0;
  while (a < list.size()) {
    const size_t b = std::min(list.find(',', a), list.size());
    const std::string name = list.substr(a, b - a);
    a = b + 1;
    if (name.empty()) continue;
    size_t m = 1;
    while (m < kModes.size() && kModes[m].name != name && kModes[m].name != "chunk " + name) ++m;
    if (m == kModes.size()) fail("--modes: unknown mode '", name, "' (choices: prefix, none, selective, cacheblend, auto)");
    if (std::find(out.begin(), out.end(), m) == out.end()) out.push_back(m);
  }
  std::sort(out.begin(), out.end());
  return out;
}

struct Row {
  std::vector<double> ttft, ratio;
  std::vector<Quality> q;
  std::vector<double> gap;  // full prefill: logit of the top token minus the runner-up's
  std::vector<double> lead;  // this mode's first lead as the guard saw it (approximate prompts)
  std::vector<double> err;   // this mode's lead minus the full prefill's lead of the same two tokens
  int guarded = 0;           // prompts the guard recomputed in full
  std::vector<int> tripped;  // per prompt: the guard recomputed it
  std::vector<double> limit;  // the guard's threshold for each approximate prompt (adaptive)
  std::vector<double> limit_at;  // per prompt: that threshold, NaN when the prompt was exact
};

// Indices of the top token and the runner-up.
std::pair<size_t, size_t> top_two(const std::vector<float>& l) {
  float a = -INFINITY, b = -INFINITY;
  size_t ia = 0, ib = 0;
  for (size_t i = 0; i < l.size(); ++i) {
    if (l[i] > a) b = a, ib = ia, a = l[i], ia = i;
    else if (l[i] > b) b = l[i], ib = i;
  }
  return {ia, ib};
}

double top_gap(const std::vector<float>& l) {
  if (l.size() < 2) return 0;
  const auto [a, b] = top_two(l);
  return double(l[a]) - double(l[b]);
}

// One prompt in every mode: first-token logits and TTFT. Nothing is stored (store = false), so
// every mode sees the same cache state.
// `modes`: indices into kModes, the full prefill (0, the reference) first. They run in an order
// rotated by `turn` (prompt i starts with the i-th mode), so that no mode always runs first on a
// cold cache or last on a warm one (order bias on a shared machine); the rows compare with the
// full prefill's logits once all have run.
void run_modes(Engine& e, const std::vector<int32_t>& ids, const std::vector<int64_t>& segs, std::vector<Row>& rows,
               const std::vector<size_t>& modes, const ReusePolicy& repair, size_t turn, bool calibrate = false) {
  std::vector<std::vector<float>> got(kModes.size());
  std::vector<GenerateResult> res(kModes.size());
  for (size_t k = 0; k < modes.size(); ++k) {
    const size_t m = modes[(k + turn) % modes.size()];
    GenerateOptions o;
    o.max_new_tokens = 1;
    o.ignore_eos = true;
    o.sampling.temperature = 0.0f;
    o.segment_starts = segs;
    o.reuse = repair;
    o.prefix_cache = kModes[m].cache;
    o.reuse.mode = kModes[m].mode;
    o.reuse.store = false;
    o.on_logits = [&got, m](const float* l, int64_t v) { got[m].assign(l, l + v); };
    res[m] = e.generate_ids(ids, o);
  }
  const std::vector<float>& ref = got[0];
  for (size_t m : modes) {
    const GenerateResult& r = res[m];
    rows[m].ttft.push_back(r.ttft_ms);
    rows[m].ratio.push_back(r.reuse_ratio());
    rows[m].q.push_back(compare(ref, got[m]));
    rows[m].gap.push_back(top_gap(ref));
    rows[m].lead.push_back(top_gap(got[m]));
    const auto [ia, ib] = top_two(got[m]);
    rows[m].err.push_back(got[m].size() < 2 ? 0.0 : double(got[m][ia] - got[m][ib]) - double(ref[ia] - ref[ib]));
    rows[m].guarded += r.guarded;
    rows[m].tripped.push_back(r.guarded);
    if (r.approximate) rows[m].limit.push_back(r.guard_lead);
    rows[m].limit_at.push_back(r.approximate ? double(r.guard_lead) : NAN);
    // --calibrate: the guard's error sample of this prompt (its lead against the full prefill's)
    if (calibrate && m > 0 && r.approximate && !r.guarded && kModes[m].mode != ReuseMode::kAuto && got[m].size() >= 2)
      e.guard_observe(kModes[m].mode, float(rows[m].err.back()));
  }
}

// --per-prompt FILE: one tab-separated line per prompt and mode, for replaying a guard rule
// offline (a run with the guard off gives every prompt's approximate lead and its error).
void dump_rows(std::FILE* f, const char* scenario, const std::vector<Row>& rows, const std::vector<size_t>& modes) {
  if (!f) return;
  for (size_t m : modes)
    for (size_t i = 0; i < rows[m].q.size(); ++i)
      std::fprintf(f, "%s\t%s\t%zu\t%.5f\t%.5f\t%.5f\t%d\t%d\t%.3f\t%.1f\t%.1f\t%.6f\n", scenario, kModes[m].name.c_str(), i,
                   rows[0].gap[i], rows[m].lead[i], rows[m].err[i], int(rows[m].q[i].top1), rows[m].tripped[i],
                   rows[m].limit_at[i], rows[0].ttft[i], rows[m].ttft[i], rows[m].q[i].kl);
  std::fflush(f);
}

void print_rows(const char* scenario, const std::vector<Row>& rows, const std::vector<size_t>& modes) {
  const double base = median(rows[0].ttft);
  for (size_t m : modes) {
    Quality q;
    for (const auto& x : rows[m].q) q.cosine += x.cosine, q.kl += x.kl, q.top1 += x.top1;
    const double n = double(rows[m].q.size());
    std::printf("| %s | %s | %.0f | %.2fx | %.1f%% | %.1f%% | %.5f | %.5f |\n", scenario, kModes[m].name.c_str(),
                median(rows[m].ttft), base / std::max(1e-9, median(rows[m].ttft)), 100.0 * median(rows[m].ratio),
                100.0 * q.top1 / n, q.cosine / n, q.kl / n);
  }
  // How close the full prefill's first token was to a tie, and where the reuse modes disagreed:
  // a disagreement at a gap of 0.05 is a near-tie flipped, one at 2.0 is a real error.
  std::printf("\n%s: full prefill's top-1 lead over the runner-up (logits): median %.3f, min %.3f", scenario,
              median(rows[0].gap), rows[0].gap.empty() ? 0.0 : *std::min_element(rows[0].gap.begin(), rows[0].gap.end()));
  for (size_t m : modes) {
    std::string where;
    for (size_t i = 0; i < rows[m].q.size(); ++i)
      if (rows[m].q[i].top1 == 0)
        where += (where.empty() ? "" : ", ") + std::to_string(rows[m].gap[i]).substr(0, 5) + " (its own " +
                 std::to_string(rows[m].lead[i]).substr(0, 5) + ")";
    if (!where.empty()) std::printf("; %s disagreed at leads %s", kModes[m].name.c_str(), where.c_str());
  }
  // Without the guard, the run tells what each threshold would do: a prompt whose own lead is
  // under L would have been recomputed (its full prefill's answer, TTFT + about a full prefill),
  // the others keep theirs. Calibrates --guard-lead for a model from one run.
  for (size_t m : modes) {
    if (m == 0 || rows[m].guarded > 0) continue;
    bool approx = false;
    for (size_t i = 0; i < rows[m].q.size(); ++i) approx |= rows[m].q[i].kl > 1e-9;  // (not float rounding)
    if (!approx) continue;
    std::printf("\n\n%s, guard off: what --guard-lead L would do (estimated from this run)\n"
                "| L | prompts recomputed | top-1 | median TTFT vs full | mean TTFT vs full |\n|---|---|---|---|---|",
                kModes[m].name.c_str());
    for (double L : {0.05, 0.1, 0.15, 0.2, 0.3, 0.5}) {
      int trips = 0, agree = 0;
      std::vector<double> t;
      for (size_t i = 0; i < rows[m].q.size(); ++i) {
        const bool trip = rows[m].lead[i] < L;
        trips += trip;
        agree += trip || rows[m].q[i].top1 > 0;
        t.push_back(rows[m].ttft[i] + (trip ? rows[0].ttft[i] : 0.0));
      }
      std::printf("\n| %.2f | %d | %d/%zu | %.2fx | %.2fx |", L, trips, agree, rows[m].q.size(),
                  median(rows[0].ttft) / std::max(1e-9, median(t)), mean(rows[0].ttft) / std::max(1e-9, mean(t)));
    }
  }
  // The guard's cost: prompts it recomputed in full, and the mean TTFT they weigh on (the
  // median hides them while they are fewer than half).
  for (size_t m : modes)
    if (rows[m].guarded > 0)
      std::printf("\n%s: the guard recomputed %d of %zu prompts in full; mean TTFT %.0f ms (%.2fx vs full's mean); "
                  "threshold median %.3f, last %.3f logits",
                  kModes[m].name.c_str(), rows[m].guarded, rows[m].q.size(), mean(rows[m].ttft),
                  mean(rows[0].ttft) / std::max(1e-9, mean(rows[m].ttft)), median(rows[m].limit), rows[m].limit.back());
  std::printf("\n\n");
  std::fflush(stdout);
}

struct Args {
  std::string model;
  std::string scenarios = "coding,rag,chat";
  int runs = 3, docs = 6, pool = 20, doc_words = 230, sys_words = 1150, chunk = 128;
  int chat_words = 0;  // words per chat user message (0: doc_words / 5)
  double chat_sys = 0.25;  // share of the coding system prompt that opens the chat
  std::string quant = "f32";
  std::string corpus;  // files of real text (comma-separated); empty: generated prose
  std::string modes = "prefix,none,selective,cacheblend,auto";  // beside the full prefill, always run
  std::string task;       // "needle": the answer-accuracy task (cmd_bench_needle.cpp)
  std::string calibrate;  // write the guard's calibration here (a file, or a directory: beside a chunk store)
  int max_tokens = 32;    // needle: tokens generated per mode
  std::string guard_file, chat_template;  // needle: the guard's starting calibration; the chat template
  ReusePolicy repair;  // repair parameters (the mode is set per row)
  uint64_t seed = 1;
  std::string per_prompt;  // file for one line per prompt and mode (empty: none)
  std::string device = "cpu";  // --device: where the engine runs (cuda[:N]: the device runner)
};

void run_bench(const Args& a) {
  const std::vector<size_t> modes = parse_modes(a.modes);
  std::vector<size_t> coding_modes;  // the coding scenario has the full prefill and prefix rows only
  for (size_t m : modes)
    if (m <= 1) coding_modes.push_back(m);
  EngineOptions eo;
  eo.load.device = parse_device_flag(a.device);  // first: a bad --device is the first error
  eo.chunk_size = a.chunk;
  eo.chunk_store.quant = kv::parse_kv_quant(a.quant);
  eo.load.progress = nullptr;
  const std::string dir = resolve_model_dir(a.model, false);
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> dump(nullptr, &std::fclose);
  if (!a.per_prompt.empty()) {
    dump.reset(std::fopen(a.per_prompt.c_str(), "w"));
    if (!dump) fail("--per-prompt ", a.per_prompt, ": cannot open for writing");
    std::fprintf(dump.get(), "scenario\tmode\tprompt\tfull_lead\tlead\terror\ttop1\tguarded\tthreshold\tttft_full_ms\tttft_ms\tkl\n");
  }
  // Room for three whole contexts, so that a no-reuse baseline run never evicts the cached blocks
  // the next reuse run is measured on (the default budget is one context).
  try {
    const ModelConfig c = ModelConfig::from_dir(dir);
    eo.kv_budget_bytes = std::min<size_t>(size_t(2 * c.n_layers * c.n_kv_heads * c.head_dim) * sizeof(float) *
                                              size_t(3 * c.max_position_embeddings), size_t(2) << 30);
  } catch (const Error&) {
  }
  auto e = Engine::load(dir, eo);
  const Tokenizer& tok = e->tokenizer();
  std::mt19937 rng(uint32_t(a.seed));
  std::printf("model %s, chunk %d tokens, stored K/V %s, medians of %d runs\n", e->model().dir().c_str(), a.chunk,
              a.quant.c_str(), a.runs);
  std::printf("repair: selective first %lld tokens of each run (+%lld before), cacheblend %.0f%% by layer %lld deviation (run starts first: %lld; gradual from %.0f%% over %lld layers); guard below a lead of %.2f, adapting to a %.1f%% risk of a changed first token per prompt (0: fixed); text: %s\n\n",
              (long long)a.repair.repair_tokens, (long long)a.repair.overlap_tokens, 100.0 * a.repair.blend_ratio,
              (long long)a.repair.blend_check_layer, (long long)a.repair.blend_run_starts,
              100.0 * std::max(a.repair.blend_ratio, a.repair.blend_first_ratio), (long long)a.repair.blend_taper_layers,
              double(a.repair.guard_lead), 100.0 * a.repair.guard_risk, a.corpus.empty() ? "generated prose" : a.corpus.c_str());
  std::printf("| scenario | mode | TTFT ms | vs full | reuse ratio | top-1 agree | logit cosine | KL |\n|---|---|---|---|---|---|---|---|\n");
  auto has = [&](const char* s) { return a.scenarios.find(s) != std::string::npos; };
  std::optional<Corpus> corpus;
  if (!a.corpus.empty()) corpus.emplace(a.corpus);
  auto text = [&](int n_words) { return corpus ? corpus->take(n_words) : prose(rng, n_words); };
  const std::string sys = "You are a helpful assistant. " + text(a.sys_words);

  if (has("coding")) {  // 1: long system prompt + different questions
    std::vector<Row> rows(2);
    std::vector<int32_t> warm = tok.encode(sys + "\nQuestion: " + text(20), true);
    e->warm(warm);
    for (int i = 0; i < a.runs; ++i)
      run_modes(*e, tok.encode(sys + "\nQuestion: " + text(25), true), {}, rows, coding_modes, a.repair, size_t(i));
    print_rows("coding", rows, coding_modes);
    dump_rows(dump.get(), "coding", rows, coding_modes);
  }
  if (has("rag")) {  // 2: documents in random order from a pool
    std::vector<std::vector<int32_t>> pool;
    const std::vector<int32_t> sys_ids = tok.encode(sys.substr(0, sys.size() / 8), true);
    std::vector<std::string> docs;
    for (int d = 0; d < a.pool; ++d) docs.push_back(text(a.doc_words));
    for (int d = 0; d < a.pool; ++d) pool.push_back(tok.encode("\nDocument: " + docs[size_t(d)], false));
    for (int d = 0; d < a.pool; ++d) {  // each document computed once, after the system prompt
      std::vector<int32_t> ids = sys_ids;
      ids.insert(ids.end(), pool[size_t(d)].begin(), pool[size_t(d)].end());
      e->warm(ids, {int64_t(sys_ids.size())});
    }
    std::vector<Row> rows(kModes.size());
    for (int i = 0; i < a.runs; ++i) {
      std::vector<int> order(size_t(a.pool));
      for (int d = 0; d < a.pool; ++d) order[size_t(d)] = d;
      std::shuffle(order.begin(), order.end(), rng);
      std::vector<int32_t> ids = sys_ids;
      std::vector<int64_t> segs;
      for (int k = 0; k < a.docs; ++k) {
        segs.push_back(int64_t(ids.size()));
        ids.insert(ids.end(), pool[size_t(order[size_t(k)])].begin(), pool[size_t(order[size_t(k)])].end());
      }
      segs.push_back(int64_t(ids.size()));
      // Generated prose: a random question. Real text: a question about a phrase of one of the
      // request's documents.
      const std::string question =
          corpus ? "What does the text say about \"" +
                       quote(docs[size_t(order[size_t(std::uniform_int_distribution<int>(0, a.docs - 1)(rng))])], rng, 6) +
                       "\"?"
                 : prose(rng, 15);
      const auto q = tok.encode("\nQuestion: " + question + "\nAnswer:", false);
      ids.insert(ids.end(), q.begin(), q.end());
      if (i == 0) std::fprintf(stderr, "rag prompt: %zu tokens\n", ids.size());
      run_modes(*e, ids, segs, rows, modes, a.repair, size_t(i), !a.calibrate.empty());
    }
    print_rows("rag", rows, modes);
    dump_rows(dump.get(), "rag", rows, modes);
  }
  if (has("chat")) {  // 3: history grows each turn; each turn's answer is generated
    std::string hist = sys.substr(0, size_t(double(sys.size()) * std::clamp(a.chat_sys, 0.0, 1.0)));
    // "history reused": of the prompt tokens that existed before this turn (everything but the
    // new user message: the previous prompt and its generated answer), the share whose K/V came
    // from a cache. The overall reuse ratio is bounded by the new message's share of the prompt.
    // Each turn: --runs measurements of the full prefill and of the reuse run (store off, so
    // every repeat sees the same cache), alternating which goes first; the table has their
    // medians. Then the turn's answer is generated with reuse (stored: the next turn's history).
    std::printf("\n| turn | prompt tokens | new message tokens | TTFT full ms | TTFT reuse ms | ratio | reuse ratio | history reused |\n"
                "|---|---|---|---|---|---|---|---|\n");
    size_t seen = 0;  // tokens of the previous turn's prompt + answer
    std::vector<double> ratios;
    for (int t = 1; t <= 8; ++t) {
      hist += "\nUser: " + text(a.chat_words > 0 ? a.chat_words : std::max(8, a.doc_words / 5)) + "\nAssistant:";
      const auto ids = tok.encode(hist, true);
      if (int64_t(ids.size()) + 33 >= e->context_length()) break;  // the model's context is full
      GenerateOptions o;
      o.ignore_eos = true;
      o.sampling.temperature = 0.0f;
      o.max_new_tokens = 1;
      std::vector<double> t_full, t_reuse;
      GenerateResult probe;
      for (int k = 0; k < std::max(1, a.runs); ++k) {
        for (int j = 0; j < 2; ++j) {
          const bool reuse = (j + k) % 2 == 1;  // k even: full first; k odd: reuse first
          GenerateOptions q = o;
          q.prefix_cache = reuse;
          q.reuse.store = false;
          const GenerateResult r = e->generate_ids(ids, q);
          (reuse ? t_reuse : t_full).push_back(r.ttft_ms);
          if (reuse) probe = r;
        }
      }
      o.prefix_cache = true;
      o.max_new_tokens = 32;
      const GenerateResult r = e->generate_ids(ids, o);
      const size_t fresh = ids.size() - std::min(seen, ids.size());
      const double hist_reused =
          seen ? 100.0 * double(std::min<int64_t>(probe.n_reused - probe.n_recomputed, int64_t(seen))) / double(std::min(seen, ids.size())) : 0;
      char hr[32] = "-";
      if (seen) std::snprintf(hr, sizeof hr, "%.1f%%", hist_reused);
      const double mf = median(t_full), mr = median(t_reuse);
      ratios.push_back(mf / std::max(1e-9, mr));
      std::printf("| %d | %zu | %zu | %.0f | %.0f | %.1fx | %.1f%% | %s |\n", t, ids.size(), fresh, mf, mr,
                  ratios.back(), 100.0 * probe.reuse_ratio(), hr);
      std::fflush(stdout);
      hist += r.text;
      seen = ids.size() + r.output_ids.size();
    }
    if (!ratios.empty())
      std::printf("\nchat: TTFT medians of %d runs per turn (full and reuse alternating first); median speed-up over "
                  "%zu turns %.1fx\n", std::max(1, a.runs), ratios.size(), median(ratios));
  }
  if (auto* s = e->chunk_store()) std::printf("\n%s\n", s->stats().to_string().c_str());
  if (!a.calibrate.empty()) save_calibration(*e, a.calibrate);
}

}  // namespace

void add_bench_reuse(CLI::App* bench) {
  auto a = std::make_shared<Args>();
  CLI::App* c = bench->add_subcommand("reuse", "TTFT and quality of chunk-level KV reuse: coding, RAG and chat scenarios");
  c->add_option("--model", a->model, "Model directory, .gguf file or Hugging Face id ORG/NAME[@REV] (default: the offline demo model)");
  c->add_option("--scenarios", a->scenarios, "Comma-separated subset of coding,rag,chat")->capture_default_str();
  c->add_option("--runs", a->runs, "Prompts per scenario (medians)")->capture_default_str();
  c->add_option("--docs", a->docs, "RAG: documents per request")->capture_default_str();
  c->add_option("--pool", a->pool, "RAG: documents in the pool")->capture_default_str();
  c->add_option("--doc-words", a->doc_words, "RAG: words per document")->capture_default_str();
  c->add_option("--chat-words", a->chat_words, "Chat: words per user message (0: doc-words / 5)")->capture_default_str();
  c->add_option("--chat-sys", a->chat_sys, "Chat: share of the system prompt (--sys-words) that opens the chat")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  c->add_option("--sys-words", a->sys_words, "Words in the coding system prompt")->capture_default_str();
  c->add_option("--chunk", a->chunk, "Chunk size in tokens")->capture_default_str();
  c->add_option("--seed", a->seed, "Text generator seed")->capture_default_str();
  c->add_option("--kv-quant", a->quant, "Stored chunk K/V: f32 | int8 | int4")->capture_default_str();
  c->add_option("--modes", a->modes,
                 "Comma-separated subset of prefix,none,selective,cacheblend (the full prefill, the reference, always runs)")
      ->capture_default_str();
  add_repair_options(c, a->repair);
  c->add_option("--corpus", a->corpus,
                "Real text for the prompts: comma-separated text files (e.g. /usr/share/common-licenses/GPL-3); "
                "default: generated prose");
  c->add_option("--per-prompt", a->per_prompt,
                "Write one tab-separated line per prompt and mode (leads, the lead's error, top-1, guard) to this file");
  c->add_option("--task", a->task,
                "needle: the answer-accuracy task (facts in documents reused at other positions; needs --corpus; "
                "--runs prompts, --docs, --pool, --doc-words, --max-tokens, --modes)");
  c->add_option("--max-tokens", a->max_tokens, "needle: tokens generated per mode (agreement with the full prefill's)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  c->add_option("--calibrate", a->calibrate,
                "Write what the guard learned (each approximate prompt's lead error vs the full prefill) to this file, or "
                "to DIR/guard-<model id>.txt for a directory (a chunk store's, loaded by serve/generate --chunk-store DIR)");
  c->add_option("--device", a->device, kDeviceHelp)->capture_default_str();
  c->add_option("--guard-file", a->guard_file,
                "needle: start the guard from this calibration file (written by --calibrate; updated as the guard learns)");
  c->add_option("--chat-template", a->chat_template,
                std::string("needle: ") + kChatTemplateHelp + "; a model without one gets the plain completion form");
  c->callback([a]() {
    if (a->task.empty()) return run_bench(*a);
    if (a->task != "needle") fail("--task: unknown task '", a->task, "' (choices: needle)");
    if (a->corpus.empty()) fail("--task needle needs --corpus FILES (real text to cut the documents from)");
    NeedleArgs n;
    n.model = a->model, n.corpus = a->corpus, n.quant = a->quant, n.per_prompt = a->per_prompt;
    n.calibrate = a->calibrate, n.prompts = a->runs, n.docs = a->docs, n.pool = a->pool, n.doc_words = a->doc_words;
    n.chunk = a->chunk, n.max_tokens = a->max_tokens, n.seed = a->seed, n.repair = a->repair;
    n.guard_file = a->guard_file, n.chat_template = a->chat_template, n.device = a->device;
    std::string modes;  // (the bench's default list minus none: the needle task's default)
    for (const char* m : {"prefix", "none", "selective", "cacheblend", "auto"})
      if (a->modes.find(m) != std::string::npos && (std::string(m) != "none" || a->modes != Args{}.modes))
        modes += (modes.empty() ? "" : ",") + std::string(m);
    // A list given by hand goes as it is (run_needle checks the names; MODE:tN:rX rows).
    n.modes = a->modes != Args{}.modes ? a->modes : modes;
    run_needle(n);
  });
}

}  // namespace kvboost::cli
