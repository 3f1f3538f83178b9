// Added tokens: leftmost-longest matching (as HF's Aho-Corasick with LeftmostLongest) with the
// lstrip / rstrip / single_word rules of tokenizers' AddedVocabulary::find_matches.
#include "internal.h"

namespace kvboost::tok {

void AddedMatcher::build(const std::vector<const AddedToken*>& tokens, const std::vector<std::string>& contents) {
  nodes_.assign(1, Node{});
  tokens_ = tokens;
  for (size_t t = 0; t < tokens.size(); ++t) {
    const std::string& c = contents[t];
    if (c.empty()) continue;
    int32_t n = 0;
    for (char ch : c) {
      uint8_t b = static_cast<uint8_t>(ch);
      int32_t nx = -1;
      for (auto& [k, v] : nodes_[n].next)
        if (k == b) nx = v;
      if (nx < 0) {
        nx = static_cast<int32_t>(nodes_.size());
        nodes_[n].next.emplace_back(b, nx);
        nodes_.push_back(Node{});
      }
      n = nx;
    }
    if (nodes_[n].token < 0) nodes_[n].token = static_cast<int32_t>(t);  // first wins on duplicates
  }
}

std::vector<Segment> AddedMatcher::split(std::string_view s) const {
  std::vector<Segment> out;
  if (s.empty()) return out;
  size_t start_offset = 0;
  size_t i = 0;
  while (i < s.size()) {
    // Longest token starting at i.
    int32_t n = 0, best = -1;
    size_t best_end = 0;
    for (size_t k = i; k < s.size(); ++k) {
      int32_t nx = -1;
      for (auto& [b, v] : nodes_[n].next)
        if (b == static_cast<uint8_t>(s[k])) nx = v;
      if (nx < 0) break;
      n = nx;
      if (nodes_[n].token >= 0) {
        best = nodes_[n].token;
        best_end = k + 1;
      }
    }
    if (best < 0) {
      ++i;
      continue;
    }
    const AddedToken& tok = *tokens_[best];
    size_t start = i, stop = best_end;
    i = best_end;  // matches never overlap (found before any stripping)
    if (tok.single_word) {
      bool start_space = true, stop_space = true;
      if (start > 0) {
        size_t k = start;
        start_space = !is_word_char(prev_cp(s, k));
      }
      if (stop < s.size()) {
        size_t k = stop;
        stop_space = !is_word_char(next_cp(s, k));
      }
      if (!start_space || !stop_space) continue;
    }
    if (tok.lstrip) {
      size_t k = start;
      while (k > 0) {
        size_t p = k;
        if (!is_white_space(prev_cp(s, p))) break;
        k = p;
      }
      start = std::max(k, start_offset);
    }
    if (tok.rstrip) {
      while (stop < s.size()) {
        size_t p = stop;
        if (!is_white_space(next_cp(s, p))) break;
        stop = p;
      }
    }
    if (start > start_offset) out.push_back({start_offset, start, -1});
    out.push_back({start, stop, tok.id});
    start_offset = stop;
  }
  if (start_offset < s.size()) out.push_back({start_offset, s.size(), -1});
  return out;
}

}  // namespace kvboost::tok
