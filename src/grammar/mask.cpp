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
#include "walk.h"

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
  // Well-formed tokens, counted along the byte order, so that a node's range says at once
  // whether every token below it is.
  std::vector<uint32_t> n_bad(order.size() + 1, 0);
  for (size_t k = 0; k < order.size(); ++k) n_bad[k + 1] = n_bad[k] + (utf8::well_formed(bytes_[size_t(order[k])]) ? 0 : 1);
  for (Below& b : below_) b.utf8_ok = n_bad[b.hi] == n_bad[b.lo];
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


namespace detail {

// KVBOOST_GRAMMAR_SUBTREES=0 turns the whole-subtree shortcut off (the plain walk), for A/B
// measurements in one binary (`kvboost bench grammar`) and for tests of both paths.
bool subtrees_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("KVBOOST_GRAMMAR_SUBTREES");
    return !(e && std::string(e) == "0");
  }();
  return on;
}

}  // namespace detail

namespace {

using detail::Walker;
using detail::WalkMemo;

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
  if (g_->split_ && st_.partial_left == 0) {
    std::lock_guard<std::mutex> wl(g_->walk_mu_);
    g_->split_mask(st_.stacks, *bits);
  } else if (st_.partial_left > 0 || !st_.stacks.empty()) {
    std::lock_guard<std::mutex> wl(g_->walk_mu_);
    if (!g_->memo_ || g_->memo_->over_budget()) g_->memo_ = std::make_unique<WalkMemo>();
    Walker w{g_->grammar(), v, *bits, *g_->memo_, detail::subtrees_enabled(), 0, nullptr, {}};
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
