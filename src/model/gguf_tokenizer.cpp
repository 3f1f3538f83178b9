// The tokenizer stored inside a GGUF file (tokenizer.ggml.*, as llama.cpp's convert_hf_to_gguf.py
// writes it), rewritten as the tokenizer.json + tokenizer_config.json that Hugging Face would
// use for the same vocabulary, so that Tokenizer::from_json has one encode/decode path.
//
// Token types (llama.cpp LLAMA_TOKEN_TYPE_*): 1 normal, 2 unknown, 3 control, 4 user-defined,
// 5 unused, 6 byte. Control/unknown tokens become special added tokens, user-defined ones plain
// added tokens, both matched on the raw text (llama.cpp: "pre-normalized"); unused tokens
// (the converter's "[PAD<i>]" fillers) are left out, so they decode to nothing, as in llama.cpp.
//
// "gpt2" is byte-level BPE with the merges list; tokenizer.ggml.pre names the split regex.
// "llama" is SentencePiece BPE, which llama.cpp runs from scores alone: repeatedly merge the
// adjacent pair whose concatenation is the highest-scoring token (ties: leftmost). The merges
// list is derived from the scores exactly as transformers' convert_slow_tokenizer
// generate_merges (4.49) derives it from tokenizer.model, so we tokenize as the HF tokenizer of
// the same model; where distinct tokens have distinct scores (SentencePiece BPE models: score =
// -merge order) that is also llama.cpp's result. Among tokens of equal score llama.cpp takes the
// leftmost pair, HF the merge listed first (converters that write one placeholder score for
// every token, e.g. gguf's LlamaHfVocab, make that case matter).
#include <algorithm>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "gguf.h"
#include "kvboost/model.h"

namespace kvboost {

// Plain json (std::map objects): ordered_json inserts by linear search (quadratic on 150k tokens).
using json = nlohmann::json;

namespace {

enum TokenType : int64_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

// Split regexes, as the Hugging Face tokenizer.json of each family writes them.
constexpr const char* kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

const char* const kSpace = "\xe2\x96\x81";  // U+2581, SentencePiece's space

size_t n_chars(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

enum class Elems { Strings, Ints, Numbers };

// The array at `key` (nullptr when absent and not required), of at least `min_size` entries.
const gguf::Value* array_of(const gguf::File& f, const std::string& key, Elems want, bool required, size_t min_size) {
  const gguf::Value* v = f.find(key);
  if (!v) {
    if (required) fail(f.path(), ": metadata \"", key, "\" is missing (the tokenizer stored in the GGUF needs it)");
    return nullptr;
  }
  const bool is_array = v->type == gguf::ValueType::ARRAY;
  const bool is_str = v->elem_type == gguf::ValueType::STRING;
  const bool is_float = v->elem_type == gguf::ValueType::F32 || v->elem_type == gguf::ValueType::F64;
  const bool ok = is_array && (want == Elems::Strings ? is_str : want == Elems::Ints ? !is_str && !is_float : !is_str);
  if (!ok)
    fail(f.path(), ": metadata \"", key, "\" is a ", gguf::value_type_name(v->type),
         is_array ? std::string(" of ") + gguf::value_type_name(v->elem_type) : std::string(), ", expected an array of ",
         want == Elems::Strings ? "strings" : want == Elems::Ints ? "integers" : "numbers");
  if (v->array_size() < min_size)
    fail(f.path(), ": metadata \"", key, "\" has ", v->array_size(), " entries but tokenizer.ggml.tokens has ", min_size);
  return v;
}

bool get_bool(const gguf::File& f, const std::string& key, bool dflt) {
  const gguf::Value* v = f.find(key);
  if (!v) return dflt;
  if (v->type != gguf::ValueType::BOOL) fail(f.path(), ": metadata \"", key, "\" is not a bool");
  return v->i != 0;
}

// tokenizer.ggml.<what>_token_id when present and naming a token; else `dflt` when that does.
std::optional<int32_t> special_id(const gguf::File& f, const char* what, std::optional<int32_t> dflt,
                                  const std::vector<std::string>& tokens, const std::vector<int64_t>& types) {
  const std::string key = std::string("tokenizer.ggml.") + what + "_token_id";
  std::optional<int32_t> id = dflt;
  if (f.find(key)) {
    const int64_t v = f.get_int(key);
    if (v < 0 || v >= int64_t(tokens.size()))
      fail(f.path(), ": metadata \"", key, "\" = ", v, " is outside the vocabulary [0, ", tokens.size(), ")");
    id = int32_t(v);
  }
  if (id && (*id < 0 || *id >= int32_t(tokens.size()) || types[*id] == kUnused)) return std::nullopt;
  return id;
}

// transformers' generate_merges(vocab, vocab_scores): every split of every token into two
// vocabulary pieces, ordered by the token's score (highest first), then by longer left piece,
// longer right piece, then token id and the pieces' ids.
json merges_from_scores(const std::vector<std::string>& tokens, const std::vector<double>& scores,
                         const std::vector<bool>& in_vocab) {
  std::unordered_map<std::string_view, int32_t> vocab;
  vocab.reserve(tokens.size() * 2);
  for (size_t i = 0; i < tokens.size(); ++i)
    if (in_vocab[i]) vocab.emplace(tokens[i], int32_t(i));  // no duplicates: checked by the caller
  struct M {
    int32_t l, r;  // ids of the pieces
    double score;
    uint32_t len_l, len_r;
  };
  std::vector<M> merges;
  std::vector<M> local;
  for (size_t t = 0; t < tokens.size(); ++t) {
    if (!in_vocab[t]) continue;
    const std::string& s = tokens[t];
    local.clear();
    for (size_t k = 1; k < s.size(); ++k) {
      if ((static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) continue;  // split only between characters
      auto l = vocab.find(std::string_view(s).substr(0, k));
      if (l == vocab.end()) continue;
      auto r = vocab.find(std::string_view(s).substr(k));
      if (r == vocab.end()) continue;
      local.push_back({l->second, r->second, scores[t], 0, 0});
    }
    std::sort(local.begin(), local.end(), [](const M& a, const M& b) { return a.l != b.l ? a.l < b.l : a.r < b.r; });
    for (M& m : local) {
      m.len_l = uint32_t(n_chars(tokens[m.l]));
      m.len_r = uint32_t(n_chars(tokens[m.r]));
      merges.push_back(m);
    }
  }
  std::stable_sort(merges.begin(), merges.end(), [](const M& a, const M& b) {
    if (a.score != b.score) return a.score > b.score;
    if (a.len_l != b.len_l) return a.len_l > b.len_l;
    return a.len_r > b.len_r;
  });
  json out = json::array();
  for (const M& m : merges) out.push_back(json::array({tokens[m.l], tokens[m.r]}));
  return out;
}

json split_then_bytelevel(const char* regex, bool trim_offsets) {
  return {{"type", "Sequence"},
          {"pretokenizers",
           json::array({{{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}},
                         {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", trim_offsets},
                          {"use_regex", false}}})}};
}

}  // namespace

GgufTokenizerFiles gguf_tokenizer_files(const std::string& gguf_path) {
  gguf::File f(gguf_path);
  const std::string& path = f.path();
  const std::string model = f.get_string("tokenizer.ggml.model", "");
  if (model.empty())
    fail(path, ": metadata \"tokenizer.ggml.model\" is missing: the GGUF holds no tokenizer (put tokenizer.json beside it)");
  if (model != "gpt2" && model != "llama")
    fail(path, ": metadata \"tokenizer.ggml.model\" = \"", model,
         "\" is not supported (gpt2 = byte-level BPE, llama = SentencePiece BPE)");
  const bool spm = model == "llama";

  const std::vector<std::string>& tokens =
      array_of(f, "tokenizer.ggml.tokens", Elems::Strings, true, 0)->strings;
  if (tokens.empty()) fail(path, ": metadata \"tokenizer.ggml.tokens\" is empty");
  const size_t n = tokens.size();
  std::vector<int64_t> types(n, kNormal);
  if (const gguf::Value* v = array_of(f, "tokenizer.ggml.token_type", Elems::Ints, false, n))
    std::copy(v->ints.begin(), v->ints.begin() + std::ptrdiff_t(n), types.begin());
  std::vector<double> scores(n, 0.0);
  if (const gguf::Value* v = array_of(f, "tokenizer.ggml.scores", Elems::Numbers, false, n)) {
    for (size_t i = 0; i < n; ++i) scores[i] = v->floats.empty() ? double(v->ints[i]) : v->floats[i];
  }

  // model.vocab: every token but unused ones (SentencePiece: control and user-defined pieces
  // too, as HF's conversion keeps them); byte-level BPE: only the merge vocabulary.
  std::vector<bool> in_vocab(n);
  for (size_t i = 0; i < n; ++i)
    in_vocab[i] = spm ? types[i] != kUnused
                      : types[i] != kUnused && types[i] != kControl && types[i] != kUserDefined && types[i] != kUnknown;
  {
    std::unordered_map<std::string_view, size_t> seen;
    seen.reserve(n * 2);
    for (size_t i = 0; i < n; ++i) {
      if (types[i] == kUnused) continue;
      if (tokens[i].empty()) fail(path, ": tokenizer.ggml.tokens[", i, "] is empty");
      auto [it, fresh] = seen.emplace(tokens[i], i);
      if (!fresh) fail(path, ": tokenizer.ggml.tokens has \"", tokens[i], "\" twice (ids ", it->second, " and ", i, ")");
    }
  }

  json tj;
  tj["version"] = "1.0";
  json added = json::array();
  for (size_t i = 0; i < n; ++i) {
    if (types[i] != kControl && types[i] != kUserDefined && types[i] != kUnknown) continue;
    added.push_back({{"id", i}, {"content", tokens[i]}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", false}, {"special", types[i] != kUserDefined}});
  }
  tj["added_tokens"] = std::move(added);

  json bpe;
  bpe["type"] = "BPE";
  bpe["dropout"] = nullptr;
  std::optional<int32_t> unk = special_id(f, "unknown", spm ? std::optional<int32_t>(0) : std::nullopt, tokens, types);
  bpe["unk_token"] = unk && spm ? json(tokens[*unk]) : json(nullptr);
  bpe["continuing_subword_prefix"] = nullptr;
  bpe["end_of_word_suffix"] = nullptr;
  bpe["fuse_unk"] = spm;
  bpe["byte_fallback"] = spm;
  bool add_bos = spm;  // llama.cpp's defaults, unless the file says otherwise
  if (spm) {
    // llama.cpp prepends a space to text at the start or after a special token and maps spaces
    // to U+2581: HF's legacy Llama normalizer does the same per segment.
    const bool prefix = get_bool(f, "tokenizer.ggml.add_space_prefix", true);
    json replace = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSpace}};
    tj["normalizer"] = prefix ? json{{"type", "Sequence"},
                                      {"normalizers", json::array({{{"type", "Prepend"}, {"prepend", kSpace}}, replace})}}
                              : replace;
    tj["pre_tokenizer"] = nullptr;
    json decoders = json::array({{{"type", "Replace"}, {"pattern", {{"String", kSpace}}}, {"content", " "}},
                                   {{"type", "ByteFallback"}},
                                   {{"type", "Fuse"}}});
    if (prefix) decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
    tj["decoder"] = {{"type", "Sequence"}, {"decoders", std::move(decoders)}};
    bpe["ignore_merges"] = false;
  } else {
    const gguf::Value* merges = array_of(f, "tokenizer.ggml.merges", Elems::Strings, true, 0);
    const std::string pre = f.get_string("tokenizer.ggml.pre", "default");
    bool ignore_merges = false;
    if (pre == "qwen2" || pre == "deepseek-r1-qwen") {
      // Qwen2's tokenizer.json normalizes to NFC first (llama.cpp skips this; the two differ
      // only on text that is not already NFC).
      tj["normalizer"] = {{"type", "NFC"}};
      tj["pre_tokenizer"] = split_then_bytelevel(kQwen2Regex, false);
    } else if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3") {
      tj["normalizer"] = nullptr;
      tj["pre_tokenizer"] = split_then_bytelevel(kLlama3Regex, true);
      ignore_merges = true;
      add_bos = true;
    } else if (pre == "gpt-2" || pre == "default") {
      // "default" is what llama.cpp assumes for files written before tokenizer.ggml.pre existed;
      // GPT-2's regex is the byte-level pre-tokenizer those files were made with.
      tj["normalizer"] = nullptr;
      tj["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
    } else {
      fail(path, ": metadata \"tokenizer.ggml.pre\" = \"", pre,
           "\" is not a supported pre-tokenizer (qwen2, deepseek-r1-qwen, llama-bpe, llama3, llama-v3, gpt-2, default)");
    }
    tj["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
    bpe["ignore_merges"] = ignore_merges;
    bpe["merges"] = merges->strings;
  }
  tj["post_processor"] = nullptr;
  json vocab = json::object();
  for (size_t i = 0; i < n; ++i)
    if (in_vocab[i]) vocab[tokens[i]] = i;
  bpe["vocab"] = std::move(vocab);
  if (spm) bpe["merges"] = merges_from_scores(tokens, scores, in_vocab);
  tj["model"] = std::move(bpe);

  // BOS/EOS as tokenizer_config.json names them (llama.cpp's defaults for SentencePiece: 1, 2).
  json cfg;
  add_bos = get_bool(f, "tokenizer.ggml.add_bos_token", add_bos);
  const bool add_eos = get_bool(f, "tokenizer.ggml.add_eos_token", false);
  const auto bos = special_id(f, "bos", spm ? std::optional<int32_t>(1) : std::nullopt, tokens, types);
  const auto eos = special_id(f, "eos", spm ? std::optional<int32_t>(2) : std::nullopt, tokens, types);
  if (add_bos && !bos) fail(path, ": tokenizer.ggml.add_bos_token is true but tokenizer.ggml.bos_token_id names no token");
  if (add_eos && !eos) fail(path, ": tokenizer.ggml.add_eos_token is true but tokenizer.ggml.eos_token_id names no token");
  cfg["add_bos_token"] = add_bos;
  cfg["add_eos_token"] = add_eos;
  cfg["bos_token"] = bos ? json(tokens[*bos]) : json(nullptr);
  cfg["eos_token"] = eos ? json(tokens[*eos]) : json(nullptr);
  if (unk) cfg["unk_token"] = tokens[*unk];
  if (const auto pad = special_id(f, "padding", std::nullopt, tokens, types)) cfg["pad_token"] = tokens[*pad];
  if (const gguf::Value* t = f.find("tokenizer.chat_template")) {
    if (t->type != gguf::ValueType::STRING) fail(path, ": metadata \"tokenizer.chat_template\" is not a string");
    cfg["chat_template"] = t->s;
  }

  GgufTokenizerFiles out;
  try {
    out.tokenizer_json = tj.dump();
    out.tokenizer_config_json = cfg.dump();
  } catch (const json::exception& e) {
    fail(path, ": the tokenizer metadata holds text that is not valid UTF-8 (", e.what(), ")");
  }
  return out;
}

}  // namespace kvboost
