// Lexer: template text -> tokens, with Jinja's whitespace rules as transformers configures them
// (trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False). Mirrors jinja2/lexer.py:
// a "-" on a tag strips all whitespace on that side; "+" disables lstrip/trim for the tag;
// lstrip removes spaces/tabs before a block or comment tag alone on its line; trim removes one
// newline after a block or comment tag.
#include <algorithm>
#include <cstring>

#include "jinja.h"

namespace kvboost::jinja {
namespace {

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

struct Lexer {
  std::string src;
  const std::string& name;
  std::vector<size_t> line_starts{0};
  std::vector<Token> out;

  Lexer(std::string s, const std::string& n) : src(std::move(s)), name(n) {
    for (size_t k = 0; k < src.size(); ++k)
      if (src[k] == '\n') line_starts.push_back(k + 1);
  }

  Pos pos_of(size_t off) const {
    auto it = std::upper_bound(line_starts.begin(), line_starts.end(), off);
    size_t line = size_t(it - line_starts.begin());
    return Pos{int(line), int(off - line_starts[line - 1]) + 1};
  }

  [[noreturn]] void syntax(size_t off, const std::string& msg) const {
    Pos p = pos_of(off);
    throw ChatTemplateError(ChatTemplateError::Kind::Syntax,
                            "chat template '" + name + "': syntax error at line " +
                                std::to_string(p.line) + ", column " + std::to_string(p.col) +
                                ": " + msg);
  }

  void emit(Tok t, std::string text, size_t off) { out.push_back(Token{t, std::move(text), pos_of(off)}); }

  // Text before a tag, after "-" / lstrip_blocks handling.
  void emit_text(std::string_view text, size_t off, char sign, bool is_var, bool line_starting) {
    if (sign == '-') {
      size_t e = text.size();
      while (e > 0 && is_ws(text[e - 1])) --e;
      text = text.substr(0, e);
    } else if (sign != '+' && !is_var) {
      size_t nl = text.rfind('\n');
      size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting) && l_pos < text.size()) {
        bool all_ws = std::all_of(text.begin() + long(l_pos), text.end(), is_ws);
        if (all_ws) text = text.substr(0, l_pos);
      }
    }
    if (!text.empty()) emit(Tok::Text, std::string(text), off);
  }

  // After a block/comment end: "-" eats all whitespace, plain eats one newline (trim_blocks).
  // Returns the new offset and whether the consumed end ended with a newline.
  size_t after_end(size_t p, char sign, bool trim, bool& line_starting) {
    line_starting = false;
    if (sign == '-') {
      while (p < src.size() && is_ws(src[p])) {
        line_starting = src[p] == '\n';
        ++p;
      }
    } else if (sign != '+' && trim && p < src.size() && src[p] == '\n') {
      ++p;
      line_starting = true;
    }
    return p;
  }

  size_t lex_string(size_t p) {
    char q = src[p];
    size_t start = p++;
    std::string val;
    while (true) {
      if (p >= src.size()) syntax(start, "unterminated string literal");
      char c = src[p];
      if (c == q) break;
      if (c != '\\') {
        val += c;
        ++p;
        continue;
      }
      if (p + 1 >= src.size()) syntax(start, "unterminated string literal");
      char e = src[p + 1];
      p += 2;
      auto hex = [&](int n) {
        if (p + size_t(n) > src.size()) syntax(start, "truncated escape in string literal");
        uint32_t cp = 0;
        for (int k = 0; k < n; ++k) {
          char h = src[p + size_t(k)];
          int d = is_digit(h) ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
          if (d < 0) syntax(start, "bad escape in string literal");
          cp = cp * 16 + uint32_t(d);
        }
        p += size_t(n);
        if (cp > 0x10ffff) syntax(start, "bad escape in string literal");
        val += utf8_encode(std::u32string(1, char32_t(cp)));
      };
      switch (e) {
        case 'n': val += '\n'; break;
        case 't': val += '\t'; break;
        case 'r': val += '\r'; break;
        case '\\': val += '\\'; break;
        case '\'': val += '\''; break;
        case '"': val += '"'; break;
        case 'a': val += '\a'; break;
        case 'b': val += '\b'; break;
        case 'f': val += '\f'; break;
        case 'v': val += '\v'; break;
        case '0': val += '\0'; break;
        case '\n': break;  // line continuation
        case 'x': hex(2); break;
        case 'u': hex(4); break;
        case 'U': hex(8); break;
        default: val += '\\'; val += e; break;  // Python keeps unknown escapes verbatim
      }
    }
    emit(Tok::String, std::move(val), start);
    return p + 1;
  }

  size_t lex_number(size_t p) {
    size_t start = p;
    bool is_float = false;
    while (p < src.size() && (is_digit(src[p]) || src[p] == '_')) ++p;
    if (p + 1 < src.size() && src[p] == '.' && is_digit(src[p + 1])) {
      is_float = true;
      ++p;
      while (p < src.size() && (is_digit(src[p]) || src[p] == '_')) ++p;
    }
    if (p < src.size() && (src[p] == 'e' || src[p] == 'E')) {
      size_t q = p + 1;
      if (q < src.size() && (src[q] == '+' || src[q] == '-')) ++q;
      if (q < src.size() && is_digit(src[q])) {
        is_float = true;
        p = q;
        while (p < src.size() && is_digit(src[p])) ++p;
      }
    }
    std::string text;
    for (size_t k = start; k < p; ++k)
      if (src[k] != '_') text += src[k];
    emit(is_float ? Tok::Float : Tok::Int, text, start);
    return p;
  }

  // Expression tokens up to the tag end; returns the offset after it and the end's sign.
  size_t lex_tag(size_t p, bool is_var, char& end_sign) {
    const char* end = is_var ? "}}" : "%}";
    size_t tag_start = p;
    std::vector<char> braces;
    while (true) {
      while (p < src.size() && is_ws(src[p])) ++p;
      if (p >= src.size()) syntax(tag_start, is_var ? "unexpected end of template, expected '}}'" : "unexpected end of template, expected '%}'");
      if (braces.empty()) {
        char c = src[p];
        if ((c == '-' || (c == '+' && !is_var)) && src.compare(p + 1, 2, end) == 0) {
          end_sign = c;
          emit(is_var ? Tok::VarEnd : Tok::BlockEnd, "", p);
          return p + 3;
        }
        if (src.compare(p, 2, end) == 0) {
          end_sign = 0;
          emit(is_var ? Tok::VarEnd : Tok::BlockEnd, "", p);
          return p + 2;
        }
      }
      char c = src[p];
      if (is_name_start(c)) {
        size_t s = p;
        while (p < src.size() && (is_name_start(src[p]) || is_digit(src[p]))) ++p;
        emit(Tok::Name, src.substr(s, p - s), s);
      } else if (is_digit(c)) {
        p = lex_number(p);
      } else if (c == '\'' || c == '"') {
        p = lex_string(p);
      } else {
        static const char* two[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op;
        for (const char* t : two)
          if (src.compare(p, 2, t) == 0) op = t;
        if (op.empty()) {
          if (!std::strchr("+-*/%~<>=.,:|()[]{}", c)) syntax(p, std::string("unexpected character '") + c + "'");
          op = std::string(1, c);
        }
        if (op == "(" || op == "[" || op == "{") braces.push_back(op == "(" ? ')' : op == "[" ? ']' : '}');
        if (op == ")" || op == "]" || op == "}") {
          if (braces.empty() || braces.back() != op[0]) syntax(p, "unexpected '" + op + "'");
          braces.pop_back();
        }
        emit(Tok::Op, op, p);
        p += op.size();
      }
    }
  }

  // {% raw %}...{% endraw %}: copied verbatim. Returns npos when the tag at p is not `raw`.
  size_t try_raw(size_t p, bool line_starting, std::string_view text, size_t text_off) {
    size_t q = p + 2;
    char sign = q < src.size() && (src[q] == '-' || src[q] == '+') ? src[q++] : 0;
    while (q < src.size() && is_ws(src[q])) ++q;
    if (src.compare(q, 3, "raw") != 0 || (q + 3 < src.size() && (is_name_start(src[q + 3]) || is_digit(src[q + 3]))))
      return std::string::npos;
    q += 3;
    while (q < src.size() && is_ws(src[q])) ++q;
    char esign = 0;
    if (q < src.size() && src[q] == '-') esign = src[q++];
    if (src.compare(q, 2, "%}") != 0) return std::string::npos;
    emit_text(text, text_off, sign, false, line_starting);
    q += 2;
    if (esign == '-')
      while (q < src.size() && is_ws(src[q])) ++q;
    size_t search = q;
    while (true) {
      size_t e = src.find("{%", search);
      if (e == std::string::npos) syntax(p, "missing end of raw directive");
      size_t r = e + 2;
      char s2 = r < src.size() && (src[r] == '-' || src[r] == '+') ? src[r++] : 0;
      while (r < src.size() && is_ws(src[r])) ++r;
      if (src.compare(r, 6, "endraw") == 0) {
        r += 6;
        while (r < src.size() && is_ws(src[r])) ++r;
        char s3 = r < src.size() && (src[r] == '-' || src[r] == '+') ? src[r++] : 0;
        if (src.compare(r, 2, "%}") == 0) {
          bool ls = false;
          emit_text(std::string_view(src).substr(q, e - q), q, s2, false, false);
          return after_end(r + 2, s3, true, ls);
        }
      }
      search = e + 2;
    }
  }

  void run() {
    size_t p = 0;
    bool line_starting = true;
    while (p < src.size()) {
      size_t j = p;
      while (true) {
        j = src.find('{', j);
        if (j == std::string::npos || j + 1 >= src.size()) break;
        char c = src[j + 1];
        if (c == '{' || c == '%' || c == '#') break;
        ++j;
      }
      if (j == std::string::npos || j + 1 >= src.size()) {
        emit(Tok::Text, src.substr(p), p);
        return;
      }
      std::string_view text = std::string_view(src).substr(p, j - p);
      char kind = src[j + 1];
      char sign = j + 2 < src.size() && (src[j + 2] == '-' || src[j + 2] == '+') ? src[j + 2] : 0;
      if (kind == '%') {
        size_t r = try_raw(j, line_starting, text, p);
        if (r != std::string::npos) {
          p = r;
          line_starting = p > 0 && src[p - 1] == '\n';
          continue;
        }
      }
      emit_text(text, p, sign, kind == '{', line_starting);
      size_t body = j + 2 + (sign ? 1 : 0);
      if (kind == '#') {
        size_t e = src.find("#}", body);
        if (e == std::string::npos) syntax(j, "missing end of comment tag");
        char es = e > body && (src[e - 1] == '-' || src[e - 1] == '+') ? src[e - 1] : 0;
        p = after_end(e + 2, es, true, line_starting);
        continue;
      }
      emit(kind == '{' ? Tok::VarBegin : Tok::BlockBegin, "", j);
      char end_sign = 0;
      size_t e = lex_tag(body, kind == '{', end_sign);
      p = after_end(e, end_sign, kind == '%', line_starting);
    }
  }
};

}  // namespace

std::vector<Token> lex(const std::string& source, const std::string& name) {
  // Jinja normalises newlines to "\n" and drops one trailing newline (keep_trailing_newline=False).
  std::string s;
  s.reserve(source.size());
  for (size_t k = 0; k < source.size(); ++k) {
    if (source[k] == '\r') {
      s += '\n';
      if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
    } else {
      s += source[k];
    }
  }
  if (!s.empty() && s.back() == '\n') s.pop_back();
  Lexer lx(std::move(s), name);
  lx.run();
  lx.emit(Tok::Eof, "", lx.src.size());
  return std::move(lx.out);
}

}  // namespace kvboost::jinja
