// Internal pieces of the tokenizer: the Hugging Face `tokenizers` pipeline stages.
// Semantics follow tokenizers 0.21 (Rust): added-token extraction, normalizer, pre-tokenizer,
// model (BPE), post-processor, decoder. Only token ids matter here, so offsets are not kept.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvboost/common.h"
#include "kvboost/tokenizer.h"

namespace kvboost::tok {

using json = nlohmann::json;

// The "type" of a component object (normalizer, pre_tokenizer, decoder, post_processor): it must
// be an object whose "type" is a string (fuzz_tokenizer_json found {"type": 1} escaping as a
// json::type_error).
inline std::string json_type(const json& j, const std::string& where) {
  if (!j.is_object() || !j.contains("type")) fail(where, ": expected an object with \"type\"");
  const json& t = j["type"];
  if (!t.is_string()) fail(where, ": \"type\" is ", t.type_name(), ", expected a string");
  return t.get<std::string>();
}

// A token id field: an integer in [0, 2^31), else an Error naming what (a float such as 1e300
// would otherwise be cast to int32_t: undefined behaviour; fuzz_tokenizer_json found it).
inline int32_t json_id(const json& v, const std::string& what) {
  if (!v.is_number_integer()) fail(what, ": token id ", v.dump(), " is not an integer");
  const int64_t id = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX) ? -1 : v.get<int64_t>();
  if (id < 0 || id > INT32_MAX) fail(what, ": token id ", v.dump(), " is out of range");
  return int32_t(id);
}

// ---- UTF-8 (utf8.cpp) ----
// Throws Error "invalid UTF-8 at byte N" (N relative to the start of `s`).
void validate_utf8(std::string_view s);
// Decodes the code point at s[i] (s must be valid UTF-8) and advances i.
uint32_t next_cp(std::string_view s, size_t& i);
// Code point ending at s[i] (exclusive), moving i back to its start.
uint32_t prev_cp(std::string_view s, size_t& i);
void append_cp(std::string& out, uint32_t cp);
// Rust's String::from_utf8_lossy: each maximal invalid subpart becomes U+FFFD.
std::string utf8_lossy(std::string_view bytes);
bool is_valid_utf8(std::string_view s);
bool is_white_space(uint32_t cp);  // Unicode White_Space (Rust char::is_whitespace)
bool is_word_char(uint32_t cp);    // regex \w (Unicode)

// ---- transparent string-keyed hash map ----
struct StrHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
struct StrEq {
  using is_transparent = void;
  bool operator()(std::string_view a, std::string_view b) const { return a == b; }
};
template <typename V>
using StrMap = std::unordered_map<std::string, V, StrHash, StrEq>;

// Open-addressing maps for the large, build-once tables (151k-token vocabularies, 280k merges):
// node-based maps made loading several times slower through allocation and cache misses.
class FlatStrIndex {  // string -> int32 id; keys owned here
 public:
  void reserve(size_t n);
  bool insert(std::string key, int32_t id);  // false (and no change) when the key exists
  std::optional<int32_t> find(std::string_view key) const;
  size_t size() const { return keys_.size(); }

 private:
  void rehash(size_t n_slots);
  std::vector<std::string> keys_;
  std::vector<int32_t> ids_;
  std::vector<uint64_t> hashes_;
  std::vector<int32_t> slots_;  // index into keys_, -1 empty
};
class FlatPairMap {  // (a, b) -> (rank, new id)
 public:
  void reserve(size_t n);
  void insert_or_assign(uint64_t key, int32_t rank, int32_t new_id);
  const std::pair<int32_t, int32_t>* find(uint64_t key) const;

 private:
  struct Slot {
    uint64_t key;
    std::pair<int32_t, int32_t> value;
    bool used;
  };
  void rehash(size_t n_slots);
  std::vector<Slot> slots_;
  size_t n_ = 0;
};

// ---- regex (regex.cpp): PCRE2, UTF + UCP, JIT ----
class Regex {
 public:
  explicit Regex(const std::string& pattern, const std::string& where);
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  ~Regex();
  // All non-overlapping matches as byte ranges [start, end) (onig find_iter semantics).
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view s) const;

 private:
  void* code_ = nullptr;  // pcre2_code_8*
};
std::string regex_escape(std::string_view literal);

// A string-or-regex pattern, as tokenizer.json writes {"String": ...} / {"Regex": ...}.
class Pattern {
 public:
  Pattern(const json& j, const std::string& where);
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view s) const;
  std::string replace_all(std::string_view s, std::string_view content) const;

 private:
  std::string literal_;
  std::unique_ptr<Regex> regex_;
};

// ---- stages (normalizer.cpp, pre_tokenizer.cpp, decoder.cpp, post_processor.cpp) ----
class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& s) const = 0;
};
std::unique_ptr<Normalizer> make_normalizer(const json& j, const std::string& where);

// A split of the input during pre-tokenization. `at_start`: it begins at offset 0 of the
// original text (Metaspace prepend_scheme "first").
struct Piece {
  std::string text;
  bool at_start = false;
};
class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void pre_tokenize(std::vector<Piece>& pieces) const = 0;
};
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j, const std::string& where);

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};
std::unique_ptr<Decoder> make_decoder(const json& j, const std::string& where);

// Adds special tokens around the ids of a single sequence.
struct PostProcessor {
  std::vector<int32_t> prefix, suffix;
  bool adds_tokens() const { return !prefix.empty() || !suffix.empty(); }
  std::optional<int32_t> first_special;  // BOS candidate when no tokenizer_config names one
};
PostProcessor make_post_processor(const json& j, const std::string& where);

// GPT-2 byte <-> unicode mapping used by ByteLevel.
const std::string& byte_to_unicode(uint8_t b);  // UTF-8 of the mapped char
int unicode_to_byte(uint32_t cp);                // -1 when cp is not a mapped char

// ---- BPE model (bpe.cpp) ----
class Bpe {
 public:
  Bpe(const json& model, const std::string& where);
  void tokenize(std::string_view piece, std::vector<int32_t>& out) const;
  std::optional<int32_t> find(std::string_view token) const { return vocab_.find(token); }
  const std::vector<std::string>& id_to_token() const { return id_to_token_; }
  bool has_id(int32_t id) const { return id >= 0 && static_cast<size_t>(id) < has_id_.size() && has_id_[id]; }

 private:
  void merge_word(std::string_view w, std::vector<int32_t>& out) const;
  FlatStrIndex vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_;  // ids present in the vocab (the vocabulary may have holes)
  FlatPairMap merges_;
  std::optional<std::string> unk_token_;
  std::string prefix_, suffix_;  // continuing_subword_prefix / end_of_word_suffix
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  int32_t byte_ids_[256];  // <0xXX> ids for byte_fallback (-1 when absent)
  mutable std::mutex cache_mu_;
  mutable StrMap<std::vector<int32_t>> cache_;
};

// ---- added tokens (added_vocab.cpp) ----
struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool single_word = false, lstrip = false, rstrip = false, normalized = true, special = false;
};
struct Segment {
  size_t start, end;
  int32_t id;  // -1: ordinary text
};
class AddedMatcher {
 public:
  // `contents[i]` is matched as-is for token tokens[i].
  void build(const std::vector<const AddedToken*>& tokens, const std::vector<std::string>& contents);
  bool empty() const { return tokens_.empty(); }
  std::vector<Segment> split(std::string_view s) const;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> next;
    int32_t token = -1;  // index into tokens_
  };
  std::vector<Node> nodes_;
  std::vector<const AddedToken*> tokens_;
};

}  // namespace kvboost::tok

namespace kvboost {
struct Tokenizer::Impl {
  std::string source;
  std::vector<tok::AddedToken> added;  // in file order
  tok::StrMap<int32_t> added_by_content;
  std::unordered_map<int32_t, size_t> added_by_id;
  tok::AddedMatcher raw_matcher, normalized_matcher;
  std::unique_ptr<tok::Normalizer> normalizer;
  std::unique_ptr<tok::PreTokenizer> pre_tokenizer;
  std::unique_ptr<tok::Bpe> model;
  tok::PostProcessor post;
  std::unique_ptr<tok::Decoder> decoder;
  std::optional<int32_t> bos, eos;
  int32_t vocab_size = 0;

  void encode_text(std::string_view text, std::vector<int32_t>& out) const;
  std::string decode(const int32_t* ids, size_t n, bool skip_special) const;
  const std::string* token_of(int32_t id) const;
};
}  // namespace kvboost
