// Parser: tokens -> AST. Operator precedence as jinja2/parser.py (lowest first): inline if,
// or, and, not, comparisons (in, not in, ==, ...), + -, ~, * / // %, **, unary - +, then
// primary with postfix (.attr, [item], (call)) and filters/tests (x|f, x is t).
#include "jinja.h"

namespace kvboost::jinja {
namespace {

// Nesting bound: each level costs ~12 C++ frames; real templates nest < 10 deep.
constexpr int kMaxDepth = 100;

struct Parser {
  const std::vector<Token>& toks;
  const std::string& name;
  size_t p = 0;
  int depth = 0;

  const Token& cur() const { return toks[p]; }
  const Token& peek(size_t n = 1) const { return toks[std::min(p + n, toks.size() - 1)]; }
  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::Name && cur().text == n; }

  [[noreturn]] void error(const Pos& pos, const std::string& msg) const {
    throw ChatTemplateError(ChatTemplateError::Kind::Syntax,
                            "chat template '" + name + "': syntax error at line " +
                                std::to_string(pos.line) + ", column " + std::to_string(pos.col) +
                                ": " + msg);
  }
  std::string describe(const Token& t) const {
    switch (t.type) {
      case Tok::Eof: return "end of template";
      case Tok::VarEnd: return "end of print statement '}}'";
      case Tok::BlockEnd: return "end of statement block '%}'";
      case Tok::Text: return "template text";
      case Tok::String: return "string literal";
      default: return "'" + t.text + "'";
    }
  }
  void expect_op(const char* op) {
    if (!is_op(op)) error(cur().pos, std::string("expected '") + op + "', got " + describe(cur()));
    ++p;
  }
  std::string expect_name() {
    if (cur().type != Tok::Name) error(cur().pos, "expected a name, got " + describe(cur()));
    return toks[p++].text;
  }
  void expect(Tok t, const char* what) {
    if (cur().type != t) error(cur().pos, std::string("expected ") + what + ", got " + describe(cur()));
    ++p;
  }

  struct DepthGuard {
    Parser& ps;
    DepthGuard(Parser& x, const Pos& pos) : ps(x) {
      if (++ps.depth > kMaxDepth) ps.error(pos, "template nested too deeply");
    }
    ~DepthGuard() { --ps.depth; }
  };

  ExprPtr node(Expr::Kind k, const Pos& pos) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->pos = pos;
    return e;
  }

  // ---- expressions ----
  ExprPtr expression(bool with_condexpr = true) {
    DepthGuard g(*this, cur().pos);
    if (!with_condexpr) return or_expr();
    ExprPtr e = or_expr();
    while (is_name("if")) {
      Pos pos = cur().pos;
      ++p;
      auto c = node(Expr::Kind::CondExpr, pos);
      c->a = std::move(e);
      c->b = or_expr();
      if (is_name("else")) {
        ++p;
        c->c = expression();
      }
      e = std::move(c);
    }
    return e;
  }
  ExprPtr or_expr() {
    ExprPtr e = and_expr();
    while (is_name("or")) {
      auto n = node(Expr::Kind::Or, cur().pos);
      ++p;
      n->a = std::move(e);
      n->b = and_expr();
      e = std::move(n);
    }
    return e;
  }
  ExprPtr and_expr() {
    ExprPtr e = not_expr();
    while (is_name("and")) {
      auto n = node(Expr::Kind::And, cur().pos);
      ++p;
      n->a = std::move(e);
      n->b = not_expr();
      e = std::move(n);
    }
    return e;
  }
  ExprPtr not_expr() {
    if (is_name("not")) {
      DepthGuard g(*this, cur().pos);
      auto n = node(Expr::Kind::Not, cur().pos);
      ++p;
      n->a = not_expr();
      return n;
    }
    return compare();
  }
  ExprPtr compare() {
    Pos pos = cur().pos;
    ExprPtr e = math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().type == Tok::Op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                    cur().text == ">" || cur().text == "<=" || cur().text == ">=")) {
        op = cur().text;
        ++p;
      } else if (is_name("in")) {
        op = "in";
        ++p;
      } else if (is_name("not") && peek().type == Tok::Name && peek().text == "in") {
        op = "notin";
        p += 2;
      } else {
        break;
      }
      if (!cmp) {
        cmp = node(Expr::Kind::Compare, pos);
        cmp->a = std::move(e);
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(math1());
    }
    return cmp ? std::move(cmp) : std::move(e);
  }
  ExprPtr binary(ExprPtr l, const std::string& op, ExprPtr r, const Pos& pos) {
    auto n = node(Expr::Kind::Binary, pos);
    n->name = op;
    n->a = std::move(l);
    n->b = std::move(r);
    return n;
  }
  ExprPtr math1() {
    ExprPtr e = concat();
    while (is_op("+") || is_op("-")) {
      Token t = toks[p++];
      e = binary(std::move(e), t.text, concat(), t.pos);
    }
    return e;
  }
  ExprPtr concat() {
    ExprPtr e = math2();
    while (is_op("~")) {
      Token t = toks[p++];
      e = binary(std::move(e), "~", math2(), t.pos);
    }
    return e;
  }
  ExprPtr math2() {
    ExprPtr e = pow_expr();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      Token t = toks[p++];
      e = binary(std::move(e), t.text, pow_expr(), t.pos);
    }
    return e;
  }
  ExprPtr pow_expr() {
    ExprPtr e = unary(true);
    while (is_op("**")) {
      Token t = toks[p++];
      e = binary(std::move(e), "**", unary(true), t.pos);
    }
    return e;
  }
  ExprPtr unary(bool with_filter) {
    DepthGuard g(*this, cur().pos);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      e = node(is_op("-") ? Expr::Kind::Neg : Expr::Kind::Pos, cur().pos);
      ++p;
      e->a = unary(false);
    } else {
      e = primary();
    }
    e = postfix(std::move(e));
    if (with_filter) e = filter_expr(std::move(e));
    return e;
  }
  ExprPtr primary() {
    const Token& t = cur();
    Pos pos = t.pos;
    if (t.type == Tok::Name) {
      ++p;
      auto lit = [&](Value v) {
        auto n = node(Expr::Kind::Literal, pos);
        n->literal = std::move(v);
        return n;
      };
      if (t.text == "true" || t.text == "True") return lit(Value::boolean(true));
      if (t.text == "false" || t.text == "False") return lit(Value::boolean(false));
      if (t.text == "none" || t.text == "None") return lit(Value::none());
      auto n = node(Expr::Kind::Name, pos);
      n->name = t.text;
      return n;
    }
    if (t.type == Tok::String) {
      std::string s;
      while (cur().type == Tok::String) s += toks[p++].text;  // adjacent literals concatenate
      auto n = node(Expr::Kind::Literal, pos);
      n->literal = Value::string(std::move(s));
      return n;
    }
    if (t.type == Tok::Int || t.type == Tok::Float) {
      ++p;
      auto n = node(Expr::Kind::Literal, pos);
      try {
        n->literal = t.type == Tok::Int ? Value::integer(std::stoll(t.text)) : Value::floating(std::stod(t.text));
      } catch (const std::exception&) {
        error(pos, "number out of range: " + t.text);
      }
      return n;
    }
    if (is_op("(")) {
      ++p;
      if (is_op(")")) {  // empty tuple
        ++p;
        return node(Expr::Kind::List, pos);
      }
      ExprPtr e = expression();
      if (is_op(",")) {  // tuple: evaluated as a list
        auto l = node(Expr::Kind::List, pos);
        l->args.push_back(std::move(e));
        while (is_op(",")) {
          ++p;
          if (is_op(")")) break;
          l->args.push_back(expression());
        }
        e = std::move(l);
      }
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      ++p;
      auto l = node(Expr::Kind::List, pos);
      while (!is_op("]")) {
        if (!l->args.empty()) expect_op(",");
        if (is_op("]")) break;
        l->args.push_back(expression());
      }
      ++p;
      return l;
    }
    if (is_op("{")) {
      ++p;
      auto d = node(Expr::Kind::Dict, pos);
      while (!is_op("}")) {
        if (!d->args.empty()) expect_op(",");
        if (is_op("}")) break;
        d->args.push_back(expression());
        expect_op(":");
        d->args.push_back(expression());
      }
      ++p;
      return d;
    }
    error(pos, "unexpected " + describe(t));
  }
  void call_args(Expr& n) {
    expect_op("(");
    while (!is_op(")")) {
      if (!n.args.empty() || !n.kwargs.empty()) expect_op(",");
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) error(cur().pos, "unsupported: *args / **kwargs in calls");
      if (cur().type == Tok::Name && peek().type == Tok::Op && peek().text == "=") {
        std::string k = toks[p].text;
        p += 2;
        n.kwargs.emplace_back(k, expression());
      } else {
        if (!n.kwargs.empty()) error(cur().pos, "positional argument after keyword argument");
        n.args.push_back(expression());
      }
    }
    ++p;
  }
  ExprPtr postfix(ExprPtr e) {
    while (true) {
      DepthGuard g(*this, cur().pos);
      if (is_op(".")) {
        Pos pos = cur().pos;
        ++p;
        auto n = node(Expr::Kind::GetAttr, pos);
        n->a = std::move(e);
        if (cur().type == Tok::Int) {  // foo.0 is foo[0]
          n->kind = Expr::Kind::GetItem;
          auto idx = node(Expr::Kind::Literal, pos);
          const Token& it = toks[p++];
          try {
            idx->literal = Value::integer(std::stoll(it.text));
          } catch (const std::exception&) {  // out_of_range: found by fuzz_chat_template
            error(it.pos, "number out of range: " + it.text);
          }
          n->b = std::move(idx);
        } else {
          n->name = expect_name();
        }
        e = std::move(n);
      } else if (is_op("[")) {
        Pos pos = cur().pos;
        ++p;
        ExprPtr parts[3];
        int n_colons = 0;
        while (!is_op("]")) {
          if (is_op(":")) {
            if (++n_colons > 2) error(cur().pos, "too many ':' in slice");
            ++p;
            continue;
          }
          if (parts[n_colons]) error(cur().pos, "expected ']' or ':'");
          parts[n_colons] = expression();
        }
        ++p;
        auto n = node(n_colons ? Expr::Kind::Slice : Expr::Kind::GetItem, pos);
        n->a = std::move(e);
        if (!n_colons && !parts[0]) error(pos, "empty subscript");
        n->b = std::move(parts[0]);
        n->c = std::move(parts[1]);
        n->args.push_back(std::move(parts[2]));
        e = std::move(n);
      } else if (is_op("(")) {
        auto n = node(Expr::Kind::Call, cur().pos);
        n->a = std::move(e);
        call_args(*n);
        e = std::move(n);
      } else {
        return e;
      }
    }
  }
  ExprPtr filter_expr(ExprPtr e) {
    while (true) {
      DepthGuard g(*this, cur().pos);
      if (is_op("|")) {
        ++p;
        Pos pos = cur().pos;
        auto n = node(Expr::Kind::Filter, pos);
        n->name = expect_name();
        while (is_op(".")) {
          ++p;
          n->name += "." + expect_name();
        }
        if (!has_filter(n->name)) unsupported(name, pos, "filter '" + n->name + "'");
        n->a = std::move(e);
        if (is_op("(")) call_args(*n);
        e = std::move(n);
      } else if (is_name("is")) {
        ++p;
        Pos pos = cur().pos;
        auto n = node(Expr::Kind::Test, pos);
        if (is_name("not")) {
          n->negate = true;
          ++p;
        }
        n->name = expect_name();
        if (!has_test(n->name)) unsupported(name, pos, "test '" + n->name + "'");
        n->a = std::move(e);
        if (is_op("(")) {
          call_args(*n);
        } else if ((cur().type == Tok::Name || cur().type == Tok::String || cur().type == Tok::Int ||
                    cur().type == Tok::Float || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          if (is_name("is")) error(cur().pos, "you cannot chain multiple tests with is");
          n->args.push_back(postfix(primary()));
        }
        e = std::move(n);
      } else if (is_op("(")) {
        auto n = node(Expr::Kind::Call, cur().pos);
        n->a = std::move(e);
        call_args(*n);
        e = std::move(n);
      } else {
        return e;
      }
    }
  }

  // ---- statements ----
  std::unique_ptr<Stmt> stmt(Stmt::Kind k, const Pos& pos) {
    auto s = std::make_unique<Stmt>();
    s->kind = k;
    s->pos = pos;
    return s;
  }

  // Parses statements until a block tag named in `ends`; leaves p at that tag's name and
  // returns which one it was.
  std::string body(Body& out, std::initializer_list<const char*> ends) {
    DepthGuard g(*this, cur().pos);
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::Eof) {
        if (ends.size() == 0) return "";
        std::string want;
        for (const char* e : ends) want += (want.empty() ? "'" : " or '") + std::string(e) + "'";
        error(t.pos, "unexpected end of template, expected " + want);
      }
      if (t.type == Tok::Text) {
        auto s = stmt(Stmt::Kind::Text, t.pos);
        s->text = t.text;
        out.push_back(std::move(s));
        ++p;
      } else if (t.type == Tok::VarBegin) {
        auto s = stmt(Stmt::Kind::Output, t.pos);
        ++p;
        s->expr = expression();
        expect(Tok::VarEnd, "'}}'");
        out.push_back(std::move(s));
      } else if (t.type == Tok::BlockBegin) {
        ++p;
        if (cur().type != Tok::Name) error(cur().pos, "expected a statement name, got " + describe(cur()));
        for (const char* e : ends)
          if (cur().text == e) return e;
        out.push_back(statement());
      } else {
        error(t.pos, "unexpected " + describe(t));
      }
    }
  }
  void end_block() { expect(Tok::BlockEnd, "'%}'"); }

  std::unique_ptr<Stmt> statement() {
    Pos pos = cur().pos;
    std::string kw = toks[p++].text;
    if (kw == "if") {
      auto s = stmt(Stmt::Kind::If, pos);
      ExprPtr c = expression();
      end_block();
      while (true) {
        Body b;
        std::string end = body(b, {"elif", "else", "endif"});
        ++p;
        s->branches.emplace_back(std::move(c), std::move(b));
        if (end == "elif") {
          c = expression();
          end_block();
        } else if (end == "else") {
          end_block();
          body(s->else_body, {"endif"});
          ++p;
          end_block();
          return s;
        } else {
          end_block();
          return s;
        }
      }
    }
    if (kw == "for") {
      auto s = stmt(Stmt::Kind::For, pos);
      s->targets.push_back(expect_name());
      while (is_op(",")) {
        ++p;
        s->targets.push_back(expect_name());
      }
      if (!is_name("in")) error(cur().pos, "expected 'in', got " + describe(cur()));
      ++p;
      s->expr = expression(false);
      if (is_op(",")) error(cur().pos, "unsupported: tuple after 'in' in for loop");
      if (is_name("if")) {
        ++p;
        s->cond = expression(false);
      }
      if (is_name("recursive")) unsupported(name, cur().pos, "recursive for loops");
      end_block();
      std::string end = body(s->body, {"endfor", "else"});
      ++p;
      end_block();
      if (end == "else") {
        body(s->else_body, {"endfor"});
        ++p;
        end_block();
      }
      return s;
    }
    if (kw == "set") {
      auto s = stmt(Stmt::Kind::Set, pos);
      s->text = expect_name();
      if (is_op(".")) {
        ++p;
        s->attr = expect_name();
      } else if (is_op(",")) {
        s->targets.push_back(s->text);
        while (is_op(",")) {
          ++p;
          s->targets.push_back(expect_name());
        }
      }
      if (cur().type == Tok::BlockEnd && s->attr.empty() && s->targets.empty()) {
        s->kind = Stmt::Kind::SetBlock;
        end_block();
        body(s->body, {"endset"});
        ++p;
        end_block();
        return s;
      }
      expect_op("=");
      s->expr = expression();
      if (is_op(",")) {  // `set x = a, b` builds a tuple
        auto l = node(Expr::Kind::List, s->expr->pos);
        l->args.push_back(std::move(s->expr));
        while (is_op(",")) {
          ++p;
          l->args.push_back(expression());
        }
        s->expr = std::move(l);
      }
      end_block();
      return s;
    }
    if (kw == "macro") {
      auto s = stmt(Stmt::Kind::Macro, pos);
      s->text = expect_name();
      expect_op("(");
      while (!is_op(")")) {
        if (!s->targets.empty()) expect_op(",");
        s->targets.push_back(expect_name());
        if (is_op("=")) {
          ++p;
          s->defaults.push_back(expression());
        } else {
          if (!s->defaults.empty() && s->defaults.back()) error(cur().pos, "non-default argument follows default argument");
          s->defaults.push_back(nullptr);
        }
      }
      ++p;
      end_block();
      body(s->body, {"endmacro"});
      ++p;
      end_block();
      return s;
    }
    if (kw == "break" || kw == "continue") {
      end_block();
      return stmt(kw == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue, pos);
    }
    if (kw == "generation") {  // transformers' AssistantTracker tag: renders its body
      auto s = stmt(Stmt::Kind::Block, pos);
      end_block();
      body(s->body, {"endgeneration"});
      ++p;
      end_block();
      return s;
    }
    if (kw.rfind("end", 0) == 0 || kw == "elif" || kw == "else")
      error(pos, "unexpected '" + kw + "'");
    unsupported(name, pos, "statement '" + kw + "'");
  }
};

}  // namespace

std::unique_ptr<Template> parse(const std::string& source, const std::string& name) {
  std::vector<Token> toks = lex(source, name);
  Parser ps{toks, name};
  auto t = std::make_unique<Template>();
  t->name = name;
  ps.body(t->body, {});
  return t;
}

}  // namespace kvboost::jinja
