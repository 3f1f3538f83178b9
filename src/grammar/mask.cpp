// Token masks: the vocabulary as byte strings in a trie (built once per tokenizer), walked from
// the matcher's state so that a rejected prefix prunes every token under it; masks are cached
// per state in the CompiledGrammar.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <deque>
#include <unordered_map>
#include <limits>
#include <list>
#include <map>

#include "kvboost/grammar.h"
#include "utf8_state.h"

namespace kvboost::grammar {

// ---- vocabulary --------------------------------------------------------------------------------

namespace {
// GPT-2's bytes_to_unicode, inverted: code point -> byte (-1: not a byte char).
int byte_of_unicode(uint32_t cp) {
  static const std::vector<int> table = [] {
    std::vector<int> t(324, -1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      if (printable) t[size_t(b)] = b;
      else t[size_t(256 + n++)] = b;
    }
    return t;
  }();
  return cp < table.size() ? table[cp] : -1;
}

bool next_cp(const std::string& s, size_t& i, uint32_t& cp) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (n == 0 || i + n > s.size()) return false;
  cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += n;
  return true;
}

int hexv(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
}  // namespace

std::vector<std::string> TokenVocab::token_bytes_of(const Tokenizer& tok) {
  const int32_t n = tok.vocab_size();
  // Byte-level BPE (GPT-2, Qwen, Llama 3) writes ' ' as U+0120 'Ġ'; SentencePiece as U+2581.
  const bool byte_level = tok.token_to_id("\xC4\xA0").has_value() || tok.token_to_id("\xC4\x8A").has_value();
  std::vector<std::string> out(static_cast<size_t>(n));
  for (int32_t id = 0; id < n; ++id) {
    if (tok.is_special(id)) continue;
    const std::string s = tok.id_to_token(id);
    if (s.empty()) continue;
    if (s.size() == 6 && s[0] == '<' && s[1] == '0' && s[2] == 'x' && s[5] == '>' && hexv(s[3]) >= 0 && hexv(s[4]) >= 0) {
      out[size_t(id)] = std::string(1, char(hexv(s[3]) * 16 + hexv(s[4])));
      continue;
    }
    std::string b;
    if (byte_level) {
      bool ok = true;
      for (size_t i = 0; i < s.size() && ok;) {
        uint32_t cp;
        if (!next_cp(s, i, cp)) ok = false;
        else if (const int v = byte_of_unicode(cp); v >= 0) b += char(v);
        else ok = false;
      }
      if (!ok) b = s;  // an added token kept as its raw text
    } else {
      for (size_t i = 0; i < s.size();) {
        if (s.compare(i, 3, "\xE2\x96\x81") == 0) {
          b += ' ';
          i += 3;
        } else {
          b += s[i++];
        }
      }
    }
    out[size_t(id)] = std::move(b);
  }
  return out;
}

TokenVocab::TokenVocab(std::vector<std::string> token_bytes) : bytes_(std::move(token_bytes)) {
  // Sort the non-empty tokens by bytes, then build the trie level by level from the sorted list
  // (children come out sorted by byte, and each node's tokens are contiguous).
  std::vector<int32_t> order;
  for (int32_t i = 0; i < int32_t(bytes_.size()); ++i)
    if (!bytes_[size_t(i)].empty()) {
      order.push_back(i);
      max_len_ = std::max(max_len_, bytes_[size_t(i)].size());
    }
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return bytes_[size_t(a)] < bytes_[size_t(b)] || (bytes_[size_t(a)] == bytes_[size_t(b)] && a < b);
  });
  // Build recursively over ranges of `order` sharing a prefix of length depth; BFS so that each
  // node's children are consecutive.
  struct Pending {
    uint32_t node;
    size_t lo, hi, depth;
  };
  nodes_.push_back({});
  edge_bytes_.push_back(0);
  std::vector<Pending> q{{0, 0, order.size(), 0}};
  for (size_t qi = 0; qi < q.size(); ++qi) {
    const Pending p = q[qi];
    below_.resize(nodes_.size());
    below_[p.node].lo = uint32_t(p.lo);
    below_[p.node].hi = uint32_t(p.hi);
    size_t k = p.lo;
    // tokens that end here
    nodes_[p.node].first_token = uint32_t(token_ids_.size());
    while (k < p.hi && bytes_[size_t(order[k])].size() == p.depth) token_ids_.push_back(order[k++]);
    nodes_[p.node].n_tokens = uint32_t(token_ids_.size()) - nodes_[p.node].first_token;
    nodes_[p.node].first_child = uint32_t(nodes_.size());
    while (k < p.hi) {
      const uint8_t c = uint8_t(bytes_[size_t(order[k])][p.depth]);
      size_t e = k;
      while (e < p.hi && uint8_t(bytes_[size_t(order[e])][p.depth]) == c) ++e;
      const uint32_t child = uint32_t(nodes_.size());
      nodes_.push_back({});
      edge_bytes_.push_back(c);
      q.push_back({child, k, e, p.depth + 1});
      k = e;
    }
    nodes_[p.node].n_children = uint32_t(nodes_.size()) - nodes_[p.node].first_child;
  }
  below_.resize(nodes_.size());
  // Children have larger indices than their parent (BFS): fold the bytes below bottom-up.
  for (size_t n = nodes_.size(); n-- > 1;) {
    Below& b = below_[n];
    for (uint32_t c = nodes_[n].first_child; c < nodes_[n].first_child + nodes_[n].n_children; ++c) {
      const uint8_t e = edge_bytes_[c];
      if (e < 0x80) b.ascii[e >> 6] |= uint64_t(1) << (e & 63);
      else b.non_ascii = true;
      b.ascii[0] |= below_[c].ascii[0];
      b.ascii[1] |= below_[c].ascii[1];
      b.non_ascii = b.non_ascii || below_[c].non_ascii;
      b.depth = uint16_t(std::min<int>(0xFFFF, std::max<int>(b.depth, below_[c].depth + 1)));
    }
  }
  sorted_ids_ = std::move(order);
}

std::shared_ptr<const TokenVocab> TokenVocab::of(const Tokenizer& tok) {
  // Keyed by the tokenizer's address plus a fingerprint of its vocabulary, so that a new
  // tokenizer at a freed address is not mistaken for the old one.
  static std::mutex mu;
  static std::map<const Tokenizer*, std::pair<std::string, std::shared_ptr<const TokenVocab>>> cache;
  const int32_t n = tok.vocab_size();
  std::string fp = std::to_string(n);
  for (int32_t id : {0, 1, n / 3, n / 2, n - 2, n - 1})
    if (id >= 0 && id < n) fp += '\x1f' + tok.id_to_token(id);
  std::lock_guard<std::mutex> l(mu);
  auto it = cache.find(&tok);
  if (it != cache.end() && it->second.first == fp) return it->second.second;
  if (cache.size() > 16) cache.clear();
  auto v = std::make_shared<const TokenVocab>(token_bytes_of(tok));
  cache[&tok] = {fp, v};
  return v;
}

// ---- compiled grammars and masks ---------------------------------------------------------------

CompiledGrammar::CompiledGrammar(std::shared_ptr<const Grammar> g, std::shared_ptr<const TokenVocab> v)
    : g_(std::move(g)), v_(std::move(v)) {
  if (!g_ || !v_) fail("CompiledGrammar: grammar and vocabulary are required");
}

std::shared_ptr<const CompiledGrammar> CompiledGrammar::get(const std::string& gbnf, std::shared_ptr<const TokenVocab> v) {
  static std::mutex mu;
  static std::list<std::pair<std::pair<std::string, const TokenVocab*>, std::shared_ptr<const CompiledGrammar>>> lru;
  {
    std::lock_guard<std::mutex> l(mu);
    for (auto it = lru.begin(); it != lru.end(); ++it) {
      if (it->first.first == gbnf && it->first.second == v.get()) {
        lru.splice(lru.begin(), lru, it);
        return lru.front().second;
      }
    }
  }
  auto cg = std::make_shared<const CompiledGrammar>(parse_gbnf(gbnf), v);
  std::lock_guard<std::mutex> l(mu);
  lru.emplace_front(std::make_pair(gbnf, v.get()), cg);
  while (lru.size() > 32) lru.pop_back();
  return cg;
}

CompiledGrammar::CacheStats CompiledGrammar::cache_stats() const {
  std::lock_guard<std::mutex> l(mu_);
  return {hits_, misses_, int64_t(cache_.size()), subtrees_};
}

namespace {

using Stacks = std::vector<std::vector<uint32_t>>;

}  // namespace

// The walks' memo: interned stack sets and (set, code point) -> set, so that the matcher runs
// once per distinct transition instead of once per trie node (a state inside a JSON string maps
// almost every character back to one or two sets, and the ~1M nodes of a 262k vocabulary become
// table lookups). It is kept across walks: the walk from a bounded string's k-th character
// computes the transitions of the (k+1)-th, which the next state's walk then only looks up.
// ASCII transitions are a dense table per set; other code points a hash map.
struct CompiledGrammar::WalkMemo {
  static constexpr int32_t kUnknown = -2;  // (-1: rejected)
  std::deque<Stacks> sets;                           // interned stack sets, by id
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

CompiledGrammar::~CompiledGrammar() = default;

namespace {

using WalkMemo = CompiledGrammar::WalkMemo;

struct Walker {
  const Grammar& g;
  const TokenVocab& v;
  std::vector<uint32_t>& bits;
  WalkMemo& m;
  bool use_subtrees = true;
  int64_t n_shortcut = 0;

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

  void walk(uint32_t node, int32_t cur, uint32_t pcp, uint8_t pleft, uint8_t plen) {
    const TokenVocab::Node& n = v.nodes()[node];
    for (uint32_t c = n.first_child; c < n.first_child + n.n_children; ++c) {
      const uint8_t b = v.edge_bytes()[c];
      uint32_t qcp = pcp;
      uint8_t qleft = pleft, qlen = plen;
      int32_t next = cur;
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
      if (next < 0) continue;
      if (qleft > 0) {
        uint32_t lo, hi;
        if (!utf8::range(qcp, qleft, qlen, lo, hi) || !may_continue(cur, qleft, lo, hi)) continue;
      }
      const TokenVocab::Node& cn = v.nodes()[c];
      if (qleft == 0 && cn.n_children && use_subtrees) {
        const TokenVocab::Below& b = v.below()[c];
        if (!b.non_ascii && (loops_over(next, b) || chain_accepts(next, b))) {
          for (uint32_t t = b.lo; t < b.hi; ++t) {
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
      if (cn.n_children) walk(c, next, qcp, qleft, qlen);
    }
  }
};

// KVBOOST_GRAMMAR_SUBTREES=0 turns the whole-subtree shortcut off (the plain walk), for A/B
// measurements in one binary (`kvboost bench grammar`) and for tests of both paths.
bool subtrees_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("KVBOOST_GRAMMAR_SUBTREES");
    return !(e && std::string(e) == "0");
  }();
  return on;
}

std::string state_key(const Matcher::State& st) {
  std::string k;
  k.reserve(8 + st.stacks.size() * 16);
  auto put = [&](uint32_t x) { k.append(reinterpret_cast<const char*>(&x), 4); };
  put(st.partial_cp);
  put(uint32_t(st.partial_left) | (uint32_t(st.partial_len) << 8));
  for (const auto& s : st.stacks) {
    put(uint32_t(s.size()));
    for (uint32_t x : s) put(x);
  }
  return k;
}

}  // namespace

std::shared_ptr<const std::vector<uint32_t>> Matcher::allowed() {
  const std::string key = state_key(st_);
  {
    std::lock_guard<std::mutex> l(g_->mu_);
    auto it = g_->cache_.find(key);
    if (it != g_->cache_.end()) {
      ++g_->hits_;
      return it->second;
    }
    ++g_->misses_;
  }
  const TokenVocab& v = g_->vocab();
  auto bits = std::make_shared<std::vector<uint32_t>>((size_t(v.size()) + 31) / 32, 0u);
  int64_t n_shortcut = 0;
  if (st_.partial_left > 0 || !st_.stacks.empty()) {
    std::lock_guard<std::mutex> wl(g_->walk_mu_);
    if (!g_->memo_ || g_->memo_->over_budget()) g_->memo_ = std::make_unique<WalkMemo>();
    Walker w{g_->grammar(), v, *bits, *g_->memo_, subtrees_enabled(), 0};
    w.walk(0, w.intern(st_.stacks), st_.partial_cp, st_.partial_left, st_.partial_len);
    n_shortcut = w.n_shortcut;
  }
  std::lock_guard<std::mutex> l(g_->mu_);
  g_->subtrees_ += n_shortcut;
  // At most ~64 MiB of masks per grammar; past that, start over (states of a long generation
  // that never repeat).
  const size_t max_entries = std::max<size_t>(64, (size_t(64) << 20) / (bits->size() * 4 + 64));
  if (g_->cache_.size() >= max_entries) g_->cache_.clear();
  g_->cache_.emplace(key, bits);
  return bits;
}

int64_t Matcher::apply(float* logits, int64_t n_logits, const std::vector<int32_t>& eos_ids) {
  const auto bits = allowed();
  const int64_t nv = std::min<int64_t>(n_logits, g_->vocab().size());
  const float ninf = -std::numeric_limits<float>::infinity();
  const bool complete = is_complete();
  // EOS keeps its logit only when the grammar may end; remember it before the word loop.
  std::vector<std::pair<int32_t, float>> eos_keep;
  for (int32_t e : eos_ids)
    if (complete && e >= 0 && e < n_logits) eos_keep.emplace_back(e, logits[e]);
  int64_t n_allowed = 0;
  const uint32_t* w = bits->data();
  for (int64_t i = 0; i < nv; i += 32) {
    const uint32_t word = w[size_t(i) >> 5];
    const int64_t end = std::min<int64_t>(nv, i + 32);
    if (word == 0) {
      for (int64_t j = i; j < end; ++j) logits[j] = ninf;
      continue;
    }
    if (word == 0xFFFFFFFFu && end == i + 32) {
      n_allowed += 32;
      continue;
    }
    for (int64_t j = i; j < end; ++j) {
      if (word & (1u << (j - i))) ++n_allowed;
      else logits[j] = ninf;
    }
  }
  for (int64_t j = nv; j < n_logits; ++j) logits[j] = ninf;
  for (int32_t e : eos_ids)  // EOS is never in the trie's mask (special), but a plain one could be
    if (e >= 0 && e < n_logits && !complete) {
      if (logits[e] != ninf) --n_allowed;
      logits[e] = ninf;
    }
  for (const auto& [e, l] : eos_keep) {
    if (logits[e] == ninf) ++n_allowed;
    logits[e] = l;
  }
  return n_allowed;
}

}  // namespace kvboost::grammar
