// kvboost bench reuse --task needle: quality of chunk reuse measured on answers.
//
// A pool of documents cut from real text (--corpus), some holding a fact (an access code, a
// person's name, a number) placed in the middle of the document, at its start or end (the seams
// a reused run repairs first), or split across two documents (the sentence starts at the end of
// one and ends at the start of the next: its answer needs attention across a document boundary,
// which documents cached apart never had, and where selection by K/V deviation is known to fall
// short). The documents are cached in one order (warmed K per request, the pool shuffled, split
// pairs broken up), then asked in another: a system prompt, K documents in a new order (split
// pairs kept adjacent) and a question whose answer is one fact of them, in the model's chat
// template when it has one. Each prompt runs with a full prefill and with each reuse mode
// (greedy, --max-tokens tokens, nothing stored); the table has the exact-match accuracy of the
// answer (the fact's value appears in the generated text), agreement with the full prefill's
// first token and first --max-tokens tokens, and TTFT.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cli_util.h"
#include "kvboost/chat.h"
#include "kvboost/runtime.h"

namespace kvboost::cli {
namespace {

const char* kPlaces[] = {"Valdera",   "Quenmoor", "Ostrel",     "Brakkin",    "Carnith",   "Elmstead",
                         "Farrowgate", "Ishkar",  "Lunvale",    "Nethermoor", "Pellick",   "Rudhaven",
                         "Ulverly",   "Wexmoor",  "Yarrowby",   "Aldermere",  "Corriebrae", "Dunmarsh",
                         "Greywater", "Hollinsey", "Kestrelby", "Mardale",    "Orrinford", "Saltmarsh",
                         "Thornwick", "Vennick",  "Wyndhollow", "Askerby",    "Blackmere", "Coldharbour"};
const char* kFirst[] = {"Adela", "Borislav", "Corinne", "Dmitri", "Evangeline", "Fenwick", "Greta", "Horatio",
                        "Ilse",  "Jasper",   "Katarina", "Leopold", "Mirela",   "Nikolai", "Ottilie", "Percival"};
const char* kLast[] = {"Moreau",    "Castellan", "Whitlock",  "Okonkwo",    "Varga",     "Lindqvist",
                       "Abernathy", "Takahashi", "Rosenthal", "Delacroix", "Pemberton", "Novak"};
const char* kWhere[] = {"middle", "start", "end", "split"};

struct Fact {
  std::string kind, answer, head, tail, question;  // head + " " + tail: the sentence
  std::string where;
};

Fact make_fact(std::mt19937& rng, int kind, const std::string& place) {
  auto r = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); };
  Fact f;
  if (kind == 0) {
    std::string code;
    code += char('A' + r(26)), code += char('A' + r(26)), code += '-', code += std::to_string(1000 + r(9000));
    f = {"code", code, "The access code for the " + place + " archive,",
         "written on a card that the clerk keeps, is " + code + ".", "What is the access code for the " + place + " archive?", ""};
  } else if (kind == 1) {
    const std::string name = std::string(kFirst[r(int(std::size(kFirst)))]) + " " + kLast[r(int(std::size(kLast)))];
    f = {"name", name, "The keeper of the " + place + " lighthouse,",
         "who lit the lamp every night for thirty years, was named " + name + ".",
         "What was the name of the keeper of the " + place + " lighthouse?", ""};
  } else {
    const std::string n = std::to_string(1000 + r(9000));
    f = {"number", n, "The old depot at " + place + ",", "according to its ledger, stored exactly " + n + " barrels of oil.",
         "How many barrels of oil did the old depot at " + place + " store?", ""};
  }
  return f;
}

std::vector<std::string> read_words(const std::string& files) {
  std::vector<std::string> words;
  size_t a = 0;
  while (a <= files.size()) {
    const size_t b = std::min(files.find(',', a), files.size());
    if (b > a) {
      const std::string text = read_file(files.substr(a, b - a));
      std::string w;
      for (char ch : text) {
        if (std::isspace(static_cast<unsigned char>(ch))) {
          if (!w.empty()) words.push_back(std::move(w)), w.clear();
        } else {
          w += ch;
        }
      }
      if (!w.empty()) words.push_back(std::move(w));
    }
    a = b + 1;
  }
  if (words.size() < 200) fail("--corpus ", files, ": ", words.size(), " words; the needle task needs at least 200");
  return words;
}

std::string norm(const std::string& s) {
  std::string o;
  for (char c : s)
    if (c != ',') o += char(std::tolower(static_cast<unsigned char>(c)));
  return o;
}

// The answer is the generated text up to where the model goes on past it: a line break, or (a
// pretrained model continuing the completion form) the next "Answer:" or "Question:". Only that
// part counts, so an answer that lists several of the documents' values is not correct because
// one of them is (Gemma 3 270M, a pretrained model, often writes "A Answer: B Answer: C").
std::string first_answer(const std::string& text) {
  size_t end = text.size();
  for (const char* stop : {"\n", "Answer:", "Question:"}) {
    const size_t at = text.find(stop, text.find_first_not_of(" \n") == std::string::npos ? 0 : text.find_first_not_of(" \n"));
    if (at != std::string::npos) end = std::min(end, at);
  }
  return text.substr(0, end);
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
float lead_of(const std::vector<float>& l, int32_t* ia, int32_t* ib) {
  float a = -INFINITY, b = -INFINITY;
  *ia = *ib = 0;
  for (size_t i = 0; i < l.size(); ++i) {
    if (l[i] > a) b = a, *ib = *ia, a = l[i], *ia = int32_t(i);
    else if (l[i] > b) b = l[i], *ib = int32_t(i);
  }
  return a - b;
}

struct ModeRow {
  std::string name;
  bool cache = true;
  ReuseMode mode = ReuseMode::kPrefixOnly;
  int correct = 0, first_agree = 0, all_agree = 0, n = 0;
  std::map<std::string, std::pair<int, int>> by_where;  // correct, asked
  std::vector<double> ttft, match;
  std::map<std::string, int> kept_at;  // the repair that stood (auto's ladder)
  int guard_tokens = 0;                // MODE:tN: this row's ReusePolicy::guard_tokens (0: --guard-tokens)
  float guard_risk = -1;               // MODE:rX: this row's guard_risk (< 0: --guard-risk)
  int64_t held_discarded = 0;          // tokens the multi-token guard decoded and discarded
};

}  // namespace

void run_needle(const NeedleArgs& a) {
  EngineOptions eo;
  eo.load.device = parse_device_flag(a.device);  // first: a bad --device is the first error
  const std::vector<std::string> words = read_words(a.corpus);
  eo.chunk_size = a.chunk;
  eo.chunk_store.quant = kv::parse_kv_quant(a.quant);
  eo.load.progress = nullptr;
  eo.guard_file = a.guard_file;
  const std::string dir = resolve_model_dir(a.model, false);
  auto e = Engine::load(dir, eo);
  const Tokenizer& tok = e->tokenizer();
  std::mt19937 rng(uint32_t(a.seed));
  auto r = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); };

  // The chat template around one user message (head + content + tail), when the model has one.
  std::string head, tail;
  bool add_special = true;
  // The model's own template only: with the built-in gemma turns (a GGUF without
  // tokenizer.chat_template) Gemma 3 270M echoed the documents under the full prefill too
  // (2026-12-01 run, docs/measurements/2026-12-01-reuse-auto.md), so such a model gets the plain
  // "Question: ... Answer:" completion form.
  std::string cfg = chat_config_for(a.model, a.chat_template, false);
  if (!cfg.empty()) {
    const std::string mark = "\x01KVBOOST_NEEDLE\x01";
    const std::string t = apply_chat_template(cfg, nlohmann::ordered_json::array({{{"role", "user"}, {"content", mark}}}), true);
    const size_t at = t.find(mark);
    if (at != std::string::npos) head = t.substr(0, at), tail = t.substr(at + mark.size()), add_special = false;
    // A template whose bos_token the file does not name renders none: let the tokenizer add it.
    const std::vector<int32_t> bos = tok.encode("", true), h = tok.encode(head, false);
    if (!bos.empty() && (h.empty() || h[0] != bos[0])) add_special = true;
  }
  const bool chat = !tail.empty();

  // The pool: units of one document (a fact in the middle, at the start, at the end, or none)
  // or two (a fact split across them).
  struct Unit {
    std::vector<int> docs;
    int fact = -1;
  };
  std::vector<std::string> docs;
  std::vector<Fact> facts;
  std::vector<Unit> units;
  size_t next_word = size_t(r(int(words.size())));
  auto take = [&](int n) {
    std::string s;
    for (int i = 0; i < n; ++i) s += (i ? " " : "") + words[next_word], next_word = (next_word + 1) % words.size();
    return s;
  };
  std::vector<std::string> places(std::begin(kPlaces), std::end(kPlaces));
  std::shuffle(places.begin(), places.end(), rng);
  for (int k = 0; int(docs.size()) < a.pool; ++k) {
    const int slot = k % 5;  // middle, start, end, split, no fact
    const bool has_fact = slot < 4 && facts.size() < places.size();
    Unit u;
    if (has_fact) {
      Fact f = make_fact(rng, int(facts.size() % 3), places[facts.size()]);
      f.where = kWhere[slot];
      const std::string sentence = f.head + " " + f.tail;
      if (slot == 3 && int(docs.size()) + 2 <= a.pool) {
        u.docs = {int(docs.size()), int(docs.size()) + 1};
        docs.push_back(take(a.doc_words) + " " + f.head);
        docs.push_back(f.tail + " " + take(a.doc_words));
      } else if (slot == 3) {
        continue;
      } else {
        std::string text = take(a.doc_words);
        if (slot == 1) text = sentence + " " + text;
        else if (slot == 2) text += " " + sentence;
        else {  // after the first sentence end past the middle (or at the middle)
          size_t at = text.size() / 2;
          const size_t dot = text.find(". ", at);
          at = dot == std::string::npos ? text.find(' ', at) : dot + 1;
          if (at == std::string::npos) at = text.size();
          text = text.substr(0, at) + " " + sentence + text.substr(at);
        }
        u.docs = {int(docs.size())};
        docs.push_back(text);
      }
      u.fact = int(facts.size());
      facts.push_back(f);
    } else {
      u.docs = {int(docs.size())};
      docs.push_back(take(a.doc_words));
    }
    units.push_back(u);
  }
  const std::string sys = head + "You answer questions about the documents below. Answer with the exact value from the text.\n";
  auto seg_text = [&](int d) { return "\n" + docs[size_t(d)]; };
  auto build = [&](const std::vector<int>& order, const std::string& question, std::vector<int64_t>* segs) {
    std::vector<std::string> s = {sys};
    for (int d : order) s.push_back(seg_text(d));
    if (!question.empty()) s.push_back("\n\nQuestion: " + question + " Answer briefly." + (chat ? tail : "\nAnswer:"));
    std::vector<int64_t> starts;
    auto ids = e->encode_segments(s, add_special, &starts);
    *segs = starts;
    return ids;
  };

  // Cache in one order: the pool shuffled (split pairs broken up), K documents per request.
  {
    std::vector<int> order(docs.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = int(i);
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t i = 0; i < order.size(); i += size_t(a.docs)) {
      std::vector<int> part(order.begin() + ptrdiff_t(i), order.begin() + ptrdiff_t(std::min(order.size(), i + size_t(a.docs))));
      std::vector<int64_t> segs;
      e->warm(build(part, "", &segs), segs);
    }
  }

  std::vector<ModeRow> rows;
  rows.push_back({"full prefill", false, ReuseMode::kPrefixOnly});
  {
    size_t p = 0;
    while (p <= a.modes.size()) {
      const size_t q = std::min(a.modes.find(',', p), a.modes.size());
      const std::string m = a.modes.substr(p, q - p);
      p = q + 1;
      if (m.empty()) continue;
      ModeRow row;
      row.name = m;
      // MODE[:tN][:rX]: per-row guard settings (several guards compared on the same prompts)
      std::string base = m;
      for (size_t c = m.find(':'); c != std::string::npos;) {
        const size_t c2 = m.find(':', c + 1);
        const std::string opt = m.substr(c + 1, (c2 == std::string::npos ? m.size() : c2) - c - 1);
        if (opt.size() < 2 || (opt[0] != 't' && opt[0] != 'r')) fail("--modes ", m, ": unknown setting \"", opt, "\" (tN: guard tokens, rX: guard risk)");
        if (opt[0] == 't') row.guard_tokens = std::stoi(opt.substr(1));
        else row.guard_risk = std::stof(opt.substr(1));
        if (base.size() > c) base = m.substr(0, m.find(':'));
        c = c2;
      }
      row.mode = parse_reuse_mode(base);
      rows.push_back(row);
    }
  }
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> dump(nullptr, &std::fclose);
  if (!a.per_prompt.empty()) {
    dump.reset(std::fopen(a.per_prompt.c_str(), "w"));
    if (!dump) fail("--per-prompt ", a.per_prompt, ": cannot open for writing");
    std::fprintf(dump.get(), "prompt\tmode\twhere\tkind\tanswer\tcorrect\tfirst_agree\tmatching_tokens\tttft_ms\tsteps\t"
                            "n_tokens\tfull_lead\tlead\terror\ttext\n");
  }
  std::printf("needle task: model %s (%s), %d prompts of %d documents (pool %d, %d words each, %zu facts), %d tokens greedy per mode, chunk %d; text: %s\n",
              e->model().dir().c_str(), chat ? "chat template" : "no chat template", a.prompts, a.docs, a.pool,
              a.doc_words, facts.size(), a.max_tokens, a.chunk, a.corpus.c_str());
  int64_t n_tokens_sum = 0;
  for (int i = 0; i < a.prompts; ++i) {
    const std::string where = kWhere[i % 4];
    std::vector<int> cand;
    for (size_t u = 0; u < units.size(); ++u)
      if (units[u].fact >= 0 && facts[size_t(units[u].fact)].where == where) cand.push_back(int(u));
    if (cand.empty())
      for (size_t u = 0; u < units.size(); ++u)
        if (units[u].fact >= 0) cand.push_back(int(u));
    const int target = cand[size_t(r(int(cand.size())))];
    std::vector<int> chosen = {target};
    int n_docs = int(units[size_t(target)].docs.size());
    std::vector<int> others;
    for (size_t u = 0; u < units.size(); ++u)
      if (int(u) != target) others.push_back(int(u));
    std::shuffle(others.begin(), others.end(), rng);
    for (int u : others) {
      if (n_docs >= a.docs) break;
      if (n_docs + int(units[size_t(u)].docs.size()) > a.docs) continue;
      chosen.push_back(u), n_docs += int(units[size_t(u)].docs.size());
    }
    std::shuffle(chosen.begin(), chosen.end(), rng);
    std::vector<int> order;
    for (int u : chosen) order.insert(order.end(), units[size_t(u)].docs.begin(), units[size_t(u)].docs.end());
    const Fact& f = facts[size_t(units[size_t(target)].fact)];
    std::vector<int64_t> segs;
    const std::vector<int32_t> ids = build(order, f.question, &segs);
    n_tokens_sum += int64_t(ids.size());
    if (i == 0) {  // the prompt's form, for checking the template: its first and last token ids
      std::string b;
      for (size_t k = 0; k < ids.size(); ++k)
        if (k < 4 || k + 5 >= ids.size()) b += (k == ids.size() - 5 && ids.size() > 9 ? " ... " : " ") + std::to_string(ids[k]);
      std::fprintf(stderr, "needle prompt: %zu tokens (%s):%s\n", ids.size(), chat ? "chat template" : "completion form", b.c_str());
    }
    std::vector<GenerateResult> res(rows.size());
    std::vector<std::vector<float>> first(rows.size());
    for (size_t k = 0; k < rows.size(); ++k) {
      const size_t m = (k + size_t(i)) % rows.size();  // rotating order (no mode always first)
      GenerateOptions o;
      o.max_new_tokens = a.max_tokens;
      o.sampling.temperature = 0.0f;
      o.segment_starts = segs;
      o.reuse = a.repair;
      o.reuse.mode = rows[m].mode;
      if (rows[m].guard_tokens > 0) o.reuse.guard_tokens = rows[m].guard_tokens;
      if (rows[m].guard_risk >= 0) o.reuse.guard_risk = rows[m].guard_risk;
      o.reuse.store = false;
      o.prefix_cache = rows[m].cache;
      o.on_logits = [&first, m](const float* l, int64_t v) {
        if (first[m].empty()) first[m].assign(l, l + v);
      };
      res[m] = e->generate_ids(ids, o);
    }
    const GenerateResult& full = res[0];
    for (size_t m = 0; m < rows.size(); ++m) {
      ModeRow& row = rows[m];
      const GenerateResult& g = res[m];
      const bool ok = norm(first_answer(g.text)).find(norm(f.answer)) != std::string::npos;
      size_t same = 0;
      while (same < g.output_ids.size() && same < full.output_ids.size() && g.output_ids[same] == full.output_ids[same]) ++same;
      const bool all = g.output_ids == full.output_ids;
      row.correct += ok, row.n += 1, row.first_agree += same > 0 || (g.output_ids.empty() && full.output_ids.empty());
      row.all_agree += all;
      row.by_where[f.where].first += ok, row.by_where[f.where].second += 1;
      row.ttft.push_back(g.ttft_ms);
      row.held_discarded += g.n_held_discarded;
      row.match.push_back(double(same));
      std::string steps;
      for (const auto& s : g.reuse_steps) {
        char b[96] = "";
        if (s.repair != "recompute") {
          std::snprintf(b, sizeof b, ":%.2f/%.2f", double(s.lead), double(s.limit));
          if (!std::isnan(s.deviation)) std::snprintf(b + std::strlen(b), sizeof b - std::strlen(b), "/d%.4f", double(s.deviation));
          if (s.checked_tokens > 1) std::snprintf(b + std::strlen(b), sizeof b - std::strlen(b), "/t%lld", (long long)s.checked_tokens);
        }
        steps += (steps.empty() ? "" : ">") + s.repair + (s.kept ? "" : "x") + b;
      }
      // This mode's first lead and its error against the full prefill's lead of the same two tokens.
      float full_lead = NAN, own_lead = NAN, err = NAN;
      if (!first[m].empty() && first[m].size() == first[0].size()) {
        int32_t ia, ib, fa, fb;
        own_lead = lead_of(first[m], &ia, &ib);
        full_lead = lead_of(first[0], &fa, &fb);
        err = own_lead - (first[0][size_t(ia)] - first[0][size_t(ib)]);
      }
      if (!g.reuse_steps.empty()) row.kept_at[g.reuse_steps.back().repair] += 1;
      // --calibrate: the error of this mode's first lead against the full prefill's (no guard recompute)
      if (!a.calibrate.empty() && m > 0 && g.approximate && !g.guarded && row.mode != ReuseMode::kAuto && first[m].size() == first[0].size()) {
        int32_t ia, ib;
        const float own = lead_of(first[m], &ia, &ib);
        e->guard_observe(row.mode, own - (first[0][size_t(ia)] - first[0][size_t(ib)]));
      }
      if (dump) {
        std::string t = g.text;
        for (char& c : t)
          if (c == '\t' || c == '\n') c = ' ';
        std::fprintf(dump.get(), "%d\t%s\t%s\t%s\t%s\t%d\t%d\t%zu\t%.1f\t%s\t%zu\t%.4f\t%.4f\t%.4f\t%s\n", i, row.name.c_str(),
                     f.where.c_str(), f.kind.c_str(), f.answer.c_str(), int(ok), int(same > 0), same, g.ttft_ms,
                     steps.empty() ? "-" : steps.c_str(), ids.size(), double(full_lead), double(own_lead), double(err), t.c_str());
      }
    }
    if (dump) std::fflush(dump.get());
  }
  std::printf("mean prompt %.0f tokens\n\n| mode | accuracy | middle | start | end | split | first token = full | %d tokens = full | mean matching tokens | TTFT median ms | TTFT mean ms | mean vs full | repair that stood |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
              double(n_tokens_sum) / std::max(1, a.prompts), a.max_tokens);
  const double full_mean = mean(rows[0].ttft);
  for (const ModeRow& row : rows) {
    auto pct = [](int x, int n) { return n ? 100.0 * x / n : 0.0; };
    std::string wh[4];
    for (int w = 0; w < 4; ++w) {
      const auto it = row.by_where.find(kWhere[w]);
      char b[32] = "-";
      if (it != row.by_where.end()) std::snprintf(b, sizeof b, "%d/%d", it->second.first, it->second.second);
      wh[w] = b;
    }
    std::string kept;
    for (const auto& [k, v] : row.kept_at) kept += (kept.empty() ? "" : ", ") + k + " " + std::to_string(v);
    std::printf("| %s | %.1f%% (%d/%d) | %s | %s | %s | %s | %.1f%% | %.1f%% | %.1f | %.0f | %.0f | %.2fx | %s |\n", row.name.c_str(),
                pct(row.correct, row.n), row.correct, row.n, wh[0].c_str(), wh[1].c_str(), wh[2].c_str(), wh[3].c_str(),
                pct(row.first_agree, row.n), pct(row.all_agree, row.n), mean(row.match), median(row.ttft), mean(row.ttft),
                full_mean / std::max(1e-9, mean(row.ttft)), kept.empty() ? "-" : kept.c_str());
  }
  for (const ModeRow& row : rows)
    if (row.held_discarded > 0)
      std::printf("%s: %lld held tokens discarded (a later token's lead tripped the guard)\n", row.name.c_str(), (long long)row.held_discarded);
  std::printf("\n");
  if (!a.calibrate.empty()) save_calibration(*e, a.calibrate);
  std::fflush(stdout);
}

}  // namespace kvboost::cli
