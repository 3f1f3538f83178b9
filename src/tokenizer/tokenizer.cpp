// Tokenizer: loading tokenizer.json (+ tokenizer_config.json) and the encode/decode pipeline.
#include "kvboost/tokenizer.h"

#include "internal.h"

namespace kvboost {

using tok::json;

namespace {

json parse_json(const std::string& text, const std::string& source) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail(source, ": malformed JSON: ", e.what());
  }
}

// tokenizer_config.json names a token either as a string or as {"content": ...}.
std::optional<std::string> config_token(const json& cfg, const char* key) {
  if (!cfg.contains(key)) return std::nullopt;
  const json& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return std::nullopt;
}

bool is_llama_class(const std::string& cls) {
  for (const char* c : {"LlamaTokenizer", "LlamaTokenizerFast", "CodeLlamaTokenizer", "CodeLlamaTokenizerFast",
                        "GemmaTokenizer", "GemmaTokenizerFast"})
    if (cls == c) return true;
  return false;
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_dir(const std::string& dir) {
  const std::string path = path_join(dir, "tokenizer.json");
  if (!file_exists(path)) fail("tokenizer file not found: ", path);
  const std::string cfg_path = path_join(dir, "tokenizer_config.json");
  std::string cfg = file_exists(cfg_path) ? read_file(cfg_path) : std::string();
  return from_json(read_file(path), cfg, path);
}

Tokenizer Tokenizer::from_json(const std::string& tokenizer_json, const std::string& tokenizer_config_json,
                               const std::string& source) try {
  auto impl = std::make_unique<Impl>();
  impl->source = source;
  const json j = parse_json(tokenizer_json, source);
  if (!j.is_object()) fail(source, ": top level is not a JSON object");
  if (!j.contains("model") || !j["model"].is_object()) fail(source, ": field 'model' is missing");
  const auto field = [&](const char* k) -> const json& {
    static const json null_json;
    return j.contains(k) ? j[k] : null_json;
  };

  impl->model = std::make_unique<tok::Bpe>(j["model"], source + ": model");
  impl->normalizer = tok::make_normalizer(field("normalizer"), source + ": normalizer");
  impl->pre_tokenizer = tok::make_pre_tokenizer(field("pre_tokenizer"), source + ": pre_tokenizer");
  impl->decoder = tok::make_decoder(field("decoder"), source + ": decoder");
  impl->post = tok::make_post_processor(field("post_processor"), source + ": post_processor");

  int32_t max_id = static_cast<int32_t>(impl->model->id_to_token().size()) - 1;
  const json& added = field("added_tokens");
  if (!added.is_null() && !added.is_array()) fail(source, ": added_tokens is not an array");
  for (size_t i = 0; i < added.size(); ++i) {
    const json& a = added[i];
    try {
      tok::AddedToken t;
      const int64_t id64 = tok::json_id(a.at("id"), source + ": added_tokens[" + std::to_string(i) + "]");
      if (id64 < 0 || id64 >= max_id + 1 + int64_t(added.size()) + 65536 || id64 >= (int64_t(1) << 24))
        fail(source, ": added_tokens[", i, "]: id ", id64, " is out of range (vocabulary of ", max_id + 1, " ids)");
      t.id = int32_t(id64);
      t.content = a.at("content").get<std::string>();
      t.special = a.value("special", false);
      t.single_word = a.value("single_word", false);
      t.lstrip = a.value("lstrip", false);
      t.rstrip = a.value("rstrip", false);
      t.normalized = a.value("normalized", !t.special);
      max_id = std::max(max_id, t.id);
      impl->added_by_content[t.content] = t.id;
      impl->added_by_id[t.id] = impl->added.size();
      impl->added.push_back(std::move(t));
    } catch (const json::exception& e) {
      fail(source, ": added_tokens[", i, "]: ", e.what());
    }
  }
  impl->vocab_size = max_id + 1;
  {
    std::vector<const tok::AddedToken*> raw, norm;
    std::vector<std::string> raw_c, norm_c;
    for (const auto& t : impl->added) {
      if (t.normalized && impl->normalizer) {
        std::string c = t.content;
        impl->normalizer->normalize(c);
        norm.push_back(&t);
        norm_c.push_back(c);
      } else {
        raw.push_back(&t);
        raw_c.push_back(t.content);
      }
    }
    impl->raw_matcher.build(raw, raw_c);
    impl->normalized_matcher.build(norm, norm_c);
  }

  Tokenizer tk(std::move(impl));
  Impl& m = *tk.impl_;
  if (!tokenizer_config_json.empty()) {
    const std::string cfg_source = "tokenizer_config.json (for " + source + ")";
    const json cfg = parse_json(tokenizer_config_json, cfg_source);
    if (!cfg.is_object()) fail(cfg_source, ": top level is not a JSON object");
    if (auto b = config_token(cfg, "bos_token")) m.bos = tk.token_to_id(*b);
    if (auto e = config_token(cfg, "eos_token")) m.eos = tk.token_to_id(*e);
    const std::string cls =
        cfg.contains("tokenizer_class") && cfg["tokenizer_class"].is_string() ? cfg["tokenizer_class"].get<std::string>() : "";
    const bool llama = is_llama_class(cls);
    const bool has_flags = cfg.contains("add_bos_token") || cfg.contains("add_eos_token");
    // transformers' LlamaTokenizerFast rebuilds the post-processor from these flags; other
    // classes only get them when tokenizer.json adds no special tokens itself.
    if (llama || (has_flags && !m.post.adds_tokens())) {
      const auto flag = [&](const char* k, bool dflt) {
        return cfg.contains(k) && cfg[k].is_boolean() ? cfg[k].get<bool>() : dflt;
      };
      const bool add_bos = flag("add_bos_token", llama), add_eos = flag("add_eos_token", false);
      if (add_bos && !m.bos) fail(cfg_source, ": add_bos_token is true but bos_token is not in the vocabulary");
      if (add_eos && !m.eos) fail(cfg_source, ": add_eos_token is true but eos_token is not in the vocabulary");
      m.post.prefix.clear();
      m.post.suffix.clear();
      if (add_bos) m.post.prefix.push_back(*m.bos);
      if (add_eos) m.post.suffix.push_back(*m.eos);
    }
  }
  if (!m.bos) m.bos = m.post.first_special;
  return tk;
} catch (const json::exception& e) {
  // A backstop: a field of the wrong JSON type that no check above named still becomes an Error
  // naming the file, never a json::type_error escaping to the caller.
  fail(source, ": ", e.what());
}

void Tokenizer::Impl::encode_text(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<tok::Segment> segs =
      raw_matcher.empty() ? std::vector<tok::Segment>{{0, text.size(), -1}} : raw_matcher.split(text);
  std::vector<tok::Piece> pieces;
  for (const tok::Segment& seg : segs) {
    if (seg.id >= 0) {
      out.push_back(seg.id);
      continue;
    }
    std::string s(text.substr(seg.start, seg.end - seg.start));
    if (normalizer) normalizer->normalize(s);
    if (s.empty()) continue;
    std::vector<tok::Segment> segs2 = normalized_matcher.empty()
                                          ? std::vector<tok::Segment>{{0, s.size(), -1}}
                                          : normalized_matcher.split(s);
    for (const tok::Segment& sub : segs2) {
      if (sub.id >= 0) {
        out.push_back(sub.id);
        continue;
      }
      pieces.clear();
      pieces.push_back({s.substr(sub.start, sub.end - sub.start), seg.start == 0 && sub.start == 0});
      if (pre_tokenizer) pre_tokenizer->pre_tokenize(pieces);
      for (const tok::Piece& p : pieces) model->tokenize(p.text, out);
    }
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special) const {
  tok::validate_utf8(text);
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_special) out = impl_->post.prefix;
  impl_->encode_text(text, out);
  if (add_special) out.insert(out.end(), impl_->post.suffix.begin(), impl_->post.suffix.end());
  return out;
}

const std::string* Tokenizer::Impl::token_of(int32_t id) const {
  auto it = added_by_id.find(id);
  if (it != added_by_id.end()) return &added[it->second].content;
  return model->has_id(id) ? &model->id_to_token()[id] : nullptr;
}

std::string Tokenizer::Impl::decode(const int32_t* ids, size_t n, bool skip_special) const {
  std::vector<std::string> tokens;
  tokens.reserve(n);
  for (size_t k = 0; k < n; ++k) {
    const std::string* t = token_of(ids[k]);
    if (!t) continue;  // unknown ids are dropped, as HF does
    if (skip_special) {
      auto a = added_by_content.find(*t);
      if (a != added_by_content.end() && added[added_by_id.at(a->second)].special) continue;
    }
    tokens.push_back(*t);
  }
  if (!decoder) {
    std::string r;
    for (size_t k = 0; k < tokens.size(); ++k) r += (k ? " " : "") + tokens[k];
    return r;
  }
  decoder->decode_chain(tokens);
  std::string r;
  for (auto& t : tokens) r += t;
  return r;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  return impl_->decode(ids.data(), ids.size(), skip_special);
}

int32_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  auto a = impl_->added_by_content.find(token);
  if (a != impl_->added_by_content.end()) return a->second;
  return impl_->model->find(token);
}

std::string Tokenizer::id_to_token(int32_t id) const {
  const std::string* t = impl_->token_of(id);
  return t ? *t : std::string();
}

bool Tokenizer::is_special(int32_t id) const {
  auto it = impl_->added_by_id.find(id);
  return it != impl_->added_by_id.end() && impl_->added[it->second].special;
}

std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }

}  // namespace kvboost
