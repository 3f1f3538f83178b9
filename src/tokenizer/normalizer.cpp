// Normalizers: NFC/NFD/NFKC/NFKD (ICU), Lowercase, Strip, Prepend, Replace, Sequence.
#include <unicode/normalizer2.h>
#include <unicode/locid.h>
#include <unicode/unistr.h>

#include "internal.h"

namespace kvboost::tok {
namespace {

bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<uint8_t>(c) >= 0x80) return false;
  return true;
}

class UnicodeNorm : public Normalizer {
 public:
  UnicodeNorm(const std::string& form, const std::string& where) {
    UErrorCode st = U_ZERO_ERROR;
    if (form == "NFC") norm_ = icu::Normalizer2::getNFCInstance(st);
    else if (form == "NFD") norm_ = icu::Normalizer2::getNFDInstance(st);
    else if (form == "NFKC") norm_ = icu::Normalizer2::getNFKCInstance(st);
    else norm_ = icu::Normalizer2::getNFKDInstance(st);
    if (U_FAILURE(st)) fail(where, ": ICU cannot provide ", form, ": ", u_errorName(st));
  }
  void normalize(std::string& s) const override {
    if (is_ascii(s)) return;  // ASCII is invariant under all four forms
    UErrorCode st = U_ZERO_ERROR;
    icu::UnicodeString u = icu::UnicodeString::fromUTF8(s);
    if (norm_->isNormalized(u, st) && U_SUCCESS(st)) return;
    st = U_ZERO_ERROR;
    icu::UnicodeString r = norm_->normalize(u, st);
    if (U_FAILURE(st)) fail("Unicode normalization failed: ", u_errorName(st));
    s.clear();
    r.toUTF8String(s);
  }

 private:
  const icu::Normalizer2* norm_ = nullptr;
};

class Lowercase : public Normalizer {
 public:
  void normalize(std::string& s) const override {
    if (is_ascii(s)) {
      for (char& c : s)
        if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
      return;
    }
    icu::UnicodeString u = icu::UnicodeString::fromUTF8(s);
    u.toLower(icu::Locale::getRoot());
    s.clear();
    u.toUTF8String(s);
  }
};

class Strip : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& s) const override {
    size_t b = 0, e = s.size();
    if (left_) {
      while (b < e) {
        size_t k = b;
        if (!is_white_space(next_cp(s, k))) break;
        b = k;
      }
    }
    if (right_) {
      while (e > b) {
        size_t k = e;
        if (!is_white_space(prev_cp(s, k))) break;
        e = k;
      }
    }
    s = s.substr(b, e - b);
  }

 private:
  bool left_, right_;
};

class Prepend : public Normalizer {
 public:
  explicit Prepend(std::string p) : p_(std::move(p)) {}
  void normalize(std::string& s) const override {
    if (!s.empty()) s.insert(0, p_);
  }

 private:
  std::string p_;
};

class Replace : public Normalizer {
 public:
  Replace(const json& j, const std::string& where)
      : pattern_(j.at("pattern"), where), content_(j.at("content").get<std::string>()) {}
  void normalize(std::string& s) const override { s = pattern_.replace_all(s, content_); }

 private:
  Pattern pattern_;
  std::string content_;
};

class SequenceNorm : public Normalizer {
 public:
  std::vector<std::unique_ptr<Normalizer>> items;
  void normalize(std::string& s) const override {
    for (auto& n : items) n->normalize(s);
  }
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = json_type(j, where);
  try {
    if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD")
      return std::make_unique<UnicodeNorm>(type, where);
    if (type == "Lowercase") return std::make_unique<Lowercase>();
    if (type == "Strip")
      return std::make_unique<Strip>(j.value("strip_left", true), j.value("strip_right", true));
    if (type == "Prepend") return std::make_unique<Prepend>(j.at("prepend").get<std::string>());
    if (type == "Replace") return std::make_unique<Replace>(j, where);
    if (type == "Sequence") {
      auto seq = std::make_unique<SequenceNorm>();
      const json& items = j.at("normalizers");
      for (size_t i = 0; i < items.size(); ++i) {
        auto n = make_normalizer(items[i], where + ".normalizers[" + std::to_string(i) + "]");
        if (n) seq->items.push_back(std::move(n));
      }
      return seq;
    }
  } catch (const json::exception& e) {
    fail(where, " (", type, "): ", e.what());
  }
  fail(where, ": unsupported normalizer type '", type, "'");
}

}  // namespace kvboost::tok
