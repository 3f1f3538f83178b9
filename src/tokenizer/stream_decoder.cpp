// Incremental detokenization with the prefix_offset / read_offset scheme of Hugging Face
// text-generation-inference: decode a small window twice (with and without the new ids) and
// emit the difference once it no longer ends in U+FFFD (an incomplete UTF-8 sequence).
// Decoding a window that starts at a token boundary keeps decoder context such as
// SentencePiece's Strip(start=1) consistent: both decodes strip the same leading space.
#include "internal.h"

namespace kvboost {

namespace {
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

bool ends_with(const std::string& s, std::string_view suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}
}  // namespace

StreamDecoder::StreamDecoder(const Tokenizer& tok, bool skip_special) : tok_(&tok), skip_special_(skip_special) {}

void StreamDecoder::set_context(const std::vector<int32_t>& prompt) {
  if (!ids_.empty() || prompt.empty()) return;
  // A few ids suffice: the difference depends only on the decoder state at the boundary.
  const size_t n = std::min<size_t>(prompt.size(), 4);
  std::vector<int32_t> tail(prompt.end() - std::ptrdiff_t(n), prompt.end());
  if (ends_with(tok_->impl_->decode(tail.data(), tail.size(), skip_special_), kReplacement)) return;
  ids_ = std::move(tail);
  prefix_offset_ = 0;
  read_offset_ = ids_.size();
}

std::string StreamDecoder::push(int32_t id) {
  ids_.push_back(id);
  const Tokenizer::Impl& impl = *tok_->impl_;
  const int32_t* base = ids_.data() + prefix_offset_;
  std::string prefix_text = impl.decode(base, read_offset_ - prefix_offset_, skip_special_);
  std::string new_text = impl.decode(base, ids_.size() - prefix_offset_, skip_special_);
  if (new_text.size() > prefix_text.size() && !ends_with(new_text, kReplacement) &&
      new_text.compare(0, prefix_text.size(), prefix_text) == 0) {
    prefix_offset_ = read_offset_;
    read_offset_ = ids_.size();
    return new_text.substr(prefix_text.size());
  }
  return {};
}

std::string StreamDecoder::finish() {
  const Tokenizer::Impl& impl = *tok_->impl_;
  const int32_t* base = ids_.data() + prefix_offset_;
  std::string prefix_text = impl.decode(base, read_offset_ - prefix_offset_, skip_special_);
  std::string new_text = impl.decode(base, ids_.size() - prefix_offset_, skip_special_);
  prefix_offset_ = read_offset_ = ids_.size();
  if (new_text.size() > prefix_text.size() && new_text.compare(0, prefix_text.size(), prefix_text) == 0)
    return new_text.substr(prefix_text.size());
  return {};
}

}  // namespace kvboost
