// Builtins: Jinja filters and tests, Python str/dict methods, and the globals templates call
// (raise_exception, strftime_now, namespace, range, dict). Behaviour follows jinja2/filters.py,
// jinja2/tests.py and CPython's str methods.
#include <algorithm>
#include <cmath>
#include <ctime>
#include <set>

#include "jinja.h"

namespace kvboost::jinja {
namespace {

using K = Value::Kind;

// Positional-or-keyword argument `idx`/`name`, or null.
const Value* arg(List& args, Kwargs& kw, size_t idx, const char* name) {
  for (auto& [k, v] : kw)
    if (k == name) return &v;
  return idx < args.size() ? &args[idx] : nullptr;
}

std::string need_str(Interp& in, Pos pos, const Value* v, const char* what) {
  if (!v || !v->is_string()) runtime_error(in, pos, std::string(what) + " must be a string");
  return v->s;
}

int64_t length_of(Interp& in, Pos pos, const Value& v) {
  switch (v.kind) {
    case K::String: return int64_t(utf8_decode(v.s).size());
    case K::List: return int64_t(v.list->size());
    case K::Dict: return int64_t(v.dict->items.size());
    case K::Undefined: return 0;
    default: runtime_error(in, pos, std::string("object of type '") + v.type_name() + "' has no len()");
  }
}

// str.strip family: no chars = Python whitespace; otherwise the set of code points in `chars`.
std::string strip(const std::string& s, const Value* chars, bool left, bool right) {
  std::u32string u = utf8_decode(s), set;
  bool ws = !chars || chars->is_none() || chars->is_undefined();
  if (!ws) set = utf8_decode(chars->s);
  auto drop = [&](char32_t c) { return ws ? py_isspace(c) : set.find(c) != std::u32string::npos; };
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && drop(u[b])) ++b;
  if (right)
    while (e > b && drop(u[e - 1])) --e;
  return utf8_encode(std::u32string_view(u).substr(b, e - b));
}

std::string ascii_case(std::string s, bool upper) {
  for (char& c : s) c = char(upper ? std::toupper((unsigned char)c) : std::tolower((unsigned char)c));
  return s;
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  if (from.empty()) {  // Python inserts `to` around every character
    std::u32string u = utf8_decode(s);
    std::string out;
    int64_t n = 0;
    for (size_t k = 0; k <= u.size(); ++k) {
      if (count < 0 || n < count) {
        out += to;
        ++n;
      }
      if (k < u.size()) out += utf8_encode(u.substr(k, 1));
    }
    return out;
  }
  std::string out;
  size_t p = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    size_t q = s.find(from, p);
    if (q == std::string::npos) break;
    out.append(s, p, q - p);
    out += to;
    p = q + from.size();
    ++n;
  }
  out.append(s, p, std::string::npos);
  return out;
}

Value split(Interp& in, Pos pos, const std::string& s, const Value* sep, int64_t maxsplit) {
  List parts;
  if (!sep || sep->is_none()) {  // runs of whitespace, no empty strings
    std::u32string u = utf8_decode(s);
    size_t k = 0;
    while (k < u.size()) {
      while (k < u.size() && py_isspace(u[k])) ++k;
      if (k >= u.size()) break;
      if (maxsplit >= 0 && int64_t(parts.size()) == maxsplit) {
        size_t e = u.size();
        while (e > k && py_isspace(u[e - 1])) --e;
        parts.push_back(Value::string(utf8_encode(u.substr(k, e - k))));
        break;
      }
      size_t b = k;
      while (k < u.size() && !py_isspace(u[k])) ++k;
      parts.push_back(Value::string(utf8_encode(u.substr(b, k - b))));
    }
    return Value::make_list(std::move(parts));
  }
  std::string d = need_str(in, pos, sep, "split() separator");
  if (d.empty()) runtime_error(in, pos, "empty separator");
  size_t p = 0;
  while (maxsplit < 0 || int64_t(parts.size()) < maxsplit) {
    size_t q = s.find(d, p);
    if (q == std::string::npos) break;
    parts.push_back(Value::string(s.substr(p, q - p)));
    p = q + d.size();
  }
  parts.push_back(Value::string(s.substr(p)));
  return Value::make_list(std::move(parts));
}

// str.format with positional `{}` / `{0}` and keyword `{name}` fields (no format specs).
std::string format(Interp& in, Pos pos, const std::string& f, List& args, Kwargs& kw) {
  std::string out;
  size_t auto_idx = 0;
  for (size_t k = 0; k < f.size(); ++k) {
    char c = f[k];
    if (c == '{' && k + 1 < f.size() && f[k + 1] == '{') {
      out += '{';
      ++k;
    } else if (c == '}' && k + 1 < f.size() && f[k + 1] == '}') {
      out += '}';
      ++k;
    } else if (c == '{') {
      size_t e = f.find('}', k);
      if (e == std::string::npos) runtime_error(in, pos, "format(): single '{' in format string");
      std::string field = f.substr(k + 1, e - k - 1);
      if (field.find_first_of(":!.[") != std::string::npos) unsupported(in.tmpl->name, pos, "format() field '{" + field + "}'");
      const Value* v = nullptr;
      if (field.empty()) {
        v = auto_idx < args.size() ? &args[auto_idx] : nullptr;
        ++auto_idx;
      } else if (std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
        size_t i = std::stoul(field);
        v = i < args.size() ? &args[i] : nullptr;
      } else {
        for (auto& [name, x] : kw)
          if (name == field) v = &x;
      }
      if (!v) runtime_error(in, pos, "format(): no argument for '{" + field + "}'");
      out += to_str(*v);
      k = e;
    } else {
      out += c;
    }
  }
  return out;
}

std::string tojson(Interp& in, Pos pos, const Value& v, List& args, Kwargs& kw) {
  // transformers: json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
  const Value* ea = arg(args, kw, 0, "ensure_ascii");
  const Value* ind = arg(args, kw, 1, "indent");
  const Value* seps = arg(args, kw, 2, "separators");
  const Value* sk = arg(args, kw, 3, "sort_keys");
  int indent = -1;
  if (ind && !ind->is_none()) {
    if (ind->kind == K::Int) indent = int(std::clamp<int64_t>(ind->i, 0, 64));
    else unsupported(in.tmpl->name, pos, "tojson indent of type '" + std::string(ind->type_name()) + "'");
  }
  std::string isep = indent >= 0 ? "," : ", ", ksep = ": ";
  if (seps && !seps->is_none()) {
    if (!seps->is_list() || seps->list->size() != 2 || !(*seps->list)[0].is_string() || !(*seps->list)[1].is_string())
      runtime_error(in, pos, "tojson separators must be a pair of strings");
    isep = (*seps->list)[0].s;
    ksep = (*seps->list)[1].s;
  }
  return to_json(v, ea && ea->truthy(), indent, isep, ksep, sk && sk->truthy());
}

Value attribute_of(Interp& in, Pos pos, const Value& item, const std::string& path) {
  Value cur = item;
  size_t p = 0;
  while (true) {  // "a.b" walks nested attributes, as Jinja's make_attrgetter does
    size_t q = path.find('.', p);
    std::string part = path.substr(p, q == std::string::npos ? std::string::npos : q - p);
    if (cur.is_dict()) {
      const Value* v = cur.dict->find(part);
      cur = v ? *v : Value::undefined("'dict object' has no attribute '" + part + "'");
    } else if (cur.is_list() && !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit)) {
      size_t i = std::stoul(part);
      cur = i < cur.list->size() ? (*cur.list)[i] : Value::undefined();
    } else {
      cur = Value::undefined("'" + std::string(cur.type_name()) + " object' has no attribute '" + part + "'");
    }
    if (q == std::string::npos) return cur;
    p = q + 1;
  }
}

const std::set<std::string>& filter_names() {
  static const std::set<std::string> s = {
      "trim", "length", "count", "upper", "lower", "tojson", "string", "join", "default", "d",
      "first", "last", "items", "selectattr", "rejectattr", "select", "reject", "map", "replace",
      "capitalize", "title", "list", "reverse", "int", "float", "abs", "safe", "indent", "unique",
      "sum", "wordcount", "e", "escape", "sort"};
  return s;
}

const std::set<std::string>& test_names() {
  static const std::set<std::string> s = {
      "defined", "undefined", "none", "string", "mapping", "iterable", "sequence", "number",
      "integer", "float", "boolean", "true", "false", "equalto", "eq", "==", "ne", "!=", "lt", "<",
      "le", "<=", "gt", ">", "ge", ">=", "in", "odd", "even", "divisibleby", "callable", "lower",
      "upper", "sameas"};
  return s;
}

}  // namespace

bool has_filter(const std::string& name) { return filter_names().count(name) > 0; }
bool has_test(const std::string& name) { return test_names().count(name) > 0; }

bool apply_test(Interp& in, Pos pos, const std::string& t, const Value& v, List& args) {
  auto a0 = [&]() -> const Value& {
    if (args.empty()) runtime_error(in, pos, "test '" + t + "' needs an argument");
    return args[0];
  };
  if (t == "defined") return !v.is_undefined();
  if (t == "undefined") return v.is_undefined();
  if (t == "none") return v.is_none();
  if (t == "string") return v.is_string();
  if (t == "mapping") return v.is_dict() && !v.dict->is_namespace;
  if (t == "iterable") return v.is_string() || v.is_list() || (v.is_dict() && !v.dict->is_namespace) || v.is_undefined();
  if (t == "sequence") return v.is_string() || v.is_list() || (v.is_dict() && !v.dict->is_namespace);
  if (t == "number") return v.is_number();
  if (t == "integer") return v.kind == K::Int;
  if (t == "float") return v.kind == K::Float;
  if (t == "boolean") return v.kind == K::Bool;
  if (t == "true") return v.kind == K::Bool && v.b;
  if (t == "false") return v.kind == K::Bool && !v.b;
  if (t == "callable") return v.kind == K::Callable;
  if (t == "equalto" || t == "eq" || t == "==") return values_equal(v, a0());
  if (t == "ne" || t == "!=") return !values_equal(v, a0());
  if (t == "sameas") return values_equal(v, a0()) && v.kind == a0().kind;
  if (t == "lower") return v.is_string() && ascii_case(v.s, false) == v.s;
  if (t == "upper") return v.is_string() && ascii_case(v.s, true) == v.s;
  if (t == "in") {
    const Value& c = a0();
    if (c.is_string()) return v.is_string() && c.s.find(v.s) != std::string::npos;
    if (c.is_list()) return std::any_of(c.list->begin(), c.list->end(), [&](const Value& x) { return values_equal(v, x); });
    if (c.is_dict()) return v.is_string() && c.dict->find(v.s);
    return false;
  }
  if (t == "odd" || t == "even" || t == "divisibleby") {
    if (v.kind != K::Int) runtime_error(in, pos, "test '" + t + "' needs an integer");
    if (t == "odd") return v.i % 2 != 0;
    if (t == "even") return v.i % 2 == 0;
    const Value& d = a0();
    if (d.kind != K::Int || d.i == 0) runtime_error(in, pos, "divisibleby needs a non-zero integer");
    return v.i % d.i == 0;
  }
  double x = v.as_double(), y = a0().as_double();
  if (!(v.is_number() && a0().is_number()) && !(v.is_string() && a0().is_string()))
    runtime_error(in, pos, "test '" + t + "' cannot compare '" + v.type_name() + "' and '" + a0().type_name() + "'");
  int c = v.is_string() ? v.s.compare(a0().s) : (x < y ? -1 : x > y ? 1 : 0);
  if (t == "lt" || t == "<") return c < 0;
  if (t == "le" || t == "<=") return c <= 0;
  if (t == "gt" || t == ">") return c > 0;
  return c >= 0;
}

Value apply_filter(Interp& in, Pos pos, const std::string& f, Value v, List& args, Kwargs& kw) {
  auto str_in = [&]() {
    if (v.is_undefined() && f != "string" && f != "default" && f != "d") return std::string();
    return to_str(v);
  };
  auto list_in = [&](const char* what) -> List {
    if (v.is_list()) return *v.list;
    if (v.is_undefined()) return {};
    if (v.is_dict()) {
      List l;
      for (const auto& kv : v.dict->items) l.push_back(Value::string(kv.first));
      return l;
    }
    if (v.is_string()) {
      List l;
      for (char32_t c : utf8_decode(v.s)) l.push_back(Value::string(utf8_encode(std::u32string(1, c))));
      return l;
    }
    runtime_error(in, pos, std::string("filter '") + what + "' needs a sequence, got '" + v.type_name() + "'");
  };
  if (f == "safe" || f == "e" || f == "escape") {
    if (f != "safe") unsupported(in.tmpl->name, pos, "filter '" + f + "' (autoescape is off in chat templates)");
    return v;
  }
  if (f == "trim") return Value::string(strip(str_in(), arg(args, kw, 0, "chars"), true, true));
  if (f == "length" || f == "count") return Value::integer(length_of(in, pos, v));
  if (f == "upper" || f == "lower") return Value::string(ascii_case(str_in(), f == "upper"));
  if (f == "capitalize") {
    std::string s = ascii_case(str_in(), false);
    if (!s.empty()) s[0] = char(std::toupper((unsigned char)s[0]));
    return Value::string(s);
  }
  if (f == "title") {
    std::string s = str_in();
    bool start = true;
    for (char& c : s) {
      bool alpha = std::isalpha((unsigned char)c);
      c = char(start ? std::toupper((unsigned char)c) : std::tolower((unsigned char)c));
      start = !alpha;
    }
    return Value::string(s);
  }
  if (f == "tojson") return Value::string(tojson(in, pos, v, args, kw));
  if (f == "string") return Value::string(to_str(v));
  if (f == "default" || f == "d") {
    const Value* dflt = arg(args, kw, 0, "default_value");
    const Value* boolean = arg(args, kw, 1, "boolean");
    bool use = v.is_undefined() || (boolean && boolean->truthy() && !v.truthy());
    return use ? (dflt ? *dflt : Value::string("")) : v;
  }
  if (f == "first" || f == "last") {
    List l = list_in(f.c_str());
    if (l.empty()) return Value::undefined("no " + f + " item, sequence was empty");
    return f == "first" ? l.front() : l.back();
  }
  if (f == "items") {
    if (v.is_undefined()) return Value::make_list();
    if (!v.is_dict()) runtime_error(in, pos, "filter 'items' needs a mapping");
    List l;
    for (const auto& [k, x] : v.dict->items) l.push_back(Value::make_list({Value::string(k), x}));
    return Value::make_list(std::move(l));
  }
  if (f == "list") return Value::make_list(list_in("list"));
  if (f == "reverse") {
    if (v.is_string()) {
      std::u32string u = utf8_decode(v.s);
      std::reverse(u.begin(), u.end());
      return Value::string(utf8_encode(u));
    }
    List l = list_in("reverse");
    std::reverse(l.begin(), l.end());
    return Value::make_list(std::move(l));
  }
  if (f == "join") {
    List l = list_in("join");
    std::string sep = arg(args, kw, 0, "d") ? to_str(*arg(args, kw, 0, "d")) : "";
    const Value* attr = arg(args, kw, 1, "attribute");
    std::string out;
    for (size_t k = 0; k < l.size(); ++k) {
      if (k) out += sep;
      out += to_str(attr ? attribute_of(in, pos, l[k], to_str(*attr)) : l[k]);
    }
    return Value::string(out);
  }
  if (f == "selectattr" || f == "rejectattr" || f == "select" || f == "reject") {
    bool by_attr = f == "selectattr" || f == "rejectattr";
    bool keep = f == "selectattr" || f == "select";
    List l = list_in(f.c_str()), out;
    size_t base = by_attr ? 1 : 0;
    if (by_attr && (args.empty() || !args[0].is_string())) runtime_error(in, pos, "filter '" + f + "' needs an attribute name");
    std::string test = args.size() > base ? need_str(in, pos, &args[base], "test name") : "";
    if (!test.empty() && !has_test(test)) unsupported(in.tmpl->name, pos, "test '" + test + "'");
    List targs(args.begin() + long(std::min(args.size(), base + 1)), args.end());
    for (const Value& item : l) {
      Value x = by_attr ? attribute_of(in, pos, item, args[0].s) : item;
      bool ok = test.empty() ? x.truthy() : apply_test(in, pos, test, x, targs);
      if (ok == keep) out.push_back(item);
    }
    return Value::make_list(std::move(out));
  }
  if (f == "map") {
    List l = list_in("map"), out;
    if (const Value* attr = arg(args, kw, 99, "attribute")) {
      const Value* dflt = arg(args, kw, 99, "default");
      for (const Value& item : l) {
        Value x = attribute_of(in, pos, item, to_str(*attr));
        out.push_back(x.is_undefined() && dflt ? *dflt : x);
      }
    } else {
      if (args.empty() || !args[0].is_string()) runtime_error(in, pos, "filter 'map' needs attribute= or a filter name");
      std::string name = args[0].s;
      if (!has_filter(name)) unsupported(in.tmpl->name, pos, "filter '" + name + "'");
      for (const Value& item : l) {
        List rest(args.begin() + 1, args.end());
        Kwargs kw2 = kw;
        out.push_back(apply_filter(in, pos, name, item, rest, kw2));
      }
    }
    return Value::make_list(std::move(out));
  }
  if (f == "replace") {
    std::string from = need_str(in, pos, arg(args, kw, 0, "old"), "replace() old");
    std::string to = need_str(in, pos, arg(args, kw, 1, "new"), "replace() new");
    const Value* count = arg(args, kw, 2, "count");
    std::string r = replace_all(str_in(), from, to, count && count->kind == K::Int ? count->i : -1);
    if (r.size() > in.opts->max_output_bytes) runtime_error(in, pos, "value exceeds the size limit");
    return Value::string(std::move(r));
  }
  if (f == "int") {
    if (v.kind == K::Int || v.kind == K::Bool) return Value::integer(v.kind == K::Bool ? v.b : v.i);
    if (v.kind == K::Float && std::isfinite(v.f) && std::fabs(v.f) < 9.2e18) return Value::integer(int64_t(v.f));
    if (v.is_string()) {
      try {
        size_t used = 0;
        std::string t = strip(v.s, nullptr, true, true);
        long long x = std::stoll(t, &used);
        if (used == t.size()) return Value::integer(x);
      } catch (const std::exception&) {
      }
    }
    const Value* d = arg(args, kw, 0, "default");
    return d ? *d : Value::integer(0);
  }
  if (f == "float") {
    if (v.is_number()) return Value::floating(v.as_double());
    if (v.is_string()) {
      try {
        return Value::floating(std::stod(v.s));
      } catch (const std::exception&) {
      }
    }
    const Value* d = arg(args, kw, 0, "default");
    return d ? *d : Value::floating(0);
  }
  if (f == "abs") {
    if (v.kind == K::Int) return Value::integer(v.i < 0 ? -v.i : v.i);
    if (v.kind == K::Float) return Value::floating(std::fabs(v.f));
    runtime_error(in, pos, "filter 'abs' needs a number");
  }
  if (f == "indent") {
    const Value* w = arg(args, kw, 0, "width");
    const Value* first = arg(args, kw, 1, "first");
    const Value* blank = arg(args, kw, 2, "blank");
    std::string pad = w ? (w->is_string() ? w->s : std::string(size_t(std::clamp<int64_t>(w->i, 0, 256)), ' ')) : "    ";
    std::string s = str_in(), out;
    size_t p = 0;
    bool first_line = true;
    while (p <= s.size()) {
      size_t q = s.find('\n', p);
      std::string line = s.substr(p, q == std::string::npos ? std::string::npos : q - p);
      bool do_pad = first_line ? (first && first->truthy()) : (!line.empty() || (blank && blank->truthy()));
      out += (do_pad ? pad : "") + line;
      if (q == std::string::npos) break;
      out += '\n';
      p = q + 1;
      first_line = false;
    }
    return Value::string(out);
  }
  if (f == "unique") {
    List l = list_in("unique"), out;
    for (const Value& x : l)
      if (std::none_of(out.begin(), out.end(), [&](const Value& y) { return values_equal(x, y); })) out.push_back(x);
    return Value::make_list(std::move(out));
  }
  if (f == "sum") {
    List l = list_in("sum");
    bool ints = std::all_of(l.begin(), l.end(), [](const Value& x) { return x.kind == K::Int || x.kind == K::Bool; });
    int64_t si = 0;
    double sf = 0;
    for (const Value& x : l) {
      if (!x.is_number()) runtime_error(in, pos, "filter 'sum' needs numbers");
      si += x.kind == K::Bool ? x.b : x.i;
      sf += x.as_double();
    }
    return ints ? Value::integer(si) : Value::floating(sf);
  }
  if (f == "sort") {  // Jinja's sort(reverse=false, case_sensitive=false, attribute=none): stable
    List l = list_in("sort");
    const Value* rev = arg(args, kw, 0, "reverse");
    const Value* cs = arg(args, kw, 1, "case_sensitive");
    const Value* attr = arg(args, kw, 2, "attribute");
    const bool reverse = rev && rev->truthy(), case_sensitive = cs && cs->truthy();
    std::vector<std::pair<Value, size_t>> keyed;
    for (size_t k = 0; k < l.size(); ++k) {
      Value key = attr ? attribute_of(in, pos, l[k], to_str(*attr)) : l[k];
      if (key.is_string() && !case_sensitive) key = Value::string(ascii_case(key.s, false));
      if (!key.is_number() && !key.is_string())
        runtime_error(in, pos, std::string("filter 'sort' cannot order '") + key.type_name() + "' values");
      keyed.emplace_back(std::move(key), k);
    }
    for (size_t k = 1; k < keyed.size(); ++k)
      if (keyed[k].first.is_string() != keyed[0].first.is_string())
        runtime_error(in, pos, std::string("filter 'sort' cannot compare '") + keyed[0].first.type_name() + "' and '" +
                                   keyed[k].first.type_name() + "'");
    std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
      const int c = a.first.is_string() ? a.first.s.compare(b.first.s)
                                        : (a.first.as_double() < b.first.as_double() ? -1 : a.first.as_double() > b.first.as_double() ? 1 : 0);
      return reverse ? c > 0 : c < 0;
    });
    List out;
    for (const auto& kv : keyed) out.push_back(l[kv.second]);
    return Value::make_list(std::move(out));
  }
  if (f == "wordcount") return Value::integer(int64_t(split(in, pos, str_in(), nullptr, -1).list->size()));
  unsupported(in.tmpl->name, pos, "filter '" + f + "'");
}

bool call_method(Interp& in, Pos pos, Value& obj, const std::string& m, List& args, Kwargs& kw, Value& out) {
  if (obj.is_string()) {
    const std::string& s = obj.s;
    if (m == "strip" || m == "lstrip" || m == "rstrip") {
      out = Value::string(strip(s, arg(args, kw, 0, "chars"), m != "rstrip", m != "lstrip"));
      return true;
    }
    if (m == "split") {
      const Value* mx = arg(args, kw, 1, "maxsplit");
      out = split(in, pos, s, arg(args, kw, 0, "sep"), mx && mx->kind == K::Int ? mx->i : -1);
      return true;
    }
    if (m == "startswith" || m == "endswith") {
      const Value* p = arg(args, kw, 0, "prefix");
      List cands = p && p->is_list() ? *p->list : List{p ? *p : Value()};
      bool r = false;
      for (const Value& c : cands) {
        std::string x = need_str(in, pos, &c, (m + "() argument").c_str());
        r |= m == "startswith" ? s.compare(0, x.size(), x) == 0 && s.size() >= x.size()
                               : s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
      }
      out = Value::boolean(r);
      return true;
    }
    if (m == "upper" || m == "lower") {
      out = Value::string(ascii_case(s, m == "upper"));
      return true;
    }
    if (m == "title" || m == "capitalize" || m == "replace") {
      out = apply_filter(in, pos, m, obj, args, kw);
      return true;
    }
    if (m == "format") {
      out = Value::string(format(in, pos, s, args, kw));
      return true;
    }
    if (m == "join") {
      if (args.empty() || !args[0].is_list()) runtime_error(in, pos, "join() needs a list");
      std::string r;
      for (size_t k = 0; k < args[0].list->size(); ++k) r += (k ? s : "") + need_str(in, pos, &(*args[0].list)[k], "join() item");
      out = Value::string(r);
      return true;
    }
    if (m == "find" || m == "count") {
      std::string x = need_str(in, pos, arg(args, kw, 0, "sub"), (m + "() argument").c_str());
      if (m == "find") {
        size_t q = s.find(x);
        out = Value::integer(q == std::string::npos ? -1 : int64_t(utf8_decode(s.substr(0, q)).size()));
      } else {
        int64_t n = 0;
        if (x.empty()) n = int64_t(utf8_decode(s).size()) + 1;
        else
          for (size_t q = s.find(x); q != std::string::npos; q = s.find(x, q + x.size())) ++n;
        out = Value::integer(n);
      }
      return true;
    }
    unsupported(in.tmpl->name, pos, "string method '" + m + "'");
  }
  if (obj.is_dict()) {
    if (m == "get") {
      const Value* k = arg(args, kw, 0, "key");
      const Value* found = k && k->is_string() ? obj.dict->find(k->s) : nullptr;
      const Value* d = arg(args, kw, 1, "default");
      out = found ? *found : d ? *d : Value::none();
      return true;
    }
    if (m == "items" || m == "keys" || m == "values") {
      List l;
      for (const auto& [k, x] : obj.dict->items)
        l.push_back(m == "items" ? Value::make_list({Value::string(k), x}) : m == "keys" ? Value::string(k) : x);
      out = Value::make_list(std::move(l));
      return true;
    }
    if (obj.dict->find(m)) return false;  // a callable stored under that key
    unsupported(in.tmpl->name, pos, "dict method '" + m + "'");
  }
  if (obj.is_list()) {
    if (m == "index" || m == "count") {
      const Value* x = arg(args, kw, 0, "value");
      int64_t n = 0;
      for (size_t k = 0; k < obj.list->size(); ++k)
        if (x && values_equal((*obj.list)[k], *x)) {
          if (m == "index") {
            out = Value::integer(int64_t(k));
            return true;
          }
          ++n;
        }
      if (m == "index") runtime_error(in, pos, "list.index(x): x not in list");
      out = Value::integer(n);
      return true;
    }
    // append/pop/... mutate: transformers' ImmutableSandboxedEnvironment forbids them too.
    unsupported(in.tmpl->name, pos, "list method '" + m + "' (lists are immutable in chat templates)");
  }
  return false;
}

Value make_global(Interp& in, const std::string& name) {
  if (name == "raise_exception")
    return Value::callable(name, [](Interp& ip, List& args, Kwargs&) -> Value {
      std::string msg = args.empty() ? "" : to_str(args[0]);
      throw ChatTemplateError(ChatTemplateError::Kind::Raised,
                              "chat template '" + ip.tmpl->name + "' raised an exception: " + msg);
    });
  if (name == "strftime_now")
    return Value::callable(name, [](Interp& ip, List& args, Kwargs&) -> Value {
      if (args.empty() || !args[0].is_string()) throw ChatTemplateError(ChatTemplateError::Kind::Runtime, "strftime_now() needs a format string");
      std::tm tm{};
      if (ip.opts->now) {
        tm = *ip.opts->now;
      } else {
        std::time_t t = std::time(nullptr);
        localtime_r(&t, &tm);
      }
      std::string fmt = args[0].s;
      if (fmt.empty()) return Value::string("");
      char buf[512];
      size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
      if (n == 0) throw ChatTemplateError(ChatTemplateError::Kind::Runtime, "strftime_now(): format too long");
      return Value::string(std::string(buf, n));
    });
  if (name == "namespace" || name == "dict")
    return Value::callable(name, [name](Interp& ip, List& args, Kwargs& kw) -> Value {
      Value d = Value::make_dict();
      d.dict->is_namespace = name == "namespace";
      for (const Value& a : args) {
        if (!a.is_dict()) throw ChatTemplateError(ChatTemplateError::Kind::Runtime, name + "() positional argument must be a dict");
        for (const auto& [k, v] : a.dict->items) d.dict->set(k, v);
      }
      for (auto& [k, v] : kw) d.dict->set(k, v);
      return d;
    });
  if (name == "range")
    return Value::callable(name, [](Interp& ip, List& args, Kwargs&) -> Value {
      int64_t a = 0, b = 0, step = 1;
      for (const Value& x : args)
        if (x.kind != K::Int) throw ChatTemplateError(ChatTemplateError::Kind::Runtime, "range() needs integers");
      if (args.size() == 1) b = args[0].i;
      else if (args.size() >= 2) a = args[0].i, b = args[1].i;
      if (args.size() == 3) step = args[2].i;
      if (args.empty() || args.size() > 3 || step == 0) throw ChatTemplateError(ChatTemplateError::Kind::Runtime, "range() takes 1 to 3 integers, step not 0");
      List l;
      for (int64_t k = a; step > 0 ? k < b : k > b; k += step) {
        if (int64_t(l.size()) >= ip.opts->max_steps) throw ChatTemplateError(ChatTemplateError::Kind::Runtime, "range() too long");
        l.push_back(Value::integer(k));
      }
      return Value::make_list(std::move(l));
    });
  return Value::undefined();
}

}  // namespace kvboost::jinja
