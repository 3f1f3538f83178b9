// Evaluator: walks the AST with Jinja's runtime semantics (Undefined, Python operators, loop
// scopes, namespace objects, macros) and guards against hostile templates (step, output and
// call-depth limits).
#include <cmath>
#include <cstring>

#include "jinja.h"

namespace kvboost::jinja {

Value* Frame::find(const std::string& k) {
  for (auto& [name, v] : vars)
    if (name == k) return &v;
  return nullptr;
}
void Frame::set(const std::string& k, Value v) {
  if (Value* x = find(k)) *x = std::move(v);
  else vars.emplace_back(k, std::move(v));
}

static std::string where(const Interp& in, Pos pos) {
  return "chat template '" + in.tmpl->name + "', line " + std::to_string(pos.line) + ": ";
}

void runtime_error(const Interp& in, Pos pos, const std::string& msg) {
  throw ChatTemplateError(ChatTemplateError::Kind::Runtime, where(in, pos) + msg);
}

void unsupported(const std::string& tmpl, Pos pos, const std::string& what) {
  throw ChatTemplateError(ChatTemplateError::Kind::Unsupported,
                          "chat template '" + tmpl + "': unsupported " + what + " at line " +
                              std::to_string(pos.line) + ", column " + std::to_string(pos.col));
}

void undefined_error(const Interp& in, Pos pos, const Value& v) {
  runtime_error(in, pos, v.s.empty() ? "value is undefined" : v.s);
}

void Interp::step(Pos pos) {
  if (++steps > opts->max_steps)
    runtime_error(*this, pos, "template exceeded the limit of " + std::to_string(opts->max_steps) + " steps");
}

namespace {

enum class Flow { Normal, Break, Continue };

[[noreturn]] void type_error(const Interp& in, Pos pos, const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) undefined_error(in, pos, a);
  if (b.is_undefined()) undefined_error(in, pos, b);
  runtime_error(in, pos, "unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" +
                             b.type_name() + "'");
}

struct Eval {
  Interp& in;

  void emit(const std::string& s, Pos pos) {
    in.out->append(s);
    if (in.out->size() > in.opts->max_output_bytes)
      runtime_error(in, pos, "output exceeds the limit of " + std::to_string(in.opts->max_output_bytes) + " bytes");
  }
  void check_size(size_t n, Pos pos) {
    if (n > in.opts->max_output_bytes) runtime_error(in, pos, "value exceeds the size limit");
  }

  Value lookup(const std::string& name) {
    for (Frame* f = in.frame; f; f = f->parent)
      if (Value* v = f->find(name)) return *v;
    Value g = make_global(in, name);
    if (g.is_undefined()) g.s = "'" + name + "' is undefined";
    return g;
  }

  static Value get_attr(const Value& obj, const std::string& name) {
    if (obj.is_dict()) {
      if (const Value* v = obj.dict->find(name)) return *v;
      return Value::undefined("'" + std::string(obj.dict->is_namespace ? "Namespace" : "dict") +
                              " object' has no attribute '" + name + "'");
    }
    return Value::undefined("'" + std::string(obj.type_name()) + " object' has no attribute '" + name + "'");
  }

  Value get_item(const Value& obj, const Value& key, Pos pos) {
    if (obj.is_undefined()) undefined_error(in, pos, obj);
    if (obj.is_dict() && key.is_string()) {
      if (const Value* v = obj.dict->find(key.s)) return *v;
      return Value::undefined("'dict object' has no attribute '" + key.s + "'");
    }
    if ((obj.is_list() || obj.is_string()) && (key.kind == Value::Kind::Int || key.kind == Value::Kind::Bool)) {
      int64_t k = key.kind == Value::Kind::Bool ? int64_t(key.b) : key.i;
      if (obj.is_list()) {
        int64_t n = int64_t(obj.list->size());
        if (k < 0) k += n;
        if (k < 0 || k >= n) return Value::undefined(std::string("'list object' has no element ") + std::to_string(key.i));
        return (*obj.list)[size_t(k)];
      }
      std::u32string u = utf8_decode(obj.s);
      int64_t n = int64_t(u.size());
      if (k < 0) k += n;
      if (k < 0 || k >= n) return Value::undefined("string index out of range");
      return Value::string(utf8_encode(u.substr(size_t(k), 1)));
    }
    return Value::undefined("'" + std::string(obj.type_name()) + " object' has no attribute " + to_repr(key));
  }

  Value slice(const Value& obj, const Expr& e) {
    auto idx = [&](const ExprPtr& x, bool& present) -> int64_t {
      present = false;
      if (!x) return 0;
      Value v = eval(*x);
      if (v.is_none()) return 0;
      if (v.kind != Value::Kind::Int) runtime_error(in, e.pos, "slice indices must be integers or None");
      present = true;
      return v.i;
    };
    bool has_start, has_stop, has_step;
    int64_t start = idx(e.b, has_start), stop = idx(e.c, has_stop), step = idx(e.args[0], has_step);
    if (!has_step) step = 1;
    if (step == 0) runtime_error(in, e.pos, "slice step cannot be zero");
    auto run = [&](int64_t n, auto&& take) {
      // CPython's PySlice_AdjustIndices
      auto adjust = [&](int64_t v, bool present, int64_t dflt) {
        if (!present) return dflt;
        if (v < 0) {
          v += n;
          if (v < 0) v = step < 0 ? -1 : 0;
        } else if (v >= n) {
          v = step < 0 ? n - 1 : n;
        }
        return v;
      };
      int64_t s = adjust(start, has_start, step < 0 ? n - 1 : 0);
      int64_t t = adjust(stop, has_stop, step < 0 ? -1 : n);
      for (int64_t k = s; step > 0 ? k < t : k > t; k += step) take(size_t(k));
    };
    if (obj.is_list()) {
      List l;
      run(int64_t(obj.list->size()), [&](size_t k) { l.push_back((*obj.list)[k]); });
      return Value::make_list(std::move(l));
    }
    if (obj.is_string()) {
      std::u32string u = utf8_decode(obj.s), r;
      run(int64_t(u.size()), [&](size_t k) { r += u[k]; });
      return Value::string(utf8_encode(r));
    }
    if (obj.is_undefined()) undefined_error(in, e.pos, obj);
    runtime_error(in, e.pos, std::string("'") + obj.type_name() + "' object is not subscriptable");
  }

  void eval_args(const Expr& e, List& args, Kwargs& kw) {
    for (const auto& a : e.args) args.push_back(eval(*a));
    for (const auto& [k, a] : e.kwargs) kw.emplace_back(k, eval(*a));
  }

  Value arith(const std::string& op, const Value& a, const Value& b, Pos pos) {
    using K = Value::Kind;
    bool ints = (a.kind == K::Int || a.kind == K::Bool) && (b.kind == K::Int || b.kind == K::Bool);
    int64_t ai = a.kind == K::Bool ? a.b : a.i, bi = b.kind == K::Bool ? b.b : b.i;
    if (op == "~") {
      std::string s = to_str(a) + to_str(b);
      check_size(s.size(), pos);
      return Value::string(std::move(s));
    }
    if (op == "+") {
      if (a.is_string() && b.is_string()) {
        check_size(a.s.size() + b.s.size(), pos);
        return Value::string(a.s + b.s);
      }
      if (a.is_list() && b.is_list()) {
        check_size(a.list->size() + b.list->size(), pos);
        List l = *a.list;
        l.insert(l.end(), b.list->begin(), b.list->end());
        return Value::make_list(std::move(l));
      }
      if (ints) {
        int64_t r;
        if (!__builtin_add_overflow(ai, bi, &r)) return Value::integer(r);
      }
      if (a.is_number() && b.is_number()) return Value::floating(a.as_double() + b.as_double());
      type_error(in, pos, op, a, b);
    }
    if (op == "*") {
      if ((a.is_string() || a.is_list()) && (b.kind == K::Int || b.kind == K::Bool)) return repeat(a, bi, pos);
      if ((b.is_string() || b.is_list()) && (a.kind == K::Int || a.kind == K::Bool)) return repeat(b, ai, pos);
      if (ints) {
        int64_t r;
        if (!__builtin_mul_overflow(ai, bi, &r)) return Value::integer(r);
      }
      if (a.is_number() && b.is_number()) return Value::floating(a.as_double() * b.as_double());
      type_error(in, pos, op, a, b);
    }
    if (!a.is_number() || !b.is_number()) {
      if (op == "%" && a.is_string()) unsupported(in.tmpl->name, pos, "string formatting with '%'");
      type_error(in, pos, op, a, b);
    }
    double x = a.as_double(), y = b.as_double();
    if (op == "-") {
      int64_t r;
      if (ints && !__builtin_sub_overflow(ai, bi, &r)) return Value::integer(r);
      return Value::floating(x - y);
    }
    if (op == "/") {
      if (y == 0) runtime_error(in, pos, "division by zero");
      return Value::floating(x / y);
    }
    if (op == "//" || op == "%") {
      if (y == 0) runtime_error(in, pos, "integer division or modulo by zero");
      if (ints && !(ai == INT64_MIN && bi == -1)) {
        int64_t q = ai / bi, r = ai % bi;
        if (r != 0 && ((r < 0) != (bi < 0))) {
          --q;
          r += bi;
        }
        return Value::integer(op == "//" ? q : r);
      }
      double q = std::floor(x / y);
      return Value::floating(op == "//" ? q : x - q * y);
    }
    if (op == "**") {
      if (ints && bi >= 0) {
        int64_t r = 1;
        for (int64_t k = 0; k < bi; ++k)
          if (__builtin_mul_overflow(r, ai, &r)) runtime_error(in, pos, "integer overflow in '**'");
          else if (r == 0 || r == 1) break;
        return Value::integer(r);
      }
      return Value::floating(std::pow(x, y));
    }
    runtime_error(in, pos, "unknown operator " + op);
  }

  Value repeat(const Value& v, int64_t n, Pos pos) {
    if (n < 0) n = 0;
    size_t unit = v.is_string() ? v.s.size() : v.list->size();
    if (unit && uint64_t(n) > in.opts->max_output_bytes / unit) runtime_error(in, pos, "value exceeds the size limit");
    if (v.is_string()) {
      std::string s;
      for (int64_t k = 0; k < n; ++k) s += v.s;
      return Value::string(std::move(s));
    }
    List l;
    for (int64_t k = 0; k < n; ++k) l.insert(l.end(), v.list->begin(), v.list->end());
    return Value::make_list(std::move(l));
  }

  bool compare(const std::string& op, const Value& a, const Value& b, Pos pos) {
    if (op == "==") return values_equal(a, b);
    if (op == "!=") return !values_equal(a, b);
    if (op == "in" || op == "notin") {
      bool r = false;
      if (b.is_string()) {
        if (!a.is_string()) runtime_error(in, pos, std::string("'in <string>' requires string as left operand, not ") + a.type_name());
        r = b.s.find(a.s) != std::string::npos;
      } else if (b.is_list()) {
        for (const Value& x : *b.list)
          if (values_equal(a, x)) r = true;
      } else if (b.is_dict()) {
        r = a.is_string() && b.dict->find(a.s);
      } else if (!b.is_undefined()) {
        runtime_error(in, pos, std::string("argument of type '") + b.type_name() + "' is not iterable");
      }
      return op == "in" ? r : !r;
    }
    int c;
    if (a.is_number() && b.is_number()) {
      double x = a.as_double(), y = b.as_double();
      c = x < y ? -1 : x > y ? 1 : 0;
    } else if (a.is_string() && b.is_string()) {
      c = a.s.compare(b.s);  // UTF-8 byte order is code point order
    } else {
      type_error(in, pos, "'" + op + "'", a, b);
    }
    if (op == "<") return c < 0;
    if (op == ">") return c > 0;
    if (op == "<=") return c <= 0;
    return c >= 0;
  }

  Value eval(const Expr& e) {
    using K = Expr::Kind;
    switch (e.kind) {
      case K::Literal: return e.literal;
      case K::Name: return lookup(e.name);
      case K::List: {
        List l;
        for (const auto& a : e.args) l.push_back(eval(*a));
        return Value::make_list(std::move(l));
      }
      case K::Dict: {
        Value d = Value::make_dict();
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          Value key = eval(*e.args[k]);
          if (!key.is_string()) unsupported(in.tmpl->name, e.args[k]->pos, std::string("dict key of type '") + key.type_name() + "'");
          d.dict->set(key.s, eval(*e.args[k + 1]));
        }
        return d;
      }
      case K::GetAttr: {
        Value obj = eval(*e.a);
        if (obj.is_undefined()) undefined_error(in, e.pos, obj);
        return get_attr(obj, e.name);
      }
      case K::GetItem: {
        Value obj = eval(*e.a);
        return get_item(obj, eval(*e.b), e.pos);
      }
      case K::Slice: return slice(eval(*e.a), e);
      case K::Call: {
        List args;
        Kwargs kw;
        if (e.a->kind == K::GetAttr) {
          Value obj = eval(*e.a->a);
          if (obj.is_undefined()) undefined_error(in, e.pos, obj);
          eval_args(e, args, kw);
          Value out;
          if ((obj.is_string() || obj.is_list() || (obj.is_dict() && !obj.dict->is_namespace)) &&
              call_method(in, e.a->pos, obj, e.a->name, args, kw, out))
            return out;
          return call_value(in, e.pos, get_attr(obj, e.a->name), args, kw);
        }
        Value callee = eval(*e.a);
        eval_args(e, args, kw);
        return call_value(in, e.pos, callee, args, kw);
      }
      case K::Filter: {
        Value v = eval(*e.a);
        List args;
        Kwargs kw;
        eval_args(e, args, kw);
        return apply_filter(in, e.pos, e.name, std::move(v), args, kw);
      }
      case K::Test: {
        Value v = eval(*e.a);
        List args;
        Kwargs kw;
        eval_args(e, args, kw);
        return Value::boolean(apply_test(in, e.pos, e.name, v, args) != e.negate);
      }
      case K::Neg:
      case K::Pos: {
        Value v = eval(*e.a);
        if (v.kind == Value::Kind::Bool) v = Value::integer(v.b);
        if (v.kind == Value::Kind::Int) {
          if (e.kind == K::Neg && v.i == INT64_MIN) runtime_error(in, e.pos, "integer overflow");
          return e.kind == K::Neg ? Value::integer(-v.i) : v;
        }
        if (v.kind == Value::Kind::Float) return e.kind == K::Neg ? Value::floating(-v.f) : v;
        if (v.is_undefined()) undefined_error(in, e.pos, v);
        runtime_error(in, e.pos, std::string("bad operand type for unary ") + (e.kind == K::Neg ? "-" : "+") + ": '" + v.type_name() + "'");
      }
      case K::Not: return Value::boolean(!eval(*e.a).truthy());
      case K::And: {
        Value a = eval(*e.a);
        return a.truthy() ? eval(*e.b) : a;
      }
      case K::Or: {
        Value a = eval(*e.a);
        return a.truthy() ? a : eval(*e.b);
      }
      case K::Binary: {
        Value a = eval(*e.a);
        Value b = eval(*e.b);
        return arith(e.name, a, b, e.pos);
      }
      case K::Compare: {
        Value left = eval(*e.a);
        for (size_t k = 0; k < e.args.size(); ++k) {
          Value right = eval(*e.args[k]);
          if (!compare(e.ops[k], left, right, e.args[k]->pos)) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case K::CondExpr:
        if (eval(*e.b).truthy()) return eval(*e.a);
        return e.c ? eval(*e.c) : Value::undefined("the inline if-expression evaluated to false and has no else");
    }
    runtime_error(in, e.pos, "unknown expression");
  }

  // Items a for loop walks: list elements, dict keys, string characters.
  List iterate(const Value& v, Pos pos) {
    switch (v.kind) {
      case Value::Kind::Undefined: return {};
      case Value::Kind::List: return *v.list;
      case Value::Kind::Dict: {
        if (v.dict->is_namespace) break;
        List l;
        for (const auto& kv : v.dict->items) l.push_back(Value::string(kv.first));
        return l;
      }
      case Value::Kind::String: {
        List l;
        for (char32_t c : utf8_decode(v.s)) l.push_back(Value::string(utf8_encode(std::u32string(1, c))));
        return l;
      }
      default: break;
    }
    runtime_error(in, pos, std::string("'") + v.type_name() + "' object is not iterable");
  }

  void bind(Frame& f, const std::vector<std::string>& targets, const Value& item, Pos pos) {
    if (targets.size() == 1) {
      f.set(targets[0], item);
      return;
    }
    List parts = iterate(item, pos);
    if (parts.size() != targets.size())
      runtime_error(in, pos, "cannot unpack " + std::to_string(parts.size()) + " values into " +
                                 std::to_string(targets.size()) + " names");
    for (size_t k = 0; k < targets.size(); ++k) f.set(targets[k], parts[k]);
  }

  Flow exec_body(const Body& body) {
    for (const auto& s : body) {
      Flow f = exec(*s);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  std::string capture(const Body& body) {
    std::string buf;
    std::string* saved = in.out;
    in.out = &buf;
    try {
      exec_body(body);
    } catch (...) {
      in.out = saved;
      throw;
    }
    in.out = saved;
    return buf;
  }

  Flow exec_for(const Stmt& s) {
    List items = iterate(eval(*s.expr), s.expr->pos);
    Frame frame;
    frame.parent = in.frame;
    struct Restore {
      Interp& in;
      Frame* f;
      ~Restore() { in.frame = f; }
    } restore{in, in.frame};
    in.frame = &frame;
    if (s.cond) {  // `for x in xs if cond`: filtered before the loop, so loop.length counts only kept items
      List kept;
      for (const Value& item : items) {
        in.step(s.pos);
        bind(frame, s.targets, item, s.pos);
        if (eval(*s.cond).truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    size_t n = items.size();
    for (size_t k = 0; k < n; ++k) {
      in.step(s.pos);
      frame.vars.clear();  // as in Jinja, a `set` in one iteration is not seen by the next
      bind(frame, s.targets, items[k], s.pos);
      Value loop = Value::make_dict();
      Dict& d = *loop.dict;
      d.set("index", Value::integer(int64_t(k) + 1));
      d.set("index0", Value::integer(int64_t(k)));
      d.set("revindex", Value::integer(int64_t(n - k)));
      d.set("revindex0", Value::integer(int64_t(n - k) - 1));
      d.set("first", Value::boolean(k == 0));
      d.set("last", Value::boolean(k + 1 == n));
      d.set("length", Value::integer(int64_t(n)));
      d.set("previtem", k > 0 ? items[k - 1] : Value::undefined("there is no previous item"));
      d.set("nextitem", k + 1 < n ? items[k + 1] : Value::undefined("there is no next item"));
      d.set("depth", Value::integer(1));
      d.set("depth0", Value::integer(0));
      frame.set("loop", std::move(loop));
      if (exec_body(s.body) == Flow::Break) break;
    }
    if (n == 0) exec_body(s.else_body);
    return Flow::Normal;
  }

  Value call_macro(const Stmt& m, List& args, Kwargs& kw, Pos pos) {
    if (in.call_depth >= in.opts->max_call_depth)
      runtime_error(in, pos, "macro calls nested deeper than " + std::to_string(in.opts->max_call_depth));
    if (args.size() > m.targets.size())
      runtime_error(in, pos, "macro '" + m.text + "' takes " + std::to_string(m.targets.size()) + " arguments, got " + std::to_string(args.size()));
    Frame frame;
    frame.parent = in.root;  // macros see the template's top level, not the caller's locals
    Frame* saved = in.frame;
    in.frame = &frame;
    ++in.call_depth;
    try {
      for (size_t k = 0; k < m.targets.size(); ++k) {
        const Value* given = k < args.size() ? &args[k] : nullptr;
        for (const auto& [name, v] : kw)
          if (name == m.targets[k]) given = &v;
        if (given) frame.set(m.targets[k], *given);
        else if (m.defaults[k]) frame.set(m.targets[k], eval(*m.defaults[k]));
        else frame.set(m.targets[k], Value::undefined("missing argument '" + m.targets[k] + "' of macro '" + m.text + "'"));
      }
      for (const auto& [name, v] : kw) {
        bool known = false;
        for (const auto& t : m.targets) known |= t == name;
        if (!known) runtime_error(in, pos, "macro '" + m.text + "' takes no keyword argument '" + name + "'");
      }
      std::string text = capture(m.body);
      in.frame = saved;
      --in.call_depth;
      return Value::string(std::move(text));
    } catch (...) {
      in.frame = saved;
      --in.call_depth;
      throw;
    }
  }

  Flow exec(const Stmt& s) {
    in.step(s.pos);
    switch (s.kind) {
      case Stmt::Kind::Text: emit(s.text, s.pos); return Flow::Normal;
      case Stmt::Kind::Output: emit(to_str(eval(*s.expr)), s.pos); return Flow::Normal;
      case Stmt::Kind::If:
        for (const auto& [cond, body] : s.branches)
          if (eval(*cond).truthy()) return exec_body(body);
        return exec_body(s.else_body);
      case Stmt::Kind::For: return exec_for(s);
      case Stmt::Kind::Set: {
        Value v = eval(*s.expr);
        if (!s.attr.empty()) {
          Value target = lookup(s.text);
          if (!target.is_dict() || !target.dict->is_namespace)
            runtime_error(in, s.pos, "cannot assign attribute on non-namespace object '" + s.text + "'");
          target.dict->set(s.attr, std::move(v));
        } else if (!s.targets.empty()) {
          bind(*in.frame, s.targets, v, s.pos);
        } else {
          in.frame->set(s.text, std::move(v));
        }
        return Flow::Normal;
      }
      case Stmt::Kind::SetBlock: in.frame->set(s.text, Value::string(capture(s.body))); return Flow::Normal;
      case Stmt::Kind::Macro: {
        const Stmt* m = &s;
        in.frame->set(s.text, Value::callable(s.text, [m](Interp& ip, List& args, Kwargs& kw) {
          return Eval{ip}.call_macro(*m, args, kw, m->pos);
        }));
        return Flow::Normal;
      }
      case Stmt::Kind::Break: return Flow::Break;
      case Stmt::Kind::Continue: return Flow::Continue;
      case Stmt::Kind::Block: return exec_body(s.body);
    }
    return Flow::Normal;
  }
};

}  // namespace

Value call_value(Interp& in, Pos pos, const Value& callee, List& args, Kwargs& kw) {
  if (callee.kind != Value::Kind::Callable) {
    if (callee.is_undefined()) undefined_error(in, pos, callee);
    runtime_error(in, pos, std::string("'") + callee.type_name() + "' object is not callable");
  }
  try {
    return callee.fn->fn(in, args, kw);
  } catch (const ChatTemplateError& e) {
    if (e.kind() != ChatTemplateError::Kind::Runtime || std::strncmp(e.what(), "chat template '", 15) == 0) throw;
    runtime_error(in, pos, e.what());
  }
}

std::string render(const Template& t, const nlohmann::ordered_json& context, const ChatRenderOptions& opts) {
  if (!context.is_object())
    throw ChatTemplateError(ChatTemplateError::Kind::Runtime,
                            "chat template '" + t.name + "': the render context must be a JSON object");
  Frame root;
  std::string out;
  Interp in;
  in.tmpl = &t;
  in.opts = &opts;
  in.root = &root;
  in.frame = &root;
  in.out = &out;
  for (auto it = context.begin(); it != context.end(); ++it) root.set(it.key(), from_json(it.value()));
  Eval{in}.exec_body(t.body);
  return out;
}

}  // namespace kvboost::jinja
