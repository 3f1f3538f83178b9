// Internal: the Jinja2-subset interpreter behind kvboost/chat.h — values, tokens, AST, and the
// entry points of lexer (lexer.cpp), parser (parser.cpp) and evaluator (eval.cpp, builtins.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvboost/chat.h"

namespace kvboost::jinja {

// ---- values: Python's object model, as far as templates see it ----
struct Value;
struct Dict;
struct Interp;
using List = std::vector<Value>;
using Kwargs = std::vector<std::pair<std::string, Value>>;
using NativeFn = std::function<Value(Interp&, List& args, Kwargs& kwargs)>;

struct Callable {
  std::string name;
  NativeFn fn;
};

struct Value {
  // Undefined is Jinja's Undefined: prints as "", is falsy, iterates as empty; `s` keeps the
  // name it stands for, for error messages.
  enum class Kind : uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Callable };
  Kind kind = Kind::Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::shared_ptr<List> list;  // shared: Python lists are references
  std::shared_ptr<Dict> dict;
  std::shared_ptr<Callable> fn;

  static Value undefined(std::string hint = {});
  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value floating(double v);
  static Value string(std::string v);
  static Value make_list(List v = {});
  static Value make_dict();
  static Value callable(std::string name, NativeFn fn);

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_string() const { return kind == Kind::String; }
  bool is_list() const { return kind == Kind::List; }
  bool is_dict() const { return kind == Kind::Dict; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
  bool truthy() const;
  double as_double() const;
  const char* type_name() const;  // Python's: 'str', 'int', 'dict', ...
};

// An insertion-ordered dict with string keys (Python dicts keep insertion order; tojson shows it).
// `is_namespace` marks namespace() objects, the only ones `{% set ns.x = ... %}` may assign.
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;
  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value v);
};

Value from_json(const nlohmann::ordered_json& j);
std::string to_str(const Value& v);   // Python str()
std::string to_repr(const Value& v);  // Python repr()
std::string float_repr(double d);     // Python repr(float)
// json.dumps(v, ensure_ascii, indent (<0: none), separators default as Python, sort_keys).
std::string to_json(const Value& v, bool ensure_ascii, int indent, const std::string& item_sep,
                    const std::string& key_sep, bool sort_keys);
bool values_equal(const Value& a, const Value& b);
// UTF-8 <-> code points (Python str indexes code points). Invalid bytes map to U+FFFD.
std::u32string utf8_decode(std::string_view s);
std::string utf8_encode(std::u32string_view s);
bool py_isspace(char32_t c);

// ---- tokens and AST ----
struct Pos {
  int line = 1, col = 1;
};

enum class Tok : uint8_t {
  Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof,
};
struct Token {
  Tok type;
  std::string text;  // Text data, name, decoded string literal, number text, operator
  Pos pos;
};

// trim_blocks / lstrip_blocks / "-" and "+" whitespace control are applied here, so Text tokens
// hold exactly the bytes to output.
std::vector<Token> lex(const std::string& source, const std::string& name);

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;
struct Expr {
  enum class Kind : uint8_t {
    Literal, Name, List, Dict, GetAttr, GetItem, Slice, Call, Filter, Test,
    Neg, Pos, Not, Binary, And, Or, Compare, CondExpr,
  };
  Kind kind;
  Pos pos;
  Value literal;
  std::string name;  // Name / attribute / filter / test / binary operator
  ExprPtr a, b, c;   // operands (Slice: a=object, b..c=start/stop, args[0]=step)
  std::vector<ExprPtr> args;  // call/filter/test args, list items, dict keys+values interleaved
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;  // Compare: one operator per args entry ("==", "in", "notin", ...)
  bool negate = false;           // Test: `is not`
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;
struct Stmt {
  enum class Kind : uint8_t { Text, Output, If, For, Set, SetBlock, Macro, Break, Continue, Block };
  Kind kind;
  Pos pos;
  std::string text;                  // Text; Set/SetBlock/Macro target name
  std::string attr;                  // Set: `ns.attr` target
  std::vector<std::string> targets;  // For / Set with tuple unpacking; Macro parameter names
  std::vector<ExprPtr> defaults;     // Macro parameter defaults (null where none)
  ExprPtr expr, cond;                // Output/Set value, For iterable + filter
  std::vector<std::pair<ExprPtr, Body>> branches;  // If: (condition, body)...
  Body body, else_body;
};

struct Template {
  std::string name;
  Body body;
};
std::unique_ptr<Template> parse(const std::string& source, const std::string& name);

// ---- evaluation ----
[[noreturn]] void runtime_error(const Interp& in, Pos pos, const std::string& msg);
[[noreturn]] void unsupported(const std::string& tmpl, Pos pos, const std::string& what);
std::string render(const Template& t, const nlohmann::ordered_json& context,
                   const ChatRenderOptions& opts);

// Builtins (builtins.cpp). Names are checked at parse time, as Jinja does at compile time.
bool has_filter(const std::string& name);
bool has_test(const std::string& name);
Value apply_filter(Interp& in, Pos pos, const std::string& name, Value v, List& args, Kwargs& kw);
bool apply_test(Interp& in, Pos pos, const std::string& name, const Value& v, List& args);
// Methods of str/dict/list values (`s.strip()`, `d.items()`); false when `name` is none of them.
bool call_method(Interp& in, Pos pos, Value& obj, const std::string& name, List& args, Kwargs& kw,
                 Value& out);
Value make_global(Interp& in, const std::string& name);  // namespace, range, ...; Undefined if none
// Values a template cannot use (Undefined in arithmetic, attribute of Undefined) end here.
[[noreturn]] void undefined_error(const Interp& in, Pos pos, const Value& v);
Value call_value(Interp& in, Pos pos, const Value& callee, List& args, Kwargs& kw);

// Interpreter state shared by eval.cpp and builtins.cpp.
struct Frame {
  Frame* parent = nullptr;
  std::vector<std::pair<std::string, Value>> vars;
  Value* find(const std::string& k);
  void set(const std::string& k, Value v);
};
struct Interp {
  const Template* tmpl = nullptr;
  const ChatRenderOptions* opts = nullptr;
  Frame* root = nullptr;
  Frame* frame = nullptr;
  std::string* out = nullptr;  // where text goes (swapped while a macro or set block renders)
  int64_t steps = 0;
  int call_depth = 0;
  void step(Pos pos);
};

}  // namespace kvboost::jinja
