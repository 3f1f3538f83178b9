// Regular expressions as GBNF expressions (guided_regex, JSON Schema `pattern`). A recursive
// descent over the common subset; anything else (backreferences, lookaround, lazy/possessive
// semantics that change the language, inline flags) is an UnsupportedFeature naming it.
// In JSON-string mode the language is intersected with unescaped JSON string characters, and
// literal quotes/backslashes/controls are written as their JSON escapes.
#include <algorithm>

#include "kvboost/grammar.h"

namespace kvboost::grammar {
namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

Ranges normalize(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (const auto& x : r) {
    if (!out.empty() && x.first <= out.back().second + 1) out.back().second = std::max(out.back().second, x.second);
    else out.push_back(x);
  }
  return out;
}
Ranges complement(const Ranges& r) {
  Ranges n = normalize(r), out;
  uint32_t at = 0;
  for (const auto& x : n) {
    if (x.first > at) out.emplace_back(at, x.first - 1);
    at = x.second + 1;
  }
  if (at <= 0x10FFFF) out.emplace_back(at, 0x10FFFF);
  return out;
}
Ranges subtract(const Ranges& a, const Ranges& b) {
  // a ∩ complement(b)
  const Ranges cb = complement(b);
  Ranges out;
  for (const auto& x : normalize(a))
    for (const auto& y : cb) {
      const uint32_t lo = std::max(x.first, y.first), hi = std::min(x.second, y.second);
      if (lo <= hi) out.emplace_back(lo, hi);
    }
  return out;
}

std::string cls_cp(uint32_t cp) {
  char buf[16];
  if (cp < 0x80 && std::isalnum(int(cp))) return std::string(1, char(cp));
  std::snprintf(buf, sizeof buf, cp <= 0xFFFF ? "\\u%04X" : "\\U%08X", cp);
  return buf;
}

std::string class_text(const Ranges& r) {
  if (r.empty()) return "";
  std::string out = "[";
  for (const auto& [lo, hi] : r) {
    out += cls_cp(lo);
    if (hi != lo) out += "-" + cls_cp(hi);
  }
  return out + "]";
}

class RegexConv {
 public:
  RegexConv(std::string_view re, bool json) : s_(re), json_(json) {}

  std::string run() {
    bool anchored_start = false, anchored_end = false;
    if (!s_.empty() && s_[0] == '^') {
      anchored_start = true;
      ++i_;
    }
    if (s_.size() > i_ && s_.back() == '$' && !(s_.size() >= 2 && s_[s_.size() - 2] == '\\')) {
      anchored_end = true;
      end_ = s_.size() - 1;
    } else {
      end_ = s_.size();
    }
    std::string e = alt();
    if (i_ < end_) error("unexpected ')' at offset " + std::to_string(i_), "regex syntax");
    if (json_) {
      // JSON Schema patterns search: unanchored ends take any other characters.
      const std::string any = class_text(json_safe({{0, 0x10FFFF}})) + "*";
      if (!anchored_start) e = any + " " + e;
      if (!anchored_end) e = e + " " + any;
    }
    return e.empty() ? "\"\"" : e;
  }

 private:
  std::string_view s_;
  bool json_;
  size_t i_ = 0, end_ = 0;

  [[noreturn]] void error(const std::string& msg, const std::string& feature) {
    throw UnsupportedFeature(feature, "regex '" + std::string(s_) + "': " + msg);
  }

  Ranges json_safe(const Ranges& r) const {
    return json_ ? subtract(r, {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}}) : r;
  }

  std::string alt() {
    std::vector<std::string> xs{seq()};
    while (i_ < end_ && s_[i_] == '|') {
      ++i_;
      xs.push_back(seq());
    }
    if (xs.size() == 1) return xs[0];
    std::string out = "(";
    for (size_t k = 0; k < xs.size(); ++k) out += (k ? " | " : "") + (xs[k].empty() ? std::string("\"\"") : xs[k]);
    return out + ")";
  }

  std::string seq() {
    std::string out;
    while (i_ < end_ && s_[i_] != '|' && s_[i_] != ')') {
      std::string a = atom();
      a = quant(a);
      if (!a.empty()) out += (out.empty() ? "" : " ") + a;
    }
    return out;
  }

  std::string quant(const std::string& a) {
    if (i_ >= end_) return a;
    const char c = s_[i_];
    std::string q;
    if (c == '*' || c == '+' || c == '?') {
      q = std::string(1, c);
      ++i_;
    } else if (c == '{') {
      const size_t close = s_.find('}', i_);
      if (close == std::string::npos || close >= end_) return a;  // a literal '{'
      const std::string body(s_.substr(i_ + 1, close - i_ - 1));
      bool ok = !body.empty() && std::all_of(body.begin(), body.end(), [](char ch) { return std::isdigit(ch) || ch == ','; });
      if (!ok) return a;
      q = "{" + body + "}";
      i_ = close + 1;
    } else {
      return a;
    }
    if (i_ < end_ && s_[i_] == '?') ++i_;  // lazy: same language for a full match
    else if (i_ < end_ && s_[i_] == '+') error("possessive quantifiers are not supported", "regex possessive quantifier");
    if (a.empty()) return a;
    return "(" + a + ")" + q;
  }

  std::string lit(uint32_t cp) {
    if (json_) {
      if (cp == '"') return "\"\\\\\\\"\"";
      if (cp == '\\') return "\"\\\\\\\\\"";
      if (cp < 0x20) {
        char buf[16];
        std::snprintf(buf, sizeof buf, "\"\\\\u%04X\"", cp);
        return buf;
      }
    }
    std::string u;
    if (cp < 0x80) u = char(cp);
    else if (cp < 0x800) u = {char(0xC0 | (cp >> 6)), char(0x80 | (cp & 0x3F))};
    else if (cp < 0x10000) u = {char(0xE0 | (cp >> 12)), char(0x80 | ((cp >> 6) & 0x3F)), char(0x80 | (cp & 0x3F))};
    else u = {char(0xF0 | (cp >> 18)), char(0x80 | ((cp >> 12) & 0x3F)), char(0x80 | ((cp >> 6) & 0x3F)), char(0x80 | (cp & 0x3F))};
    return gbnf_literal(u);
  }

  uint32_t next_cp() {
    const unsigned char c = static_cast<unsigned char>(s_[i_]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (i_ + n > s_.size()) n = 1;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s_[i_ + k]) & 0x3F);
    i_ += n;
    return cp;
  }

  // A shorthand class (\d \w \s and negations); false if `e` is not one.
  static bool shorthand(char e, Ranges& r, bool& negated) {
    negated = std::isupper(static_cast<unsigned char>(e));
    switch (std::tolower(static_cast<unsigned char>(e))) {
      case 'd': r = {{'0', '9'}}; return true;
      case 'w': r = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}; return true;
      case 's': r = {{' ', ' '}, {'\t', '\r'}}; return true;
      default: return false;
    }
  }

  // An escape after '\' (i_ at the escaped char); returns a code point, or -1 with `r` set.
  int64_t escape(Ranges& r, bool& negated) {
    if (i_ >= s_.size()) error("trailing backslash", "regex syntax");
    const char e = s_[i_++];
    if (shorthand(e, r, negated)) return -1;
    switch (e) {
      case 'n': return '\n';
      case 't': return '\t';
      case 'r': return '\r';
      case 'f': return '\f';
      case 'v': return '\v';
      case '0': return 0;
      case 'x':
      case 'u': {
        const size_t n = e == 'x' ? 2 : 4;
        if (i_ + n > s_.size()) error("short \\" + std::string(1, e) + " escape", "regex syntax");
        uint32_t v = 0;
        for (size_t k = 0; k < n; ++k) {
          const char h = s_[i_++];
          if (!std::isxdigit(static_cast<unsigned char>(h))) error("bad hex digit in escape", "regex syntax");
          v = v * 16 + uint32_t(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
        }
        return v;
      }
      case 'b': case 'B': case 'A': case 'Z': case 'z': case 'G':
        error(std::string("anchor \\") + e + " is not supported", std::string("regex \\") + e);
      default:
        if (std::isdigit(static_cast<unsigned char>(e)) || e == 'k')
          error("backreferences are not supported", "regex backreference");
        if (std::isalpha(static_cast<unsigned char>(e))) error(std::string("unknown escape \\") + e, std::string("regex \\") + e);
        return static_cast<unsigned char>(e);
    }
  }

  std::string ranges_expr(Ranges r, bool negated) {
    Ranges pos = negated ? complement(r) : normalize(r);
    pos = json_safe(pos);
    if (pos.empty()) error("a character class that matches nothing here", "regex empty class");
    return class_text(pos);
  }

  std::string atom() {
    const char c = s_[i_];
    if (c == '(') {
      ++i_;
      if (i_ < end_ && s_[i_] == '?') {
        if (i_ + 1 < end_ && s_[i_ + 1] == ':') {
          i_ += 2;
        } else if (i_ + 1 < end_ && (s_[i_ + 1] == 'P' || s_[i_ + 1] == '<') && s_.substr(i_ + 1, 2) != "<=" &&
                   s_.substr(i_ + 1, 2) != "<!") {
          const size_t close = s_.find('>', i_);
          if (close == std::string::npos) error("unterminated group name", "regex syntax");
          i_ = close + 1;
        } else {
          error("lookaround and inline flags (?...) are not supported", "regex lookaround");
        }
      }
      std::string e = alt();
      if (i_ >= end_ || s_[i_] != ')') error("missing ')'", "regex syntax");
      ++i_;
      return e.empty() ? "" : "(" + e + ")";
    }
    if (c == '[') {
      ++i_;
      bool neg = false;
      if (i_ < end_ && s_[i_] == '^') {
        neg = true;
        ++i_;
      }
      Ranges r;
      bool first = true;
      while (i_ < s_.size() && (s_[i_] != ']' || first)) {
        first = false;
        int64_t lo;
        if (s_[i_] == '\\') {
          ++i_;
          Ranges sr;
          bool sneg = false;
          lo = escape(sr, sneg);
          if (lo < 0) {
            if (sneg) sr = complement(sr);
            r.insert(r.end(), sr.begin(), sr.end());
            continue;
          }
        } else if (s_[i_] == '[' && i_ + 1 < s_.size() && s_[i_ + 1] == ':') {
          error("POSIX classes [:name:] are not supported", "regex POSIX class");
        } else {
          lo = next_cp();
        }
        int64_t hi = lo;
        if (i_ + 1 < s_.size() && s_[i_] == '-' && s_[i_ + 1] != ']') {
          ++i_;
          if (s_[i_] == '\\') {
            ++i_;
            Ranges sr;
            bool sneg;
            hi = escape(sr, sneg);
            if (hi < 0) error("a class shorthand cannot end a range", "regex syntax");
          } else {
            hi = next_cp();
          }
          if (hi < lo) error("reversed range in a character class", "regex syntax");
        }
        r.emplace_back(uint32_t(lo), uint32_t(hi));
      }
      if (i_ >= s_.size()) error("missing ']'", "regex syntax");
      ++i_;
      return ranges_expr(r, neg);
    }
    if (c == '.') {
      ++i_;
      return ranges_expr({{'\n', '\n'}}, true);
    }
    if (c == '\\') {
      ++i_;
      Ranges r;
      bool neg = false;
      const int64_t cp = escape(r, neg);
      if (cp < 0) return ranges_expr(r, neg);
      return lit(uint32_t(cp));
    }
    if (c == '^' || c == '$') error("anchors are only supported at the start and end", "regex anchor");
    if (c == '*' || c == '+' || c == '?') error(std::string("'") + c + "' has nothing to repeat", "regex syntax");
    return lit(next_cp());
  }
};

}  // namespace

std::string regex_to_gbnf_impl(std::string_view re, bool json_string) { return RegexConv(re, json_string).run(); }

std::string regex_to_gbnf(std::string_view regex) { return "root ::= " + regex_to_gbnf_impl(regex, false) + "\n"; }

}  // namespace kvboost::grammar
