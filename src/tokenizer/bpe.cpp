// BPE model (tokenizers models/bpe): per-character symbols, byte_fallback/unk, then merges
// applied lowest rank first (ties: leftmost) with a binary heap over a linked list of symbols.
#include <queue>

#include "internal.h"

namespace kvboost::tok {
namespace {

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

constexpr size_t kCacheMaxLen = 256;      // longer pre-tokens are not cached (as HF)
constexpr size_t kCacheMaxEntries = 200000;

}  // namespace

Bpe::Bpe(const json& model, const std::string& where) {
  std::fill(std::begin(byte_ids_), std::end(byte_ids_), -1);
  const std::string type = model.value("type", std::string("BPE"));
  if (type != "BPE") fail(where, ".type: unsupported model type '", type, "' (only BPE is supported)");
  if (!model.contains("vocab") || !model["vocab"].is_object()) fail(where, ".vocab: missing or not an object");
  if (!model.contains("merges") || !model["merges"].is_array()) fail(where, ".merges: missing or not an array");
  if (model.contains("dropout") && model["dropout"].is_number() && model["dropout"].get<double>() > 0.0)
    fail(where, ".dropout: BPE dropout is not supported");

  const json& vocab = model["vocab"];
  vocab_.reserve(vocab.size());
  int32_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer()) fail(where, ".vocab[\"", it.key(), "\"]: id is not an integer");
    const int64_t id64 = it.value().get<int64_t>();
    if (id64 < 0) fail(where, ".vocab[\"", it.key(), "\"]: negative id ", id64);
    // Ids size the id -> token table: a vocabulary's ids are (nearly) dense, so an id far beyond
    // its entry count is a corrupt file, refused before allocating (an id of 10^8 took 3 GB).
    const int64_t limit = std::min<int64_t>(int64_t(1) << 24, int64_t(vocab.size()) * 2 + 65536);
    if (id64 >= limit)
      fail(where, ".vocab[\"", it.key(), "\"]: id ", id64, " is out of range for a vocabulary of ", vocab.size(),
           " entries (limit ", limit, ")");
    const int32_t id = int32_t(id64);
    max_id = std::max(max_id, id);
  }
  id_to_token_.resize(static_cast<size_t>(max_id + 1));
  has_id_.assign(static_cast<size_t>(max_id + 1), false);
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    int32_t id = it.value().get<int32_t>();
    vocab_.insert(it.key(), id);
    id_to_token_[id] = it.key();
    has_id_[id] = true;
  }

  const auto opt_str = [&](const char* key) -> std::optional<std::string> {
    if (model.contains(key) && model[key].is_string()) return model[key].get<std::string>();
    return std::nullopt;
  };
  unk_token_ = opt_str("unk_token");
  prefix_ = opt_str("continuing_subword_prefix").value_or("");
  suffix_ = opt_str("end_of_word_suffix").value_or("");
  fuse_unk_ = model.value("fuse_unk", false);
  byte_fallback_ = model.value("byte_fallback", false);
  ignore_merges_ = model.value("ignore_merges", false);
  if (byte_fallback_) {
    static const char* hex = "0123456789ABCDEF";
    for (int b = 0; b < 256; ++b) {
      std::string name = std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">";
      if (auto id = vocab_.find(name)) byte_ids_[b] = *id;
    }
  }

  const json& merges = model["merges"];
  merges_.reserve(merges.size());
  std::string merged;
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    std::string_view a, b;
    if (m.is_string()) {
      std::string_view s = m.get_ref<const std::string&>();
      size_t sp = s.find(' ');
      if (sp == std::string::npos) fail(where, ".merges[", i, "]: '", s, "' is not two tokens separated by a space");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get_ref<const std::string&>();
      b = m[1].get_ref<const std::string&>();
    } else {
      fail(where, ".merges[", i, "]: expected \"a b\" or [a, b]");
    }
    auto ia = vocab_.find(a), ib = vocab_.find(b);
    if (!ia) fail(where, ".merges[", i, "]: token '", a, "' is not in the vocab");
    if (!ib) fail(where, ".merges[", i, "]: token '", b, "' is not in the vocab");
    merged.assign(a);
    merged.append(b.substr(std::min(prefix_.size(), b.size())));
    auto im = vocab_.find(merged);
    if (!im) fail(where, ".merges[", i, "]: merged token '", merged, "' is not in the vocab");
    merges_.insert_or_assign(pair_key(*ia, *ib), static_cast<int32_t>(i), *im);  // later duplicates win, as HF
  }
}

void Bpe::tokenize(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    if (auto id = vocab_.find(piece)) {
      out.push_back(*id);
      return;
    }
  }
  const bool cacheable = piece.size() < kCacheMaxLen;
  if (cacheable) {
    std::lock_guard<std::mutex> lk(cache_mu_);
    auto it = cache_.find(piece);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  size_t start = out.size();
  merge_word(piece, out);
  if (cacheable) {
    std::vector<int32_t> ids(out.begin() + static_cast<std::ptrdiff_t>(start), out.end());
    std::lock_guard<std::mutex> lk(cache_mu_);
    if (cache_.size() >= kCacheMaxEntries) cache_.clear();
    cache_.emplace(std::string(piece), std::move(ids));
  }
}

void Bpe::merge_word(std::string_view w, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    bool alive;
  };
  std::vector<Symbol> syms;
  syms.reserve(w.size());
  const auto add = [&](int32_t id) {
    int32_t n = static_cast<int32_t>(syms.size());
    syms.push_back({id, n - 1, n + 1, true});
  };
  int32_t unk_id = -1;  // pending (possibly fused) unknown, -1 when none
  std::string tmp;
  size_t i = 0;
  while (i < w.size()) {
    size_t b = i;
    next_cp(w, i);
    std::string_view ch = w.substr(b, i - b);
    std::string_view key = ch;
    if ((b != 0 && !prefix_.empty()) || (i == w.size() && !suffix_.empty())) {
      tmp.clear();
      if (b != 0) tmp += prefix_;
      tmp += ch;
      if (i == w.size()) tmp.append(suffix_);
      key = tmp;
    }
    if (auto id = vocab_.find(key)) {
      if (unk_id >= 0) {
        add(unk_id);
        unk_id = -1;
      }
      add(*id);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char c : key) all = all && byte_ids_[static_cast<uint8_t>(c)] >= 0;
      if (all) {
        // HF does not flush a pending unk here; it is emitted after the bytes.
        for (char c : key) add(byte_ids_[static_cast<uint8_t>(c)]);
        continue;
      }
    }
    if (unk_token_) {
      auto u = vocab_.find(*unk_token_);
      if (!u) fail("BPE: unk_token '", *unk_token_, "' is not in the vocab");
      if (unk_id >= 0 && !fuse_unk_) add(unk_id);
      if (!(unk_id >= 0 && fuse_unk_)) unk_id = *u;
    }
  }
  if (unk_id >= 0) add(unk_id);
  if (syms.empty()) return;
  syms.back().next = -1;

  struct Merge {
    int32_t rank, pos, new_id;
    bool operator<(const Merge& o) const {  // max-heap: lowest rank, then lowest pos on top
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Merge> queue;
  for (size_t k = 0; k + 1 < syms.size(); ++k) {
    if (auto m = merges_.find(pair_key(syms[k].id, syms[k + 1].id)))
      queue.push({m->first, static_cast<int32_t>(k), m->second});
  }
  while (!queue.empty()) {
    Merge top = queue.top();
    queue.pop();
    Symbol& cur = syms[top.pos];
    if (!cur.alive || cur.next < 0) continue;
    Symbol& right = syms[cur.next];
    auto m = merges_.find(pair_key(cur.id, right.id));
    if (!m || m->second != top.new_id) continue;  // stale entry
    cur.id = top.new_id;
    right.alive = false;
    cur.next = right.next;
    if (cur.next >= 0) syms[cur.next].prev = top.pos;
    if (cur.prev >= 0) {
      if (auto p = merges_.find(pair_key(syms[cur.prev].id, cur.id))) queue.push({p->first, cur.prev, p->second});
    }
    if (cur.next >= 0) {
      if (auto n = merges_.find(pair_key(cur.id, syms[cur.next].id))) queue.push({n->first, top.pos, n->second});
    }
  }
  for (auto& s : syms)
    if (s.alive) out.push_back(s.id);
}

}  // namespace kvboost::tok
