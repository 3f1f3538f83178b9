// The pushdown matcher (llama.cpp's llama_grammar_advance_stack / accept): a state is a set of
// stacks of grammar positions; every stack's top is a terminal (a character class). A code point
// advances each stack whose top accepts it, then expands rule references at the new top; an
// empty stack means the grammar can end there. Tail references push no return position, so
// right recursion (x* rewritten as r ::= x r | ) keeps stacks flat and states repeat, which is
// what makes the per-state mask cache hit.
#include <algorithm>

#include "kvboost/grammar.h"
#include "utf8_state.h"
#include "walk.h"

namespace kvboost::grammar {
namespace {

using Stack = std::vector<uint32_t>;

bool end_of_seq(const Grammar& g, uint32_t pos) {
  const Op op = g.elems[pos].op;
  return op == Op::kEnd || op == Op::kAlt;
}

void add_unique(Stacks& out, Stack&& s) {
  for (const Stack& o : out)
    if (o == s) return;
  out.push_back(std::move(s));
}

void advance_stack(const Grammar& g, Stack stack, Stacks& out) {
  if (stack.empty()) {
    add_unique(out, std::move(stack));
    return;
  }
  const uint32_t pos = stack.back();
  const Elem e = g.elems[pos];
  if (e.op != Op::kRuleRef) {
    add_unique(out, std::move(stack));
    return;
  }
  stack.pop_back();
  const bool tail = end_of_seq(g, pos + 1);
  uint32_t sub = g.rule_start[e.value];
  for (;;) {
    Stack ns = stack;
    if (!tail) ns.push_back(pos + 1);
    if (!end_of_seq(g, sub)) ns.push_back(sub);
    advance_stack(g, std::move(ns), out);
    while (!end_of_seq(g, sub)) ++sub;
    if (g.elems[sub].op == Op::kAlt) ++sub;
    else break;
  }
}

// Whether the class at `pos` accepts cp; *next = the position after the class.
bool match_char(const Grammar& g, uint32_t pos, uint32_t cp, uint32_t* next) {
  const Elem* e = &g.elems[pos];
  if (e->op == Op::kCharAny) {
    *next = pos + 1;
    return true;
  }
  const bool positive = e->op == Op::kChar;
  bool found = false;
  do {
    if (e[1].op == Op::kCharRngUpper) {
      found = found || (e->value <= cp && cp <= e[1].value);
      e += 2;
    } else {
      found = found || e->value == cp;
      e += 1;
    }
  } while (e->op == Op::kCharAlt);
  *next = uint32_t(e - g.elems.data());
  return found == positive;
}

// The code-point ranges of the character class at pos (not kCharAny), as written; *positive:
// kChar (the class accepts them) rather than kCharNot.
std::vector<std::pair<uint32_t, uint32_t>> class_ranges(const Grammar& g, uint32_t pos, bool* positive) {
  const Elem* e = &g.elems[pos];
  *positive = e->op == Op::kChar;
  std::vector<std::pair<uint32_t, uint32_t>> rs;
  do {
    if (e[1].op == Op::kCharRngUpper) {
      rs.emplace_back(e->value, e[1].value);
      e += 2;
    } else {
      rs.emplace_back(e->value, e->value);
      e += 1;
    }
  } while (e->op == Op::kCharAlt);
  return rs;
}

bool class_accepts_range(const Grammar& g, uint32_t pos, uint32_t lo, uint32_t hi) {
  if (g.elems[pos].op == Op::kCharAny) return true;
  bool positive = false;
  std::vector<std::pair<uint32_t, uint32_t>> rs = class_ranges(g, pos, &positive);
  if (positive) {
    for (const auto& [a, b] : rs)
      if (a <= hi && b >= lo) return true;
    return false;
  }
  // Negated: some code point of [lo, hi] lies outside every range.
  std::sort(rs.begin(), rs.end());
  uint64_t at = lo;
  for (const auto& [a, b] : rs) {
    if (a > at) break;
    if (uint64_t(b) + 1 > at) at = uint64_t(b) + 1;
  }
  return at <= hi;
}

}  // namespace

int detail::class_non_ascii(const Grammar& g, uint32_t pos) {
  if (g.elems[pos].op == Op::kCharAny) return 1;
  bool positive = false;
  std::vector<std::pair<uint32_t, uint32_t>> rs = class_ranges(g, pos, &positive);
  // The non-ASCII scalar values: U+0080..U+D7FF and U+E000..U+10FFFF.
  std::sort(rs.begin(), rs.end());
  bool any = false, all = true;
  for (const auto& [lo, hi] : {std::pair<uint32_t, uint32_t>{0x80, 0xD7FF}, {0xE000, 0x10FFFF}}) {
    uint64_t at = lo;  // covered up to here
    for (const auto& [a, b] : rs) {
      if (a <= hi && b >= lo) any = true;
      if (a <= at && uint64_t(b) + 1 > at) at = uint64_t(b) + 1;
    }
    if (at <= hi) all = false;
  }
  if (!any) return positive ? 0 : 1;
  if (all) return positive ? 1 : 0;
  return 2;
}

void detail::expand_stack(const Grammar& g, std::vector<uint32_t> stack, Stacks& out) {
  out.clear();
  advance_stack(g, std::move(stack), out);
  std::sort(out.begin(), out.end());
}

std::vector<std::vector<uint32_t>> initial_stacks(const Grammar& g) {
  Stacks out;
  uint32_t sub = g.rule_start[g.root];
  for (;;) {
    Stack s;
    if (!end_of_seq(g, sub)) s.push_back(sub);
    advance_stack(g, std::move(s), out);
    while (!end_of_seq(g, sub)) ++sub;
    if (g.elems[sub].op == Op::kAlt) ++sub;
    else break;
  }
  std::sort(out.begin(), out.end());
  return out;
}

void advance_stacks(const Grammar& g, const std::vector<std::vector<uint32_t>>& stacks, uint32_t cp,
                    std::vector<std::vector<uint32_t>>& out) {
  out.clear();
  for (const Stack& s : stacks) {
    if (s.empty()) continue;
    uint32_t next;
    if (!match_char(g, s.back(), cp, &next)) continue;
    Stack ns(s.begin(), s.end() - 1);
    if (!end_of_seq(g, next)) ns.push_back(next);
    advance_stack(g, std::move(ns), out);
  }
  if (out.size() > 1) std::sort(out.begin(), out.end());
}

bool stacks_accept_range(const Grammar& g, const std::vector<std::vector<uint32_t>>& stacks, uint32_t lo, uint32_t hi) {
  for (const Stack& s : stacks)
    if (!s.empty() && class_accepts_range(g, s.back(), lo, hi)) return true;
  return false;
}

// ---- Matcher -----------------------------------------------------------------------------------

Matcher::Matcher(std::shared_ptr<const CompiledGrammar> g) : g_(std::move(g)) {
  if (!g_) fail("grammar::Matcher: no grammar");
  st_.stacks = initial_stacks(g_->grammar());
}

namespace {
// Feeds bytes into a state; false when the grammar rejects them (st is then garbage).
bool feed(const Grammar& g, Matcher::State& st, std::string_view bytes, Stacks& scratch) {
  for (const char ch : bytes) {
    const uint8_t b = uint8_t(ch);
    uint32_t cp = 0;
    bool complete = false;
    if (st.partial_left == 0) {
      if (b < 0x80) {
        cp = b;
        complete = true;
      } else if (!utf8::lead(b, st.partial_cp, st.partial_left, st.partial_len)) {
        return false;  // a continuation byte, C0/C1 or F5.. where a character must start
      }
    } else {
      if ((b & 0xC0) != 0x80) return false;
      st.partial_cp = (st.partial_cp << 6) | (b & 0x3F);
      if (--st.partial_left == 0) {
        cp = st.partial_cp;
        complete = true;
        if (!utf8::valid(cp, st.partial_len)) return false;
        st.partial_cp = 0;
        st.partial_len = 0;
      }
    }
    if (complete) {
      advance_stacks(g, st.stacks, cp, scratch);
      if (scratch.empty()) return false;
      st.stacks.swap(scratch);
    }
  }
  if (st.partial_left > 0) {
    uint32_t lo, hi;
    if (!utf8::range(st.partial_cp, st.partial_left, st.partial_len, lo, hi)) return false;
    if (!stacks_accept_range(g, st.stacks, lo, hi)) return false;
  }
  return true;
}
}  // namespace

bool Matcher::accept_bytes(std::string_view bytes) {
  State next = st_;
  Stacks scratch;
  if (!feed(g_->grammar(), next, bytes, scratch)) return false;
  undo_.push_back(std::move(st_));
  st_ = std::move(next);
  return true;
}

bool Matcher::accept(int32_t token, const std::vector<int32_t>& eos_ids) {
  if (std::find(eos_ids.begin(), eos_ids.end(), token) != eos_ids.end()) {
    if (!is_complete()) return false;
    undo_.push_back(st_);
    return true;
  }
  if (token < 0 || token >= g_->vocab().size()) return false;
  const std::string& b = g_->vocab().bytes(token);
  if (b.empty()) return false;
  return accept_bytes(b);
}

void Matcher::rollback(size_t n_tokens) {
  if (n_tokens > undo_.size()) fail("grammar::Matcher::rollback(", n_tokens, "): only ", undo_.size(), " tokens accepted");
  for (size_t k = 0; k < n_tokens; ++k) {
    st_ = std::move(undo_.back());
    undo_.pop_back();
  }
}

bool Matcher::is_complete() const {
  if (st_.partial_left) return false;
  for (const auto& s : st_.stacks)
    if (s.empty()) return true;
  return false;
}

bool Matcher::must_end() const {
  if (st_.partial_left) return false;
  for (const auto& s : st_.stacks)
    if (!s.empty()) return false;
  return !st_.stacks.empty();
}

}  // namespace kvboost::grammar
