// Pre-tokenizers: ByteLevel, Split, Metaspace, Sequence (tokenizers 0.21 semantics).
#include "internal.h"

namespace kvboost::tok {
namespace {

// GPT-2's split pattern, used by ByteLevel when use_regex is true.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

Behavior parse_behavior(const std::string& b, const std::string& where) {
  if (b == "Removed") return Behavior::Removed;
  if (b == "Isolated") return Behavior::Isolated;
  if (b == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::MergedWithNext;
  if (b == "Contiguous") return Behavior::Contiguous;
  fail(where, ": unsupported split behavior '", b, "'");
}

struct Span {
  size_t b, e;
  bool is_match;
};

// Splits `s` given the pattern matches, as tokenizers' NormalizedString::split does.
std::vector<std::pair<size_t, size_t>> split_by(std::string_view s,
                                                const std::vector<std::pair<size_t, size_t>>& matches,
                                                Behavior behavior, bool invert) {
  std::vector<Span> spans;
  if (s.empty()) {
    spans.push_back({0, 0, false});
  } else {
    size_t prev = 0;
    for (auto [b, e] : matches) {
      if (prev != b) spans.push_back({prev, b, false});
      spans.push_back({b, e, true});
      prev = e;
    }
    if (prev != s.size()) spans.push_back({prev, s.size(), false});
  }
  if (invert)
    for (auto& sp : spans) sp.is_match = !sp.is_match;

  std::vector<Span> out;
  switch (behavior) {
    case Behavior::Isolated:
      out = spans;
      break;
    case Behavior::Removed:
      for (auto& sp : spans)
        if (!sp.is_match) out.push_back(sp);
      break;
    case Behavior::MergedWithPrevious: {
      bool prev_match = false;
      for (auto& sp : spans) {
        if (sp.is_match && !prev_match && !out.empty()) out.back().e = sp.e;
        else out.push_back({sp.b, sp.e, false});
        prev_match = sp.is_match;
      }
      break;
    }
    case Behavior::MergedWithNext: {
      bool prev_match = false;
      for (size_t k = spans.size(); k-- > 0;) {
        auto& sp = spans[k];
        if (sp.is_match && !prev_match && !out.empty()) out.back().b = sp.b;
        else out.push_back({sp.b, sp.e, false});
        prev_match = sp.is_match;
      }
      std::reverse(out.begin(), out.end());
      break;
    }
    case Behavior::Contiguous: {
      bool prev_match = false;
      for (auto& sp : spans) {
        if (sp.is_match == prev_match && !out.empty()) out.back().e = sp.e;
        else out.push_back({sp.b, sp.e, false});
        prev_match = sp.is_match;
      }
      break;
    }
  }
  std::vector<std::pair<size_t, size_t>> r;
  for (auto& sp : out)
    if (sp.e > sp.b) r.emplace_back(sp.b, sp.e);  // empty splits are dropped
  return r;
}

void apply_split(std::vector<Piece>& pieces, const std::function<std::vector<std::pair<size_t, size_t>>(
                                                  const std::string&)>& fn) {
  std::vector<Piece> out;
  out.reserve(pieces.size() * 4);
  for (auto& p : pieces) {
    for (auto [b, e] : fn(p.text)) out.push_back({p.text.substr(b, e - b), p.at_start && b == 0});
  }
  pieces.swap(out);
}

class ByteLevel : public PreTokenizer {
 public:
  ByteLevel(bool add_prefix_space, bool use_regex) : add_prefix_space_(add_prefix_space) {
    if (use_regex) re_ = std::make_unique<Regex>(kGpt2Pattern, "ByteLevel");
  }
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    if (add_prefix_space_)
      for (auto& p : pieces)
        if (p.text.empty() || p.text[0] != ' ') p.text = " " + p.text;
    if (re_)
      apply_split(pieces, [&](const std::string& s) {
        return split_by(s, re_->find_all(s), Behavior::Isolated, false);
      });
    for (auto& p : pieces) {
      std::string m;
      m.reserve(p.text.size() * 2);
      for (char c : p.text) m += byte_to_unicode(static_cast<uint8_t>(c));
      p.text.swap(m);
    }
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> re_;
};

class Split : public PreTokenizer {
 public:
  Split(const json& j, const std::string& where)
      : pattern_(j.at("pattern"), where),
        behavior_(parse_behavior(j.at("behavior").get<std::string>(), where)),
        invert_(j.value("invert", false)) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    apply_split(pieces, [&](const std::string& s) {
      return split_by(s, pattern_.find_all(s), behavior_, invert_);
    });
  }

 private:
  Pattern pattern_;
  Behavior behavior_;
  bool invert_;
};

class Metaspace : public PreTokenizer {
 public:
  Metaspace(const json& j, const std::string& where) {
    uint32_t cp = 0x2581;
    if (j.contains("replacement") && j["replacement"].is_string()) {
      std::string r = j["replacement"].get<std::string>();
      size_t i = 0;
      if (!r.empty()) cp = next_cp(r, i);
    }
    append_cp(rep_, cp);
    if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string()) {
      scheme_ = j["prepend_scheme"].get<std::string>();
    } else {
      scheme_ = j.value("add_prefix_space", true) ? "always" : "never";
    }
    if (scheme_ != "always" && scheme_ != "first" && scheme_ != "never")
      fail(where, ": unsupported Metaspace prepend_scheme '", scheme_, "'");
    split_ = j.value("split", true);
  }
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (auto& p : pieces) {
      std::string t;
      for (char c : p.text) {
        if (c == ' ') t += rep_;
        else t += c;
      }
      bool starts = t.compare(0, rep_.size(), rep_) == 0;
      if (!starts && (scheme_ == "always" || (scheme_ == "first" && p.at_start))) t.insert(0, rep_);
      p.text.swap(t);
    }
    if (split_)
      apply_split(pieces, [&](const std::string& s) {
        std::vector<std::pair<size_t, size_t>> m;
        for (size_t pos = 0; (pos = s.find(rep_, pos)) != std::string::npos; pos += rep_.size())
          m.emplace_back(pos, pos + rep_.size());
        return split_by(s, m, Behavior::MergedWithNext, false);
      });
  }

 private:
  std::string rep_, scheme_;
  bool split_ = true;
};

class SequencePre : public PreTokenizer {
 public:
  std::vector<std::unique_ptr<PreTokenizer>> items;
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (auto& p : items) p->pre_tokenize(pieces);
  }
};

}  // namespace

const std::string& byte_to_unicode(uint8_t b) {
  static const auto table = [] {
    std::vector<std::string> t(256);
    int n = 0;
    for (int c = 0; c < 256; ++c) {
      bool keep = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
      std::string s;
      append_cp(s, keep ? static_cast<uint32_t>(c) : static_cast<uint32_t>(256 + n++));
      t[c] = s;
    }
    return t;
  }();
  return table[b];
}

int unicode_to_byte(uint32_t cp) {
  static const auto inv = [] {
    std::vector<int> v(512, -1);
    for (int b = 0; b < 256; ++b) {
      const std::string& s = byte_to_unicode(static_cast<uint8_t>(b));
      size_t i = 0;
      v[next_cp(s, i)] = b;
    }
    return v;
  }();
  return cp < inv.size() ? inv[cp] : -1;
}

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = json_type(j, where);
  try {
    if (type == "ByteLevel")
      return std::make_unique<ByteLevel>(j.value("add_prefix_space", true), j.value("use_regex", true));
    if (type == "Split") return std::make_unique<Split>(j, where);
    if (type == "Metaspace") return std::make_unique<Metaspace>(j, where);
    if (type == "Sequence") {
      auto seq = std::make_unique<SequencePre>();
      const json& items = j.at("pretokenizers");
      for (size_t i = 0; i < items.size(); ++i) {
        auto p = make_pre_tokenizer(items[i], where + ".pretokenizers[" + std::to_string(i) + "]");
        if (p) seq->items.push_back(std::move(p));
      }
      return seq;
    }
  } catch (const json::exception& e) {
    fail(where, " (", type, "): ", e.what());
  }
  fail(where, ": unsupported pre_tokenizer type '", type, "'");
}

}  // namespace kvboost::tok
