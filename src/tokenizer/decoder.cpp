// Decoders (tokenizers decoders/*): each transforms the list of token strings; the caller
// joins the result. ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence.
#include "internal.h"

namespace kvboost::tok {
namespace {

class ByteLevelDec : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const std::string& t : tokens) {
      size_t start = bytes.size();
      bool ok = true;
      for (size_t i = 0; i < t.size();) {
        int b = unicode_to_byte(next_cp(t, i));
        if (b < 0) { ok = false; break; }
        bytes += static_cast<char>(b);
      }
      if (!ok) {  // a token with a char outside the byte map contributes its raw UTF-8
        bytes.resize(start);
        bytes += t;
      }
    }
    tokens.assign(1, utf8_lossy(bytes));
  }
};

class ReplaceDec : public Decoder {
 public:
  ReplaceDec(const json& j, const std::string& where)
      : pattern_(j.at("pattern"), where), content_(j.at("content").get<std::string>()) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) t = pattern_.replace_all(t, content_);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

int hex_val(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class ByteFallbackDec : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string pending;
    const auto flush = [&] {
      if (pending.empty()) return;
      if (is_valid_utf8(pending)) out.push_back(pending);
      else
        for (size_t k = 0; k < pending.size(); ++k) out.push_back("\xEF\xBF\xBD");  // one per byte
      pending.clear();
    };
    for (auto& t : tokens) {
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && hex_val(t[3]) >= 0 &&
          hex_val(t[4]) >= 0) {
        pending += static_cast<char>(hex_val(t[3]) * 16 + hex_val(t[4]));
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens.swap(out);
  }
};

class FuseDec : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (auto& t : tokens) all += t;
    tokens.assign(1, all);
  }
};

class StripDec : public Decoder {
 public:
  StripDec(uint32_t content, size_t start, size_t stop) : content_(content), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) {
      std::vector<uint32_t> cps;
      for (size_t i = 0; i < t.size();) cps.push_back(next_cp(t, i));
      size_t b = 0, e = cps.size();
      for (size_t k = 0; k < start_ && k < cps.size() && cps[k] == content_; ++k) b = k + 1;
      for (size_t k = 0; k < stop_ && k < cps.size(); ++k) {
        size_t idx = cps.size() - k - 1;
        if (cps[idx] != content_) break;
        e = idx;
      }
      std::string r;
      for (size_t k = b; k < e; ++k) append_cp(r, cps[k]);
      t.swap(r);
    }
  }

 private:
  uint32_t content_;
  size_t start_, stop_;
};

class MetaspaceDec : public Decoder {
 public:
  MetaspaceDec(uint32_t rep, bool prepend) : rep_(rep), prepend_(prepend) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t k = 0; k < tokens.size(); ++k) {
      std::string r;
      const std::string& t = tokens[k];
      for (size_t i = 0; i < t.size();) {
        uint32_t cp = next_cp(t, i);
        if (cp == rep_) {
          if (!(k == 0 && prepend_)) r += ' ';  // HF drops every replacement char of token 0
        } else {
          append_cp(r, cp);
        }
      }
      tokens[k].swap(r);
    }
  }

 private:
  uint32_t rep_;
  bool prepend_;
};

class SequenceDec : public Decoder {
 public:
  std::vector<std::unique_ptr<Decoder>> items;
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& d : items) d->decode_chain(tokens);
  }
};

uint32_t first_cp(const std::string& s, uint32_t dflt) {
  size_t i = 0;
  return s.empty() ? dflt : next_cp(s, i);
}

}  // namespace

std::unique_ptr<Decoder> make_decoder(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = json_type(j, where);
  try {
    if (type == "ByteLevel") return std::make_unique<ByteLevelDec>();
    if (type == "Replace") return std::make_unique<ReplaceDec>(j, where);
    if (type == "ByteFallback") return std::make_unique<ByteFallbackDec>();
    if (type == "Fuse") return std::make_unique<FuseDec>();
    if (type == "Strip")
      return std::make_unique<StripDec>(first_cp(j.at("content").get<std::string>(), ' '),
                                        j.value("start", size_t{0}), j.value("stop", size_t{0}));
    if (type == "Metaspace") {
      uint32_t rep = first_cp(j.value("replacement", std::string("\xE2\x96\x81")), 0x2581);
      bool prepend = j.contains("prepend_scheme") && j["prepend_scheme"].is_string()
                         ? j["prepend_scheme"].get<std::string>() != "never"
                         : j.value("add_prefix_space", true);
      return std::make_unique<MetaspaceDec>(rep, prepend);
    }
    if (type == "Sequence") {
      auto seq = std::make_unique<SequenceDec>();
      const json& items = j.at("decoders");
      for (size_t i = 0; i < items.size(); ++i) {
        auto d = make_decoder(items[i], where + ".decoders[" + std::to_string(i) + "]");
        if (d) seq->items.push_back(std::move(d));
      }
      return seq;
    }
  } catch (const json::exception& e) {
    fail(where, " (", type, "): ", e.what());
  }
  fail(where, ": unsupported decoder type '", type, "'");
}

}  // namespace kvboost::tok
