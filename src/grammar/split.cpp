// The per-position mask split (XGrammar, Dong et al. 2024, "adaptive token mask cache"): most
// tokens are accepted or rejected by the top of a stack alone, whatever lies below it. For each
// stack suffix (the top position, then as many positions below it as it takes) the walk of
// walk.h classifies every token once, at compile time: accepted (stored as a mask), rejected,
// or uncertain: the suffix is used up inside the token (its set holds the empty stack at some
// byte offset) and only the base below can say. A new state's mask is then the union of its
// stacks' stored masks, plus the uncertain tokens whose rest, from one of those offsets, the
// base accepts: the base's expansion is one stack set per stack, so the check resumes there
// instead of replaying the token over the whole stack.
//
// A suffix with too many uncertain tokens (a one-character rule like JSON's `char`, a nullable
// `space`) is split: an entry per position that can lie directly below it, found from the
// grammar (a return position after a non-tail reference to a rule whose tail calls reach the
// suffix's bottom rule), plus "nothing below" (the suffix is the whole stack: exact). Entries
// the enumeration did not reach, or past its budget, are built when a state first needs them.
#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "walk.h"

namespace kvboost::grammar {

using detail::Walker;
using detail::WalkMemo;

struct CompiledGrammar::SplitTable {
  static constexpr uint32_t kBottom = 0xFFFFFFFFu;  // "nothing below" (the suffix is the stack)
  struct Entry {
    uint16_t depth = 0;   // positions in the suffix
    bool exact = false;   // the suffix is the whole stack: no uncertain tokens
    bool split = false;   // too many uncertain tokens: look one position deeper
    std::vector<uint32_t> dense;  // accepted tokens as a mask (when many) ...
    std::vector<int32_t> sparse;  // ... or as ids (when few)
    Walker::Uncertain unc;
  };
  std::deque<Entry> entries;
  std::unordered_map<uint64_t, int32_t> index;  // (parent entry + 1) << 32 | position -> entry
  std::vector<uint32_t> rule_of;                // element -> its rule
  std::vector<std::vector<uint32_t>> below;     // rule -> positions that can lie below its positions
  size_t max_uncertain = 0;
  int max_depth = 8;
  int64_t n_compile = 0, n_late = 0, n_checked = 0, n_subtrees = 0;
  double compile_ms = 0;
  bool compiling = false;

  static uint64_t key(int32_t parent, uint32_t pos) { return (uint64_t(uint32_t(parent + 1)) << 32) | pos; }
};

namespace {

using SplitTable = CompiledGrammar::SplitTable;

bool end_of_seq(const Grammar& g, uint32_t pos) {
  const Op op = g.elems[pos].op;
  return op == Op::kEnd || op == Op::kAlt;
}

bool split_enabled_by_env() {
  static const bool on = [] {
    const char* e = std::getenv("KVBOOST_GRAMMAR_SPLIT");
    return e && std::string(e) == "1";
  }();
  return on;
}

// The entry for `suffix` (bottom first) under `parent`, keyed by `pos` (the suffix's new bottom,
// or kBottom for the exact entry), built on first use.
int32_t entry_of(SplitTable& t, const Grammar& g, const TokenVocab& v, std::unique_ptr<WalkMemo>& memo, int32_t parent,
                 uint32_t pos, const std::vector<uint32_t>& suffix) {
  const uint64_t k = SplitTable::key(parent, pos);
  if (auto it = t.index.find(k); it != t.index.end()) return it->second;
  if (!memo || memo->over_budget()) memo = std::make_unique<WalkMemo>();
  SplitTable::Entry e;
  e.depth = uint16_t(suffix.size());
  e.exact = pos == SplitTable::kBottom;
  std::vector<uint32_t> bits((size_t(v.size()) + 31) / 32, 0u);
  Walker w{g, v, bits, *memo, detail::subtrees_enabled(), 0, nullptr, {}};
  Walker::Uncertain unc;
  if (!e.exact) w.unc = &unc;
  w.walk(0, w.intern(Stacks{suffix}), 0, 0, 0);
  t.n_subtrees += w.n_shortcut;
  e.split = !e.exact && unc.tokens.size() > t.max_uncertain && int(e.depth) < t.max_depth;
  if (!e.split) {
    size_t n = 0;
    for (uint32_t x : bits) n += size_t(__builtin_popcount(x));
    if (n < bits.size()) {
      for (size_t i = 0; i < bits.size(); ++i)
        for (uint32_t x = bits[i]; x; x &= x - 1) e.sparse.push_back(int32_t(i * 32 + size_t(__builtin_ctz(x))));
    } else {
      e.dense = std::move(bits);
    }
    unc.begin.push_back(uint32_t(unc.offs.size()));
    e.unc = std::move(unc);
  }
  (t.compiling ? t.n_compile : t.n_late) += 1;
  t.entries.push_back(std::move(e));
  const int32_t id = int32_t(t.entries.size() - 1);
  t.index.emplace(k, id);
  return id;
}

// Compile time: the rules' layout, which positions can lie below which rules, and every
// entry reachable from the grammar's stack tops (within a budget).
void build(SplitTable& t, const Grammar& g, const TokenVocab& v, std::unique_ptr<WalkMemo>& memo) {
  const size_t n_rules = g.rule_start.size();
  t.rule_of.assign(g.elems.size(), 0);
  std::vector<std::vector<uint32_t>> tail_refs(n_rules);
  for (uint32_t r = 0; r < n_rules; ++r)
    for (uint32_t p = g.rule_start[r];; ++p) {
      t.rule_of[p] = r;
      if (g.elems[p].op == Op::kRuleRef && end_of_seq(g, p + 1)) tail_refs[r].push_back(g.elems[p].value);
      if (g.elems[p].op == Op::kEnd) break;
    }
  std::vector<uint8_t> reachable(n_rules, 0);
  std::vector<uint32_t> todo{g.root};
  reachable[g.root] = 1;
  while (!todo.empty()) {
    const uint32_t r = todo.back();
    todo.pop_back();
    for (uint32_t p = g.rule_start[r]; g.elems[p].op != Op::kEnd; ++p)
      if (g.elems[p].op == Op::kRuleRef && !reachable[g.elems[p].value]) {
        reachable[g.elems[p].value] = 1;
        todo.push_back(g.elems[p].value);
      }
  }
  // Tail calls replace the caller's frame, so a rule's positions sit directly on the return
  // position of any call to a rule that reaches it through tail calls.
  auto tail_closure = [&](uint32_t r0) {
    std::vector<uint8_t> seen(n_rules, 0);
    std::vector<uint32_t> out, st{r0};
    seen[r0] = 1;
    while (!st.empty()) {
      const uint32_t r = st.back();
      st.pop_back();
      out.push_back(r);
      for (uint32_t x : tail_refs[r])
        if (!seen[x]) seen[x] = 1, st.push_back(x);
    }
    return out;
  };
  t.below.assign(n_rules, {});
  std::vector<std::vector<uint32_t>> closure(n_rules);
  for (uint32_t r = 0; r < n_rules; ++r)
    if (reachable[r]) closure[r] = tail_closure(r);
  for (uint32_t r0 = 0; r0 < n_rules; ++r0) {
    if (!reachable[r0]) continue;
    for (uint32_t p = g.rule_start[r0]; g.elems[p].op != Op::kEnd; ++p)
      if (g.elems[p].op == Op::kRuleRef && !end_of_seq(g, p + 1))
        for (uint32_t r : closure[g.elems[p].value]) t.below[r].push_back(p + 1);
  }
  for (uint32_t r : closure[g.root]) t.below[r].push_back(SplitTable::kBottom);

  constexpr size_t kBudget = 4096;  // entries built at compile time; the rest on first use
  t.compiling = true;
  struct Item {
    int32_t parent;
    uint32_t pos;
    std::vector<uint32_t> suffix;
  };
  std::vector<Item> work;
  for (uint32_t r = 0; r < n_rules; ++r) {
    if (!reachable[r]) continue;
    for (uint32_t p = g.rule_start[r]; g.elems[p].op != Op::kEnd; ++p) {
      const Op op = g.elems[p].op;
      if (op == Op::kChar || op == Op::kCharNot || op == Op::kCharAny) work.push_back({-1, p, {p}});
    }
  }
  for (size_t i = 0; i < work.size() && t.entries.size() < kBudget; ++i) {
    const Item it = work[i];  // (a copy: work grows)
    const int32_t id = entry_of(t, g, v, memo, it.parent, it.pos, it.suffix);
    if (!t.entries[size_t(id)].split) continue;
    for (uint32_t x : t.below[t.rule_of[it.suffix.front()]]) {
      std::vector<uint32_t> s = it.suffix;
      if (x != SplitTable::kBottom) s.insert(s.begin(), x);
      work.push_back({id, x, std::move(s)});
    }
  }
  t.compiling = false;
}

}  // namespace

CompiledGrammar::CompiledGrammar(std::shared_ptr<const Grammar> g, std::shared_ptr<const TokenVocab> v, MaskMode mode)
    : g_(std::move(g)), v_(std::move(v)) {
  if (!g_ || !v_) fail("CompiledGrammar: grammar and vocabulary are required");
  if (mode == MaskMode::kWalk || (mode == MaskMode::kDefault && !split_enabled_by_env())) return;
  const auto t0 = std::chrono::steady_clock::now();
  split_ = std::make_unique<SplitTable>();
  // Uncertain tokens are checked per new state; past ~1/256 of the vocabulary a deeper
  // suffix is cheaper than the checks.
  split_->max_uncertain = std::max<size_t>(64, size_t(v_->size()) / 256);
  std::lock_guard<std::mutex> l(walk_mu_);
  build(*split_, *g_, *v_, memo_);
  split_->compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

CompiledGrammar::~CompiledGrammar() = default;

CompiledGrammar::CacheStats CompiledGrammar::cache_stats() const {
  CacheStats s;
  {
    std::lock_guard<std::mutex> l(mu_);
    s.hits = hits_, s.misses = misses_, s.entries = int64_t(cache_.size()), s.subtrees = subtrees_;
  }
  std::lock_guard<std::mutex> l(walk_mu_);
  if (split_) {
    s.split_entries = int64_t(split_->entries.size());
    s.split_late = split_->n_late;
    s.split_checked = split_->n_checked;
    s.split_compile_ms = split_->compile_ms;
    s.subtrees += split_->n_subtrees;
  }
  return s;
}

void CompiledGrammar::split_mask(const std::vector<std::vector<uint32_t>>& stacks, std::vector<uint32_t>& bits) const {
  SplitTable& t = *split_;
  const Grammar& g = *g_;
  const TokenVocab& v = *v_;
  Stacks base_set;
  for (const auto& s : stacks) {
    if (s.empty()) continue;  // the end (EOS is the caller's)
    const size_t n = s.size();
    std::vector<uint32_t> suffix{s.back()};
    int32_t id = entry_of(t, g, v, memo_, -1, s.back(), suffix);
    while (t.entries[size_t(id)].split) {
      const uint32_t pos = suffix.size() < n ? s[n - 1 - suffix.size()] : SplitTable::kBottom;
      if (pos != SplitTable::kBottom) suffix.insert(suffix.begin(), pos);
      id = entry_of(t, g, v, memo_, id, pos, suffix);
    }
    const SplitTable::Entry& e = t.entries[size_t(id)];
    if (!e.dense.empty())
      for (size_t i = 0; i < bits.size(); ++i) bits[i] |= e.dense[i];
    for (const int32_t tok : e.sparse) bits[size_t(tok) >> 5] |= 1u << (tok & 31);
    if (e.unc.tokens.empty() || e.depth >= n) continue;  // (no base: the rest would follow the end)
    detail::expand_stack(g, std::vector<uint32_t>(s.begin(), s.begin() + long(n - e.depth)), base_set);
    Walker w{g, v, bits, *memo_, false, 0, nullptr, {}};
    const int32_t base = w.intern(base_set);
    for (size_t k = 0; k < e.unc.tokens.size(); ++k) {
      const int32_t tok = e.unc.tokens[k];
      if ((bits[size_t(tok) >> 5] >> (tok & 31)) & 1u) continue;
      ++t.n_checked;
      const std::string_view b = v.bytes(tok);
      for (uint32_t j = e.unc.begin[k]; j < e.unc.begin[k + 1]; ++j)
        if (w.feeds(base, b.substr(e.unc.offs[j]))) {
          bits[size_t(tok) >> 5] |= 1u << (tok & 31);
          break;
        }
    }
  }
}

}  // namespace kvboost::grammar
