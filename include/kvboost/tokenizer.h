// kvboost/tokenizer.h — Hugging Face tokenizer.json, encode and (incremental) decode.
// Uses only kvboost/common.h.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvboost {

class Tokenizer {
 public:
  // Reads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json (add_bos_token,
  // add_eos_token, bos/eos names). Throws Error naming the file and field on bad input.
  static Tokenizer from_dir(const std::string& dir);
  // Same from the texts themselves; `source` names them in error messages.
  static Tokenizer from_json(const std::string& tokenizer_json,
                             const std::string& tokenizer_config_json = "",
                             const std::string& source = "tokenizer.json");

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Token ids of `text`, as Hugging Face `tokenizer(text)["input_ids"]` gives them:
  // added/special tokens matched first, normalizer, pre-tokenizer, BPE, and — when
  // add_special — the post-processor's BOS/EOS. Throws Error on invalid UTF-8.
  std::vector<int32_t> encode(std::string_view text, bool add_special = true) const;
  // Text of `ids`, as Hugging Face `decode(ids, skip_special_tokens=...)` gives it.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;

  int32_t vocab_size() const;  // largest id + 1, added tokens included
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::string id_to_token(int32_t id) const;  // the raw vocabulary string ("" if none)
  bool is_special(int32_t id) const;
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl>);
  std::unique_ptr<Impl> impl_;
  friend class StreamDecoder;
};

// Incremental detokenization for streaming: push ids one at a time and get back the text
// that became final. Never returns part of a UTF-8 character; the concatenation of all
// returns plus finish() equals tokenizer.decode(all ids) — or, after set_context(prompt), the
// text the ids add after the prompt: decode(prompt + ids) minus decode(prompt). That keeps a
// SentencePiece token's leading space, which decode(ids) alone strips ("Once upon a" + " time",
// not "time"), as OpenAI-style servers return a continuation.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special = true);
  // The ids that precede the first push (their last few are kept as decoding context). Call
  // before the first push; ignored when the prompt's tail ends inside a UTF-8 character.
  void set_context(const std::vector<int32_t>& prompt);
  std::string push(int32_t id);
  std::string finish();  // whatever is still held back

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  std::vector<int32_t> ids_;
  size_t prefix_offset_ = 0;
  size_t read_offset_ = 0;
};

// Fixture tokenizers for generated test models (no downloads needed). `kind`:
//  "bytelevel"     GPT-2/Qwen2-style byte-level BPE (Qwen2 split regex), 256 byte tokens + learned
//                  merges, then <|endoftext|>, <|im_start|>, <|im_end|> as added special tokens;
//  "sentencepiece" Llama-2 style: <unk>, <s>, </s>, <0x00>..<0xFF>, learned pieces, byte fallback,
//                  Prepend/Replace normalizer, BOS added by the post-processor.
// The BPE merges are learned from a small built-in English/code/Unicode text; the vocabulary
// (added tokens included) has exactly `vocab_size` entries. Deterministic in `seed`.
std::string make_fixture_tokenizer_json(const std::string& kind, int vocab_size, uint64_t seed = 0);
// The tokenizer_config.json that goes with it (BOS/EOS names, add_bos_token, chat template).
std::string make_fixture_tokenizer_config_json(const std::string& kind);

}  // namespace kvboost
