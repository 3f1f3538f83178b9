// Internal: the mask walks' memo and the trie walker, shared by the per-state walk (mask.cpp)
// and the per-position split (split.cpp).
#pragma once

#include <array>
#include <deque>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kvboost/grammar.h"
#include "utf8_state.h"

namespace kvboost::grammar {

using Stacks = std::vector<std::vector<uint32_t>>;

// The walks' memo: interned stack sets and (set, code point) -> set, so that the matcher runs
// once per distinct transition instead of once per trie node (a state inside a JSON string maps
// almost every character back to one or two sets, and the ~1M nodes of a 262k vocabulary become
// table lookups). It is kept across walks: the walk from a bounded string's k-th character
// computes the transitions of the (k+1)-th, which the next state's walk then only looks up.
// ASCII transitions are a dense table per set; other code points a hash map.
struct CompiledGrammar::WalkMemo {
  static constexpr int32_t kUnknown = -2;  // (-1: rejected)
  std::deque<Stacks> sets;                           // interned stack sets, by id
  std::vector<uint8_t> has_empty;                    // per set: it holds the empty stack
  // Per set: where every non-ASCII character takes it, when that is one set (kMixed: not).
  static constexpr int32_t kMixed = -3;
  std::vector<int32_t> non_ascii;
  std::unordered_map<std::string, int32_t> set_ids;  // serialized set -> id
  std::vector<std::array<int32_t, 128>> ascii;       // per set: ASCII byte -> set
  std::unordered_map<uint64_t, int32_t> step;        // (id, non-ASCII cp) -> set
  std::unordered_map<uint64_t, bool> partial_ok;     // (id, lo) -> a partial char may continue
  // Per set: the ASCII characters known to map it back to itself (a JSON string's body, a
  // pattern's repeated class), and those tested.
  struct Loops {
    uint64_t known[2] = {0, 0}, yes[2] = {0, 0};
  };
  std::vector<Loops> loops;
  // Per set: the ASCII bytes that all lead to one set (the most common accepting target), so a
  // subtree whose bytes are all among them advances a whole trie level with one test.
  struct Uniform {
    bool done = false;
    int32_t target = -1;
    uint64_t bits[2] = {0, 0};
  };
  std::vector<Uniform> uni;
  Stacks scratch;
  size_t stack_words = 0;  // positions held by `sets` (memory bound)

  // Past ~64 MiB the memo starts over (a long generation whose states never repeat).
  bool over_budget() const {
    return sets.size() * (sizeof(std::array<int32_t, 128>) + sizeof(Loops) + sizeof(Uniform) + 96) + stack_words * 8 +
               (step.size() + partial_ok.size()) * 48 >
           (size_t(64) << 20);
  }
};

namespace detail {

using WalkMemo = CompiledGrammar::WalkMemo;

// A class (at `pos`) over the non-ASCII scalar values: 0 takes none, 1 takes all, 2 some.
int class_non_ascii(const Grammar& g, uint32_t pos);

struct Walker {
  const Grammar& g;
  const TokenVocab& v;
  std::vector<uint32_t>& bits;
  WalkMemo& m;
  bool use_subtrees = true;
  int64_t n_shortcut = 0;
  // Classifying mode (split.cpp): the walk starts from a stack suffix, whose base below is
  // unknown. A set holding the empty stack means the suffix was used up there: the rest of the
  // token would be matched by the base, so a token that the suffix alone rejects after such a
  // point is "uncertain" and recorded with every such byte offset on its path (`offs`), instead
  // of rejected. `bits` then gets the tokens the suffix accepts whatever lies below.
  struct Uncertain {
    std::vector<int32_t> tokens;
    std::vector<uint32_t> begin;  // tokens[k]'s offsets: offs[begin[k] .. begin[k+1])
    std::vector<uint16_t> offs;
  };
  Uncertain* unc = nullptr;  // null: the plain walk (a whole state; the empty stack is the end)
  std::vector<uint16_t> path_offs;

  void mark_uncertain(uint32_t node) {
    const TokenVocab::Below& b = v.below()[node];
    for (uint32_t t = b.lo; t < b.hi; ++t) {
      unc->tokens.push_back(v.sorted_ids()[t]);
      unc->begin.push_back(uint32_t(unc->offs.size()));
      unc->offs.insert(unc->offs.end(), path_offs.begin(), path_offs.end());
    }
  }

  // Whether every byte in `b` (all ASCII) maps set `id` back to itself: then every token below
  // the node is accepted, whatever its bytes' order, and the set stays non-empty.
  bool loops_over(int32_t id, const TokenVocab::Below& b) {
    for (int w = 0; w < 2; ++w) {
      {
        const WalkMemo::Loops& L = m.loops[size_t(id)];
        if (b.ascii[w] & L.known[w] & ~L.yes[w]) return false;
      }
      uint64_t need = b.ascii[w] & ~m.loops[size_t(id)].known[w];
      while (need) {
        const int bit = __builtin_ctzll(need);
        need &= need - 1;
        const uint64_t mask = uint64_t(1) << bit;
        const bool same = advance(id, uint32_t(w * 64 + bit)) == id;  // (may grow m.loops)
        WalkMemo::Loops& L = m.loops[size_t(id)];
        L.known[w] |= mask;
        if (same) L.yes[w] |= mask;
        else return false;
      }
    }
    return true;
  }

  const WalkMemo::Uniform& uniform(int32_t id) {
    if (!m.uni[size_t(id)].done) {
      int32_t to[128];
      for (uint32_t c = 0; c < 128; ++c) to[c] = advance(id, c);  // (may grow m.uni)
      std::unordered_map<int32_t, int> count;
      int32_t best = -1;
      for (uint32_t c = 0; c < 128; ++c)
        if (to[c] >= 0 && ++count[to[c]] > (best < 0 ? 0 : count[best])) best = to[c];
      WalkMemo::Uniform u;
      u.done = true;
      u.target = best;
      for (uint32_t c = 0; c < 128; ++c)
        if (best >= 0 && to[c] == best) u.bits[c >> 6] |= uint64_t(1) << (c & 63);
      m.uni[size_t(id)] = u;
    }
    return m.uni[size_t(id)];
  }
  // Whether every token below a node (bytes `b`, all ASCII) is accepted from set `id`: each of
  // the subtree's levels takes all of its bytes to one set (a chain as deep as the subtree; a
  // bounded string's "k characters left" states), and every set on the chain is non-empty.
  bool chain_accepts(int32_t id, const TokenVocab::Below& b) {
    for (int d = 0; d < b.depth; ++d) {
      const WalkMemo::Uniform& u = uniform(id);
      if (u.target < 0 || (b.ascii[0] & ~u.bits[0]) || (b.ascii[1] & ~u.bits[1])) return false;
      id = u.target;
    }
    return true;
  }

  // The set that every non-ASCII character takes set `id` to, when each stack's top class holds
  // all of them or none (a JSON string's body, [^...] classes); WalkMemo::kMixed otherwise.
  int32_t non_ascii_step(int32_t id) {
    if (m.non_ascii[size_t(id)] != WalkMemo::kUnknown) return m.non_ascii[size_t(id)];
    bool uniform = true;
    for (const auto& s : m.sets[size_t(id)])
      if (!s.empty() && class_non_ascii(g, s.back()) == 2) uniform = false;
    const int32_t r = uniform ? advance(id, 0x80) : WalkMemo::kMixed;  // (may grow m.non_ascii)
    m.non_ascii[size_t(id)] = r;
    return r;
  }
  // Whether every token below a node whose subtree has non-ASCII bytes (all well-formed UTF-8)
  // is accepted from `id`: as loops_over / chain_accepts, with every non-ASCII character
  // leading where the level's ASCII bytes do. A character spans several levels, so a token has
  // at most as many characters as the chain is long; one cut short at the end is accepted by a
  // set that takes every non-ASCII character somewhere.
  bool non_ascii_accepts(int32_t id, const TokenVocab::Below& b) {
    if (non_ascii_step(id) == id && loops_over(id, b)) return true;
    const bool ascii = b.ascii[0] | b.ascii[1];
    for (int d = 0; d < b.depth; ++d) {
      const int32_t na = non_ascii_step(id);
      if (na < 0) return false;
      if (ascii) {
        const WalkMemo::Uniform& u = uniform(id);
        if (u.target != na || (b.ascii[0] & ~u.bits[0]) || (b.ascii[1] & ~u.bits[1])) return false;
      }
      id = na;
    }
    return true;
  }

  static std::string key_of(const Stacks& st) {
    std::string k;
    for (const auto& s : st) {
      const uint32_t n = uint32_t(s.size());
      k.append(reinterpret_cast<const char*>(&n), 4);
      k.append(reinterpret_cast<const char*>(s.data()), s.size() * 4);
    }
    return k;
  }
  int32_t intern(const Stacks& st) {
    auto [it, added] = m.set_ids.emplace(key_of(st), int32_t(m.sets.size()));
    if (added) {
      m.sets.push_back(st);
      m.has_empty.push_back(!st.empty() && st.front().empty());  // (sets are sorted: [] first)
      m.non_ascii.push_back(WalkMemo::kUnknown);
      std::array<int32_t, 128> row;
      row.fill(WalkMemo::kUnknown);
      m.ascii.push_back(row);
      m.loops.emplace_back();
      m.uni.emplace_back();
      for (const auto& s : st) m.stack_words += s.size() + 1;
    }
    return it->second;
  }
  int32_t advance(int32_t id, uint32_t cp) {
    if (cp < 128) {
      const int32_t known = m.ascii[size_t(id)][cp];
      if (known != WalkMemo::kUnknown) return known;
    } else {
      auto it = m.step.find((uint64_t(uint32_t(id)) << 21) | cp);
      if (it != m.step.end()) return it->second;
    }
    advance_stacks(g, m.sets[size_t(id)], cp, m.scratch);
    const int32_t r = m.scratch.empty() ? -1 : intern(m.scratch);
    if (cp < 128) m.ascii[size_t(id)][cp] = r;
    else m.step.emplace((uint64_t(uint32_t(id)) << 21) | cp, r);
    return r;
  }
  bool may_continue(int32_t id, uint8_t left, uint32_t lo, uint32_t hi) {
    const uint64_t k = (uint64_t(uint32_t(id)) << 23) | (uint64_t(left) << 21) | lo;
    auto it = m.partial_ok.find(k);
    if (it != m.partial_ok.end()) return it->second;
    const bool r = stacks_accept_range(g, m.sets[size_t(id)], lo, hi);
    m.partial_ok.emplace(k, r);
    return r;
  }

  // `depth`: the bytes consumed to reach `node`. cur: the set after them (before the partial
  // character pcp/pleft/plen, if any).
  void walk(uint32_t node, int32_t cur, uint32_t pcp, uint8_t pleft, uint8_t plen, uint16_t depth = 0) {
    const bool falls = unc && pleft == 0 && m.has_empty[size_t(cur)];
    if (falls) path_offs.push_back(depth);
    const TokenVocab::Node& n = v.nodes()[node];
    for (uint32_t c = n.first_child; c < n.first_child + n.n_children; ++c) {
      const uint8_t b = v.edge_bytes()[c];
      uint32_t qcp = pcp;
      uint8_t qleft = pleft, qlen = plen;
      int32_t next = cur;
      // Bytes that are not UTF-8 are rejected whatever the stacks (a base resuming at an earlier
      // character boundary decodes the same characters); a character no stack takes only by
      // these stacks.
      if (qleft == 0 && b < 0x80) {
        next = advance(cur, b);
      } else if (qleft == 0) {
        if (!utf8::lead(b, qcp, qleft, qlen)) continue;
      } else {
        if ((b & 0xC0) != 0x80) continue;
        qcp = (qcp << 6) | (b & 0x3F);
        if (--qleft == 0) {
          if (!utf8::valid(qcp, qlen)) continue;
          next = advance(cur, qcp);
          qcp = 0, qlen = 0;
        }
      }
      bool dead = next < 0;
      if (!dead && qleft > 0) {
        uint32_t lo, hi;
        if (!utf8::range(qcp, qleft, qlen, lo, hi)) continue;
        dead = !may_continue(cur, qleft, lo, hi);
      }
      if (dead) {
        if (!path_offs.empty()) mark_uncertain(c);
        continue;
      }
      const TokenVocab::Node& cn = v.nodes()[c];
      if (qleft == 0 && cn.n_children && use_subtrees) {
        const TokenVocab::Below& bl = v.below()[c];
        if (bl.non_ascii ? bl.utf8_ok && non_ascii_accepts(next, bl) : loops_over(next, bl) || chain_accepts(next, bl)) {
          for (uint32_t t = bl.lo; t < bl.hi; ++t) {
            const int32_t id = v.sorted_ids()[t];
            bits[size_t(id) >> 5] |= 1u << (id & 31);
          }
          ++n_shortcut;
          continue;
        }
      }
      for (uint32_t t = cn.first_token; t < cn.first_token + cn.n_tokens; ++t) {
        const int32_t id = v.token_ids()[t];
        bits[size_t(id) >> 5] |= 1u << (id & 31);
      }
      if (cn.n_children) walk(c, next, qcp, qleft, qlen, uint16_t(depth + 1));
    }
    if (falls) path_offs.pop_back();
  }

  // Whether `bytes` (starting at a character boundary) is accepted from set `id`, as the
  // matcher's feed would (a partial character at the end must be takeable).
  bool feeds(int32_t id, std::string_view bytes) {
    uint32_t cp = 0;
    uint8_t left = 0, len = 0;
    for (const char ch : bytes) {
      const uint8_t b = uint8_t(ch);
      if (left == 0 && b < 0x80) {
        if ((id = advance(id, b)) < 0) return false;
      } else if (left == 0) {
        if (!utf8::lead(b, cp, left, len)) return false;
      } else {
        if ((b & 0xC0) != 0x80) return false;
        cp = (cp << 6) | (b & 0x3F);
        if (--left == 0) {
          if (!utf8::valid(cp, len) || (id = advance(id, cp)) < 0) return false;
          cp = 0;
        }
      }
    }
    if (left == 0) return true;
    uint32_t lo, hi;
    return utf8::range(cp, left, len, lo, hi) && may_continue(id, left, lo, hi);
  }
};

// KVBOOST_GRAMMAR_SUBTREES=0 turns the whole-subtree shortcut off (mask.cpp).
bool subtrees_enabled();
// The stacks one stack becomes when rule references at its top are expanded (matcher.cpp).
void expand_stack(const Grammar& g, std::vector<uint32_t> stack, Stacks& out);

}  // namespace detail
}  // namespace kvboost::grammar
