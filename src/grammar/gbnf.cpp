// GBNF parser (llama.cpp's grammars/README.md): rules `name ::= alternatives`, sequences,
// groups, string literals and character classes with escapes, `.`, and the postfix operators
// * + ? {m} {m,} {m,n}. Repetitions are rewritten into generated rules, as llama.cpp does, so the
// matcher only knows sequences, alternatives and rule references. Every error names line:column.
#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "kvboost/grammar.h"

namespace kvboost::grammar {
namespace {

using Seq = std::vector<Elem>;

bool is_word_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}

  void parse_all() {
    skip_space(true);
    while (i_ < s_.size()) {
      parse_rule();
      skip_space(true);
    }
  }

  std::map<std::string, uint32_t> ids;
  std::vector<std::string> names;
  std::vector<Seq> rules;
  std::vector<bool> defined;
  std::vector<size_t> first_use;  // offset of the first reference (undefined-rule errors)

  [[noreturn]] void error_at(size_t at, const std::string& msg) const {
    size_t line = 1, col = 1;
    for (size_t k = 0; k < at && k < s_.size(); ++k) {
      if (s_[k] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw GrammarError("grammar:" + std::to_string(line) + ":" + std::to_string(col) + ": " + msg);
  }

  uint32_t rule_id(const std::string& name, size_t at) {
    auto it = ids.find(name);
    if (it != ids.end()) return it->second;
    const uint32_t id = uint32_t(names.size());
    ids[name] = id;
    names.push_back(name);
    rules.emplace_back();
    defined.push_back(false);
    first_use.push_back(at);
    return id;
  }
  uint32_t new_rule(const std::string& base) {
    std::string n = base;
    for (int k = 1; ids.count(n); ++k) n = base + "-" + std::to_string(k);
    const uint32_t id = rule_id(n, i_);
    defined[id] = true;
    return id;
  }

 private:
  std::string_view s_;
  size_t i_ = 0;
  bool at_next_rule_ = false;

  bool at_end() const { return i_ >= s_.size(); }
  char peek(size_t k = 0) const { return i_ + k < s_.size() ? s_[i_ + k] : '\0'; }

  // Spaces, tabs and comments; newlines too when `newlines`.
  void skip_space(bool newlines) {
    while (i_ < s_.size()) {
      const char c = s_[i_];
      if (c == ' ' || c == '\t' || c == '\r') {
        ++i_;
      } else if (c == '#') {
        while (i_ < s_.size() && s_[i_] != '\n') ++i_;
      } else if (c == '\n' && newlines) {
        ++i_;
      } else if (c == '\n') {
        // A newline ends a top-level sequence unless the next line continues it with '|'.
        size_t k = i_;
        while (k < s_.size() && (s_[k] == ' ' || s_[k] == '\t' || s_[k] == '\r' || s_[k] == '\n')) ++k;
        if (k < s_.size() && s_[k] == '|') {
          i_ = k;
        }
        return;
      } else {
        return;
      }
    }
  }

  std::string parse_name() {
    const size_t b = i_;
    while (i_ < s_.size() && is_word_char(s_[i_])) ++i_;
    if (i_ == b) error_at(b, std::string("expected a rule name, found ") + describe(b));
    return std::string(s_.substr(b, i_ - b));
  }

  std::string describe(size_t at) const {
    if (at >= s_.size()) return "the end of the grammar";
    const char c = s_[at];
    if (c == '\n') return "a newline";
    return std::string("'") + c + "'";
  }

  void parse_rule() {
    const size_t at = i_;
    const std::string name = parse_name();
    skip_space(false);
    if (!(peek() == ':' && peek(1) == ':' && peek(2) == '=')) error_at(i_, "expected '::=' after rule name '" + name + "'");
    i_ += 3;
    skip_space(true);
    const uint32_t id = rule_id(name, at);
    if (defined[id]) error_at(at, "rule '" + name + "' is defined twice");
    defined[id] = true;
    at_next_rule_ = false;
    Seq body = parse_alternates(name, false);
    rules[id] = std::move(body);
    if (!at_end() && peek() != '\n' && !at_next_rule_) error_at(i_, "expected the end of rule '" + name + "', found " + describe(i_));
  }

  Seq parse_alternates(const std::string& rule_name, bool nested) {
    Seq out;
    parse_sequence(out, rule_name, nested);
    while (peek() == '|') {
      ++i_;
      skip_space(true);
      out.push_back({Op::kAlt, 0});
      parse_sequence(out, rule_name, nested);
    }
    out.push_back({Op::kEnd, 0});
    return out;
  }

  uint32_t parse_char(size_t& k) const {
    // One (possibly escaped) UTF-8 character at s_[k]; advances k.
    if (k >= s_.size()) error_at(k, "unexpected end of the grammar");
    const unsigned char c = static_cast<unsigned char>(s_[k]);
    if (c == '\\') {
      if (k + 1 >= s_.size()) error_at(k, "unfinished escape");
      const char e = s_[k + 1];
      k += 2;
      auto hex = [&](int n) {
        uint32_t v = 0;
        for (int j = 0; j < n; ++j, ++k) {
          if (k >= s_.size() || !std::isxdigit(static_cast<unsigned char>(s_[k])))
            error_at(k, std::string("expected ") + std::to_string(n) + " hex digits after \\" + e);
          const char h = s_[k];
          v = v * 16 + uint32_t(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
        }
        return v;
      };
      switch (e) {
        case 'x': return hex(2);
        case 'u': return hex(4);
        case 'U': return hex(8);
        case 't': return '\t';
        case 'r': return '\r';
        case 'n': return '\n';
        case '\\': case '"': case '[': case ']': case '-': case '^': case '\'': case '/': return uint32_t(e);
        default: error_at(k - 2, std::string("unknown escape '\\") + e + "'");
      }
    }
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || k + n > s_.size()) error_at(k, "invalid UTF-8 in the grammar");
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t j = 1; j < n; ++j) {
      const unsigned char d = static_cast<unsigned char>(s_[k + j]);
      if ((d & 0xC0) != 0x80) error_at(k, "invalid UTF-8 in the grammar");
      cp = (cp << 6) | (d & 0x3F);
    }
    k += n;
    return cp;
  }

  int parse_int() {
    const size_t b = i_;
    long v = 0;
    while (std::isdigit(static_cast<unsigned char>(peek()))) {
      v = v * 10 + (peek() - '0');
      if (v > 100000) error_at(b, "repetition count is too large (at most 100000)");
      ++i_;
    }
    if (i_ == b) error_at(b, "expected a number in the repetition {m,n}");
    return int(v);
  }

  void parse_sequence(Seq& out, const std::string& rule_name, bool nested) {
    size_t last_start = out.size();  // the last symbol, for postfix operators
    bool have_last = false;
    while (!at_end()) {
      const char c = peek();
      const size_t at = i_;
      if (c == '"') {
        ++i_;
        last_start = out.size();
        while (peek() != '"') {
          if (at_end() || peek() == '\n') error_at(at, "unterminated string literal");
          size_t k = i_;
          out.push_back({Op::kChar, parse_char(k)});
          i_ = k;
        }
        ++i_;
        have_last = true;
        if (out.size() == last_start) have_last = false;  // "" matches nothing; nothing to repeat
      } else if (c == '[') {
        ++i_;
        last_start = out.size();
        Op start = Op::kChar;
        if (peek() == '^') {
          ++i_;
          start = Op::kCharNot;
        }
        bool first = true;
        while (peek() != ']') {
          if (at_end() || peek() == '\n') error_at(at, "unterminated character class");
          size_t k = i_;
          const uint32_t lo = parse_char(k);
          i_ = k;
          out.push_back({first ? start : Op::kCharAlt, lo});
          first = false;
          if (peek() == '-' && peek(1) != ']') {
            ++i_;
            size_t k2 = i_;
            const uint32_t hi = parse_char(k2);
            i_ = k2;
            if (hi < lo) error_at(at, "character range is reversed");
            out.push_back({Op::kCharRngUpper, hi});
          }
        }
        if (first) error_at(at, "empty character class []");
        ++i_;
        have_last = true;
      } else if (c == '.') {
        ++i_;
        last_start = out.size();
        out.push_back({Op::kCharAny, 0});
        have_last = true;
      } else if (is_word_char(c)) {
        const std::string name = parse_name();
        skip_space(nested);
        if (peek() == ':' && peek(1) == ':' && peek(2) == '=') {
          // The next rule's definition: this sequence (an empty last alternative, after a
          // trailing '|') ended at the previous line.
          i_ = at;
          at_next_rule_ = true;
          break;
        }
        i_ = at + name.size();
        last_start = out.size();
        out.push_back({Op::kRuleRef, rule_id(name, at)});
        have_last = true;
      } else if (c == '(') {
        ++i_;
        skip_space(true);
        const uint32_t sub = new_rule(rule_name + "-g");
        Seq body = parse_alternates(rule_name, true);
        rules[sub] = std::move(body);
        if (peek() != ')') error_at(i_, "expected ')' to close the group opened at " + pos_str(at) + ", found " + describe(i_));
        ++i_;
        last_start = out.size();
        out.push_back({Op::kRuleRef, sub});
        have_last = true;
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (!have_last) error_at(at, std::string("'") + c + "' has nothing to repeat");
        int lo = 0, hi = -1;  // hi -1: unbounded
        ++i_;
        if (c == '+') lo = 1;
        if (c == '?') hi = 1;
        if (c == '{') {
          skip_space(true);
          lo = parse_int();
          skip_space(true);
          if (peek() == ',') {
            ++i_;
            skip_space(true);
            hi = std::isdigit(static_cast<unsigned char>(peek())) ? parse_int() : -1;
          } else {
            hi = lo;
          }
          skip_space(true);
          if (peek() != '}') error_at(i_, "expected '}' to close the repetition");
          ++i_;
          if (hi >= 0 && hi < lo) error_at(at, "repetition {m,n} has n < m");
        }
        repeat(out, last_start, lo, hi, rule_name);
        have_last = true;
      } else {
        break;
      }
      skip_space(nested);
    }
  }

  std::string pos_str(size_t at) const {
    size_t line = 1, col = 1;
    for (size_t k = 0; k < at; ++k) {
      if (s_[k] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return std::to_string(line) + ":" + std::to_string(col);
  }

  // out[start..] is the symbol S; replaces it by S{lo,hi}.
  void repeat(Seq& out, size_t start, int lo, int hi, const std::string& rule_name) {
    Seq sym(out.begin() + long(start), out.end());
    out.resize(start);
    // A symbol of several elements (a literal) is repeated as a unit: make it a rule.
    bool one_class = sym[0].op == Op::kChar || sym[0].op == Op::kCharNot || sym[0].op == Op::kCharAny;
    for (size_t k = 1; k < sym.size() && one_class; ++k)
      one_class = sym[k].op == Op::kCharAlt || sym[k].op == Op::kCharRngUpper;
    if (!(sym.size() == 1 || one_class)) {
      const uint32_t id = new_rule(rule_name + "-s");
      Seq body = sym;
      body.push_back({Op::kEnd, 0});
      rules[id] = std::move(body);
      sym = {{Op::kRuleRef, id}};
    }
    for (int k = 0; k < lo; ++k) out.insert(out.end(), sym.begin(), sym.end());
    if (hi < 0) {
      // r ::= S r | (empty)   — right recursion: the stack does not grow.
      const uint32_t id = new_rule(rule_name + "-star");
      Seq body = sym;
      body.push_back({Op::kRuleRef, id});
      body.push_back({Op::kAlt, 0});
      body.push_back({Op::kEnd, 0});
      rules[id] = std::move(body);
      out.push_back({Op::kRuleRef, id});
    } else if (hi > lo) {
      // r_1 ::= S | ;  r_k ::= S r_{k-1} |
      uint32_t prev = 0;
      for (int k = 1; k <= hi - lo; ++k) {
        const uint32_t id = new_rule(rule_name + "-opt");
        Seq body = sym;
        if (k > 1) body.push_back({Op::kRuleRef, prev});
        body.push_back({Op::kAlt, 0});
        body.push_back({Op::kEnd, 0});
        rules[id] = std::move(body);
        prev = id;
      }
      out.push_back({Op::kRuleRef, prev});
    }
  }
};

// Rules that can match the empty string.
std::vector<bool> nullable_rules(const std::vector<Seq>& rules) {
  std::vector<bool> nul(rules.size(), false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < rules.size(); ++r) {
      if (nul[r]) continue;
      const Seq& s = rules[r];
      bool alt_ok = true;  // current alternative so far nullable
      for (size_t k = 0; k < s.size(); ++k) {
        const Elem e = s[k];
        if (e.op == Op::kAlt || e.op == Op::kEnd) {
          if (alt_ok) {
            nul[r] = true;
            changed = true;
            break;
          }
          alt_ok = true;
        } else if (e.op == Op::kRuleRef) {
          alt_ok = alt_ok && nul[e.value];
        } else if (e.op != Op::kCharAlt && e.op != Op::kCharRngUpper) {
          alt_ok = false;
        }
      }
    }
  }
  return nul;
}

}  // namespace

std::shared_ptr<const Grammar> parse_gbnf(std::string_view text, const std::string& root) {
  Parser p(text);
  p.parse_all();
  for (size_t r = 0; r < p.names.size(); ++r)
    if (!p.defined[r]) p.error_at(p.first_use[r], "undefined rule '" + p.names[r] + "'");
  auto it = p.ids.find(root);
  if (it == p.ids.end()) throw GrammarError("grammar: no rule named '" + root + "' (the start rule)");
  // Left recursion: a rule reachable from itself through leftmost, nullable-prefixed positions
  // would make the matcher loop; reject it by name.
  const std::vector<bool> nul = nullable_rules(p.rules);
  std::vector<std::vector<uint32_t>> left(p.rules.size());
  for (size_t r = 0; r < p.rules.size(); ++r) {
    const Seq& s = p.rules[r];
    bool at_left = true;
    for (const Elem& e : s) {
      if (e.op == Op::kAlt || e.op == Op::kEnd) {
        at_left = true;
      } else if (at_left && e.op == Op::kRuleRef) {
        left[r].push_back(e.value);
        at_left = nul[e.value];
      } else if (e.op != Op::kCharAlt && e.op != Op::kCharRngUpper) {
        at_left = false;
      }
    }
  }
  std::vector<int> color(p.rules.size(), 0);  // 0 new, 1 on the path, 2 done
  std::vector<uint32_t> path;
  std::function<void(uint32_t)> dfs = [&](uint32_t r) {
    color[r] = 1;
    path.push_back(r);
    for (uint32_t n : left[r]) {
      if (color[n] == 1) {
        std::string cyc;
        bool on = false;
        for (uint32_t q : path) {
          if (q == n) on = true;
          if (on) cyc += p.names[q] + " -> ";
        }
        throw GrammarError("grammar: rule '" + p.names[n] + "' is left-recursive (" + cyc + p.names[n] +
                           "); rewrite it with repetition, e.g. list ::= item (\",\" item)*");
      }
      if (color[n] == 0) dfs(n);
    }
    path.pop_back();
    color[r] = 2;
  };
  for (uint32_t r = 0; r < p.rules.size(); ++r)
    if (color[r] == 0) dfs(r);

  auto g = std::make_shared<Grammar>();
  g->rule_names = p.names;
  g->root = it->second;
  g->source = std::string(text);
  for (const Seq& s : p.rules) {
    g->rule_start.push_back(uint32_t(g->elems.size()));
    g->elems.insert(g->elems.end(), s.begin(), s.end());
  }
  return g;
}

namespace {
std::string cp_escape(uint32_t cp, bool in_class) {
  if (cp == '\n') return "\\n";
  if (cp == '\r') return "\\r";
  if (cp == '\t') return "\\t";
  if (cp == '\\') return "\\\\";
  if (cp == '"' && !in_class) return "\\\"";
  if (in_class && (cp == ']' || cp == '[' || cp == '-' || cp == '^')) return std::string("\\") + char(cp);
  char buf[16];
  if (cp < 0x20 || cp == 0x7F) {
    std::snprintf(buf, sizeof buf, "\\x%02X", cp);
    return buf;
  }
  if (cp < 0x80) return std::string(1, char(cp));
  if (cp <= 0xFFFF) std::snprintf(buf, sizeof buf, "\\u%04X", cp);
  else std::snprintf(buf, sizeof buf, "\\U%08X", cp);
  return buf;
}
}  // namespace

std::string gbnf_literal(std::string_view s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (i + n > s.size()) n = 1;
    if (n == 1) {
      out += cp_escape(c, false);
      ++i;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out + "\"";
}

std::string to_gbnf(const Grammar& g) {
  std::string out;
  for (size_t r = 0; r < g.rule_start.size(); ++r) {
    out += g.rule_names[r] + " ::=";
    for (size_t k = g.rule_start[r]; g.elems[k].op != Op::kEnd; ++k) {
      const Elem e = g.elems[k];
      switch (e.op) {
        case Op::kAlt: out += " |"; break;
        case Op::kRuleRef: out += " " + g.rule_names[e.value]; break;
        case Op::kChar:
        case Op::kCharNot: {
          out += e.op == Op::kCharNot ? " [^" : " [";
          out += cp_escape(e.value, true);
          while (g.elems[k + 1].op == Op::kCharAlt || g.elems[k + 1].op == Op::kCharRngUpper) {
            ++k;
            if (g.elems[k].op == Op::kCharRngUpper) out += "-";
            out += cp_escape(g.elems[k].value, true);
          }
          out += "]";
          break;
        }
        case Op::kCharAny: out += " ."; break;
        default: break;
      }
    }
    out += "\n";
  }
  return out;
}

std::string prefix_rules(std::string_view g, const std::string& prefix) {
  std::string out;
  for (size_t i = 0; i < g.size();) {
    const char c = g[i];
    if (c == '"' || c == '[') {  // a literal or a class: copied as is (escapes included)
      const char close = c == '"' ? '"' : ']';
      size_t k = i + 1;
      while (k < g.size() && g[k] != close) k += g[k] == '\\' ? 2 : 1;
      out.append(g.substr(i, k + 1 - i));
      i = k + 1;
    } else if (c == '#') {
      while (i < g.size() && g[i] != '\n') out += g[i++];
    } else if (is_word_char(c) && !(c >= '0' && c <= '9' && i > 0 && g[i - 1] == '{')) {
      size_t k = i;
      while (k < g.size() && is_word_char(g[k])) ++k;
      out += prefix;
      out.append(g.substr(i, k - i));
      i = k;
    } else if (c == '{') {  // a repetition count
      while (i < g.size() && g[i] != '}') out += g[i++];
    } else {
      out += c;
      ++i;
    }
  }
  return out;
}

std::string choice_to_gbnf(const std::vector<std::string>& choices) {
  if (choices.empty()) throw UnsupportedFeature("empty choice", "guided_choice: the list of choices is empty");
  std::string out = "root ::= ";
  for (size_t i = 0; i < choices.size(); ++i) out += (i ? " | " : "") + gbnf_literal(choices[i]);
  return out + "\n";
}

}  // namespace kvboost::grammar
