// JSON (any value) and JSON Schema as GBNF. The schema converter emits one rule per object,
// $ref and primitive, in the spirit of llama.cpp's json-schema-to-grammar: properties in the
// schema's order (required ones always, optional ones may be skipped), bounded whitespace, and
// a 400-worthy UnsupportedFeature for every keyword it cannot guarantee.
#include <map>
#include <set>

#include "kvboost/grammar.h"

namespace kvboost::grammar {

using ojson = nlohmann::ordered_json;

namespace {

const char* kJsonRules = R"(value ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws ( string ws ":" ws value ws ( "," ws string ws ":" ws value ws )* )? "}"
array ::= "[" ws ( value ws ( "," ws value ws )* )? "]"
string ::= "\"" char* "\""
char ::= [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )
number ::= "-"? ( "0" | [1-9] [0-9]{0,15} ) ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,2} )?
ws ::= | " " | "\n" " "{0,8}
)";

const std::set<std::string>& annotation_keys() {
  static const std::set<std::string> k = {"title", "description", "default", "examples", "$schema", "$id", "$comment",
                                          "deprecated", "readOnly", "writeOnly", "$defs", "definitions", "strict",
                                          "name", "discriminator", "x-order"};
  return k;
}
const std::set<std::string>& supported_keys() {
  static const std::set<std::string> k = {
      "type", "properties", "required", "additionalProperties", "enum", "const", "items", "prefixItems", "minItems",
      "maxItems", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "pattern",
      "format", "$ref", "anyOf", "oneOf", "allOf", "nullable", "uniqueItems"};
  return k;
}

std::string dec(int64_t v) { return std::to_string(v); }

// Non-negative integers [lo, hi] of the same number of digits, as a GBNF expression.
std::string same_len_range(const std::string& a, const std::string& b) {
  if (a.size() == 1) return a == b ? "\"" + a + "\"" : "[" + a + "-" + b + "]";
  if (a[0] == b[0]) return "\"" + std::string(1, a[0]) + "\" " + same_len_range(a.substr(1), b.substr(1));
  const size_t rest = a.size() - 1;
  const bool a_zeros = a.find_first_not_of('0', 1) == std::string::npos;
  const bool b_nines = b.find_first_not_of('9', 1) == std::string::npos;
  const std::string any_rest = "[0-9]{" + std::to_string(rest) + "}";
  if (a_zeros && b_nines) return "[" + std::string(1, a[0]) + "-" + std::string(1, b[0]) + "] " + any_rest;
  std::vector<std::string> alts;
  char lo_d = a[0], hi_d = b[0];
  if (!a_zeros) {
    alts.push_back("\"" + std::string(1, a[0]) + "\" (" + same_len_range(a.substr(1), std::string(rest, '9')) + ")");
    ++lo_d;
  }
  if (!b_nines) --hi_d;
  if (lo_d <= hi_d) alts.push_back("[" + std::string(1, lo_d) + "-" + std::string(1, hi_d) + "] " + any_rest);
  if (!b_nines)
    alts.push_back("\"" + std::string(1, b[0]) + "\" (" + same_len_range(std::string(rest, '0'), b.substr(1)) + ")");
  std::string out;
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
  return "(" + out + ")";
}

// Non-negative integers in [lo, hi] (hi < 0: unbounded, up to 16 digits), no leading zeros.
std::string uint_range(int64_t lo, int64_t hi) {
  constexpr int kMaxDigits = 16;
  std::vector<std::string> alts;
  const int dlo = int(dec(lo).size());
  const int dhi = hi < 0 ? kMaxDigits : int(dec(hi).size());
  for (int d = dlo; d <= dhi; ++d) {
    const int64_t first = d == 1 ? 0 : [&] {
      int64_t p = 1;
      for (int k = 1; k < d; ++k) p *= 10;
      return p;
    }();
    if (hi < 0 && d > dlo) {  // all d-digit numbers up to kMaxDigits
      alts.push_back("[1-9] [0-9]{" + std::to_string(d - 1) + "," + std::to_string(kMaxDigits - 1) + "}");
      break;
    }
    const int64_t last = d >= 19 ? INT64_MAX : first == 0 ? 9 : first * 10 - 1;
    const int64_t a = std::max(lo, first), b = hi < 0 ? last : std::min(hi, last);
    if (a > b) continue;
    alts.push_back(same_len_range(dec(a), dec(b)));
  }
  std::string out;
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
  return "(" + out + ")";
}

class Converter {
 public:
  Converter(const ojson& root, bool strict) : root_(root), strict_(strict) {}

  std::string run() {
    const std::string top = visit(root_, "root", "#");
    std::string out = "root ::= " + top + "\n";
    for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
    return out;
  }

 private:
  const ojson& root_;
  bool strict_;
  std::map<std::string, std::string> rules_;
  std::map<std::string, std::string> ref_rules_;  // $ref -> rule name

  [[noreturn]] void unsupported(const std::string& feature, const std::string& path, const std::string& why = "") {
    throw UnsupportedFeature(feature, "JSON schema at " + path + ": '" + feature + "' is not supported" +
                                          (why.empty() ? "" : " (" + why + ")"));
  }

  std::string add_rule(const std::string& hint, const std::string& body) {
    std::string base;
    for (char c : hint) base += (std::isalnum(static_cast<unsigned char>(c)) || c == '-') ? c : '-';
    if (base.empty() || base == "root") base = "r";
    // Identical bodies share a rule.
    for (const auto& [n, b] : rules_)
      if (b == body && (n == base || n.rfind(base + "-", 0) == 0)) return n;
    std::string name = base;
    for (int k = 1; rules_.count(name) || name == "root"; ++k) name = base + "-" + std::to_string(k);
    rules_[name] = body;
    return name;
  }

  std::string prim(const std::string& name) {
    static const std::map<std::string, std::string> defs = {
        {"space", R"(" "?)"},
        {"char", R"([^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ))"},
        {"string", R"("\"" char* "\"")"},
        {"integer", R"("-"? ( "0" | [1-9] [0-9]{0,15} ))"},
        {"number", R"("-"? ( "0" | [1-9] [0-9]{0,15} ) ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,2} )?)"},
        {"unumber", R"(( "0" | [1-9] [0-9]{0,15} ) ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,2} )?)"},
        {"boolean", R"("true" | "false")"},
        {"null", R"("null")"},
        {"value", R"(object | array | string | number | "true" | "false" | "null")"},
        {"object", R"("{" space ( string space ":" space value space ( "," space string space ":" space value space )* )? "}")"},
        {"array", R"("[" space ( value space ( "," space value space )* )? "]")"},
        {"date", R"([0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [12] [0-9] | "3" [01] ))"},
        {"time", R"(( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,6} )? ( "Z" | [+-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ))"},
        {"date-time", R"(date "T" time)"},
        {"uuid", R"([0-9a-f]{8} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{12})"},
    };
    if (!rules_.count(name)) {
      rules_[name] = defs.at(name);
      // dependencies
      if (name == "string" || name == "object") prim("char");
      if (name == "object" || name == "array") prim("space"), prim("value"), prim("string");
      if (name == "value") prim("object"), prim("array"), prim("string"), prim("number");
      if (name == "date-time") prim("date"), prim("time");
    }
    return name;
  }

  void check_keys(const ojson& s, const std::string& path) {
    for (auto it = s.begin(); it != s.end(); ++it) {
      const std::string& k = it.key();
      if (annotation_keys().count(k) || supported_keys().count(k)) continue;
      unsupported(k, path);
    }
  }

  const ojson& resolve(const std::string& ref, const std::string& path) {
    if (ref == "#") return root_;
    if (ref.rfind("#/", 0) != 0) unsupported("$ref", path, "only local references '#/...' are supported, got '" + ref + "'");
    const ojson* cur = &root_;
    size_t i = 2;
    while (i <= ref.size()) {
      size_t j = ref.find('/', i);
      if (j == std::string::npos) j = ref.size();
      std::string tok = ref.substr(i, j - i);
      for (size_t p; (p = tok.find("~1")) != std::string::npos;) tok.replace(p, 2, "/");
      for (size_t p; (p = tok.find("~0")) != std::string::npos;) tok.replace(p, 2, "~");
      if (!cur->is_object() || !cur->contains(tok))
        throw UnsupportedFeature("$ref", "JSON schema at " + path + ": $ref '" + ref + "' does not resolve");
      cur = &(*cur)[tok];
      i = j + 1;
    }
    return *cur;
  }

  static bool type_matches(const ojson& v, const std::string& t) {
    if (t == "string") return v.is_string();
    if (t == "integer") return v.is_number_integer() || v.is_number_unsigned() ||
                                (v.is_number_float() && v.get<double>() == std::floor(v.get<double>()));
    if (t == "number") return v.is_number();
    if (t == "boolean") return v.is_boolean();
    if (t == "null") return v.is_null();
    if (t == "array") return v.is_array();
    if (t == "object") return v.is_object();
    return false;
  }

  std::string alts(const std::vector<std::string>& xs) {
    if (xs.size() == 1) return xs[0];
    std::string out = "(";
    for (size_t i = 0; i < xs.size(); ++i) out += (i ? " | " : "") + xs[i];
    return out + ")";
  }

  std::string visit(const ojson& s, const std::string& hint, const std::string& path) {
    if (s.is_boolean()) {
      if (!s.get<bool>()) unsupported("false", path, "a schema that matches nothing");
      return prim("value");
    }
    if (!s.is_object()) throw UnsupportedFeature("schema", "JSON schema at " + path + ": a schema must be an object or a boolean");
    check_keys(s, path);
    if (s.contains("$ref")) {
      if (!s["$ref"].is_string()) unsupported("$ref", path, "must be a string");
      const std::string ref = s["$ref"].get<std::string>();
      auto it = ref_rules_.find(ref);
      if (it != ref_rules_.end()) return it->second;
      std::string hint2 = "ref" + ref.substr(ref.rfind('/') == std::string::npos ? 0 : ref.rfind('/') + 1);
      std::string name;
      for (char c : hint2) name += (std::isalnum(static_cast<unsigned char>(c)) || c == '-') ? c : '-';
      for (int k = 1; rules_.count(name); ++k) name = hint2 + "-" + std::to_string(k);
      rules_[name] = "\"\"";  // placeholder (recursion)
      ref_rules_[ref] = name;
      rules_[name] = visit(resolve(ref, path), name, ref);
      return name;
    }
    for (const char* comb : {"anyOf", "oneOf"}) {
      if (!s.contains(comb)) continue;
      const ojson& list = s[comb];
      if (!list.is_array() || list.empty()) unsupported(comb, path, "must be a non-empty list");
      for (auto it = s.begin(); it != s.end(); ++it)
        if (it.key() != comb && !annotation_keys().count(it.key()) && it.key() != "nullable")
          unsupported(it.key(), path, std::string("beside ") + comb + "; move it into each branch");
      std::vector<std::string> xs;
      for (size_t i = 0; i < list.size(); ++i)
        xs.push_back(visit(list[i], hint + "-" + std::to_string(i), path + "/" + comb + "/" + std::to_string(i)));
      if (s.value("nullable", false)) xs.push_back(prim("null"));
      return alts(xs);
    }
    if (s.contains("allOf")) {
      const ojson& list = s["allOf"];
      if (!list.is_array() || list.size() != 1) unsupported("allOf", path, "only a single-schema allOf is supported");
      return visit(list[0], hint, path + "/allOf/0");
    }
    const bool nullable = s.value("nullable", false);
    if (s.contains("const")) {
      std::string e = gbnf_literal(s["const"].dump());
      return nullable ? "(" + e + " | " + prim("null") + ")" : e;
    }
    if (s.contains("enum")) {
      const ojson& en = s["enum"];
      if (!en.is_array() || en.empty()) unsupported("enum", path, "must be a non-empty list");
      std::vector<std::string> types;
      if (s.contains("type")) {
        if (s["type"].is_string()) types.push_back(s["type"].get<std::string>());
        else if (s["type"].is_array())
          for (const auto& t : s["type"]) types.push_back(t.get<std::string>());
      }
      std::vector<std::string> xs;
      for (const auto& v : en) {
        bool ok = types.empty();
        for (const auto& t : types) ok = ok || type_matches(v, t);
        if (ok) xs.push_back(gbnf_literal(v.dump()));
      }
      if (nullable) xs.push_back(prim("null"));
      if (xs.empty()) unsupported("enum", path, "no value of the enum has the schema's type");
      return alts(xs);
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const ojson& t = s["type"];
      if (t.is_string()) types.push_back(t.get<std::string>());
      else if (t.is_array())
        for (const auto& x : t) {
          if (!x.is_string()) unsupported("type", path, "a type list must hold strings");
          types.push_back(x.get<std::string>());
        }
      else unsupported("type", path, "must be a string or a list of strings");
    } else if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required")) {
      types.push_back("object");
    } else if (s.contains("items") || s.contains("prefixItems")) {
      types.push_back("array");
    } else {
      return prim("value");
    }
    if (nullable && std::find(types.begin(), types.end(), "null") == types.end()) types.push_back("null");
    std::vector<std::string> xs;
    for (const auto& t : types) xs.push_back(visit_type(s, t, types.size() > 1 ? hint + "-" + t : hint, path));
    return alts(xs);
  }

  std::optional<int64_t> int_kw(const ojson& s, const char* k, const std::string& path) {
    if (!s.contains(k)) return std::nullopt;
    const ojson& v = s[k];
    if (v.is_boolean()) unsupported(k, path, "the draft-4 boolean form");
    if (!v.is_number()) unsupported(k, path, "must be a number");
    const double d = v.get<double>();
    if (std::fabs(d) > 1e15) unsupported(k, path, "bounds beyond 1e15");
    return int64_t(std::llround(d));
  }

  std::string visit_type(const ojson& s, const std::string& t, const std::string& hint, const std::string& path) {
    if (t == "null") return prim("null");
    if (t == "boolean") return prim("boolean");
    if (t == "integer") return integer(s, path);
    if (t == "number") {
      for (const char* k : {"maximum", "exclusiveMaximum", "exclusiveMinimum"})
        if (s.contains(k)) unsupported(k, path, "bounds on 'number' (use 'integer', or only minimum: 0)");
      if (s.contains("minimum")) {
        if (!s["minimum"].is_number() || s["minimum"].get<double>() != 0.0)
          unsupported("minimum", path, "on 'number' only minimum: 0 is supported");
        return prim("unumber");
      }
      return prim("number");
    }
    if (t == "string") return string(s, hint, path);
    if (t == "array") return array(s, hint, path);
    if (t == "object") return object(s, hint, path);
    unsupported("type: " + t, path);
  }

  std::string integer(const ojson& s, const std::string& path) {
    std::optional<int64_t> lo = int_kw(s, "minimum", path), hi = int_kw(s, "maximum", path);
    if (auto x = int_kw(s, "exclusiveMinimum", path)) lo = lo ? std::max(*lo, *x + 1) : *x + 1;
    if (auto x = int_kw(s, "exclusiveMaximum", path)) hi = hi ? std::min(*hi, *x - 1) : *x - 1;
    if (s.contains("minimum") && s["minimum"].is_number_float() && s["minimum"].get<double>() != std::floor(s["minimum"].get<double>()))
      lo = int64_t(std::ceil(s["minimum"].get<double>()));
    if (s.contains("maximum") && s["maximum"].is_number_float() && s["maximum"].get<double>() != std::floor(s["maximum"].get<double>()))
      hi = int64_t(std::floor(s["maximum"].get<double>()));
    if (!lo && !hi) return prim("integer");
    if (lo && hi && *lo > *hi) unsupported("minimum", path, "minimum > maximum: no integer fits");
    std::vector<std::string> xs;
    // negatives: -[max(1,-hi) .. -lo]; non-negatives: [max(0,lo) .. hi]
    if (!lo || *lo < 0) {
      const int64_t nlo = hi && *hi < 0 ? -*hi : 1;
      const int64_t nhi = lo ? -*lo : -1;
      xs.push_back("\"-\" " + uint_range(nlo, nhi));
    }
    if (!hi || *hi >= 0) xs.push_back(uint_range(lo ? std::max<int64_t>(0, *lo) : 0, hi ? *hi : -1));
    return alts(xs);
  }

  std::string string(const ojson& s, const std::string& hint, const std::string& path) {
    const auto mn = int_kw(s, "minLength", path), mx = int_kw(s, "maxLength", path);
    if ((mn && *mn < 0) || (mx && *mx < 0) || (mn && mx && *mn > *mx)) unsupported("minLength", path, "bad length bounds");
    if ((mn && *mn > 100000) || (mx && *mx > 100000)) unsupported("maxLength", path, "lengths above 100000");
    if (s.contains("pattern")) {
      if (mn || mx) unsupported("pattern", path, "together with minLength/maxLength");
      if (!s["pattern"].is_string()) unsupported("pattern", path, "must be a string");
      std::string re = s["pattern"].get<std::string>();
      std::string g;
      try {
        g = regex_to_gbnf_json(re);
      } catch (const UnsupportedFeature& e) {
        throw UnsupportedFeature("pattern", "JSON schema at " + path + ": pattern '" + re + "': " + e.what());
      }
      return add_rule(hint + "-pattern", "\"\\\"\" (" + g + ") \"\\\"\"");
    }
    if (s.contains("format")) {
      const std::string f = s["format"].is_string() ? s["format"].get<std::string>() : "";
      if (f == "date" || f == "time" || f == "date-time" || f == "uuid") {
        if (mn || mx) unsupported("format", path, "together with minLength/maxLength");
        return add_rule("str-" + f, "\"\\\"\" " + prim(f) + " \"\\\"\"");
      }
      unsupported("format: " + f, path, "supported formats: date, time, date-time, uuid");
    }
    if (!mn && !mx) return prim("string");
    prim("char");
    const std::string rep = "char{" + std::to_string(mn.value_or(0)) + "," + (mx ? std::to_string(*mx) : "") + "}";
    return add_rule(hint + "-string", "\"\\\"\" " + rep + " \"\\\"\"");
  }

  // The pattern's language inside a JSON string: characters that need escaping are excluded
  // (the generated value is a subset of the pattern's matches, never outside it).
  static std::string regex_to_gbnf_json(const std::string& re);

  std::string array(const ojson& s, const std::string& hint, const std::string& path) {
    if (s.value("uniqueItems", false)) unsupported("uniqueItems", path);
    const auto mn = int_kw(s, "minItems", path), mx = int_kw(s, "maxItems", path);
    if ((mn && *mn < 0) || (mx && *mx < 0) || (mn && mx && *mn > *mx)) unsupported("minItems", path, "bad item bounds");
    if ((mn && *mn > 1000) || (mx && *mx > 1000)) unsupported("maxItems", path, "item counts above 1000");
    prim("space");
    std::vector<std::string> tuple;
    if (s.contains("prefixItems")) {
      if (!s["prefixItems"].is_array()) unsupported("prefixItems", path, "must be a list");
      for (size_t i = 0; i < s["prefixItems"].size(); ++i)
        tuple.push_back(visit(s["prefixItems"][i], hint + "-" + std::to_string(i), path + "/prefixItems/" + std::to_string(i)));
    }
    std::string item;
    bool more = true;
    if (s.contains("items")) {
      if (s["items"].is_boolean() && !s["items"].get<bool>()) more = false;
      else if (s["items"].is_array()) unsupported("items", path, "the list form (use prefixItems)");
      else item = visit(s["items"], hint + "-item", path + "/items");
    } else {
      item = prim("value");
    }
    if (!tuple.empty()) {
      // Fixed prefix items (all present), then the rest.
      const int64_t n_t = int64_t(tuple.size());
      if ((mn && *mn > n_t && !more) || (mx && *mx < n_t)) unsupported("prefixItems", path, "with minItems/maxItems that cut the tuple");
      std::string body = "\"[\" space ";
      for (int64_t i = 0; i < n_t; ++i) body += (i ? "\",\" space " : "") + tuple[size_t(i)] + " space ";
      if (more) {
        const int64_t lo = std::max<int64_t>(0, mn.value_or(0) - n_t);
        const std::string hi = mx ? std::to_string(*mx - n_t) : "";
        body += "( \",\" space " + item + " space ){" + std::to_string(lo) + "," + hi + "} ";
      }
      return add_rule(hint + "-tuple", body + "\"]\"");
    }
    if (!more) return add_rule(hint + "-empty", "\"[\" space \"]\"");
    const int64_t lo = mn.value_or(0);
    const std::string el = item + " space";
    std::string rest = "( \",\" space " + el + " ){" + std::to_string(std::max<int64_t>(0, lo - 1)) + "," +
                       (mx ? std::to_string(std::max<int64_t>(0, *mx - 1)) : "") + "}";
    std::string inner = el + " " + rest;
    if (mx && *mx == 0) return add_rule(hint + "-array", "\"[\" space \"]\"");
    if (lo == 0) inner = "( " + inner + " )?";
    return add_rule(hint + "-array", "\"[\" space " + inner + " \"]\"");
  }

  std::string object(const ojson& s, const std::string& hint, const std::string& path) {
    prim("space");
    std::vector<std::pair<std::string, std::string>> props;  // (key, value expr)
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) unsupported("required", path, "must be a list of strings");
      for (const auto& r : s["required"]) {
        if (!r.is_string()) unsupported("required", path, "must be a list of strings");
        required.insert(r.get<std::string>());
      }
    }
    if (s.contains("properties")) {
      if (!s["properties"].is_object()) unsupported("properties", path, "must be an object");
      for (auto it = s["properties"].begin(); it != s["properties"].end(); ++it)
        props.emplace_back(it.key(), visit(it.value(), hint + "-" + it.key(), path + "/properties/" + it.key()));
    }
    for (const auto& r : required) {
      bool found = false;
      for (const auto& p : props) found = found || p.first == r;
      if (!found) unsupported("required", path, "'" + r + "' is required but not in properties");
    }
    // additionalProperties: false, true, or a schema; unset: false when strict.
    std::string extra;  // value expression of additional properties ("" = none)
    if (s.contains("additionalProperties")) {
      const ojson& ap = s["additionalProperties"];
      if (ap.is_boolean()) extra = ap.get<bool>() ? prim("value") : "";
      else extra = visit(ap, hint + "-extra", path + "/additionalProperties");
    } else if (!strict_ || !s.contains("properties")) {
      // Non-strict: additional properties allowed (the spec's default); strict: only an object
      // schema without `properties` at all is open.
      extra = prim("value");
    }
    // Members in order. S_i: nothing emitted yet; T_i: something emitted (needs a comma).
    std::vector<std::string> members;
    std::vector<bool> req;
    for (const auto& [k, v] : props) {
      members.push_back(add_rule(hint + "-" + k + "-kv", gbnf_literal(ojson(k).dump()) + " space \":\" space " + v + " space"));
      req.push_back(required.count(k) > 0);
    }
    if (!extra.empty()) {
      // Keys other than the known ones (a trie complement), then any value of the schema.
      const std::string key = other_key(props, hint);
      members.push_back(add_rule(hint + "-extra-kv", key + " space \":\" space " + extra + " space"));
      req.push_back(false);
    }
    const size_t n = members.size();
    const bool extra_repeats = !extra.empty();
    std::vector<std::string> S(n + 1), T(n + 1);
    S[n] = T[n] = "";
    for (size_t i = n; i-- > 0;) {
      const std::string m = members[i];
      const bool rep = extra_repeats && i == n - 1;
      // T_i: (", " m)* for the repeating extra member, else ("," m)? or "," m.
      std::string t_body, s_body;
      if (rep) {
        t_body = "( \",\" space " + m + " )*";
        s_body = "( " + m + " " + t_body + " )?";
      } else if (req[i]) {
        t_body = "\",\" space " + m + (T[i + 1].empty() ? "" : " " + T[i + 1]);
        s_body = m + (T[i + 1].empty() ? "" : " " + T[i + 1]);
      } else {
        t_body = "( \",\" space " + m + " )?" + (T[i + 1].empty() ? "" : " " + T[i + 1]);
        s_body = m + (T[i + 1].empty() ? "" : " " + T[i + 1]) + (S[i + 1].empty() ? " |" : " | " + S[i + 1]);
      }
      T[i] = add_rule(hint + "-t" + std::to_string(i), t_body);
      S[i] = add_rule(hint + "-s" + std::to_string(i), s_body);
    }
    return add_rule(hint, "\"{\" space " + (n ? S[0] + " " : "") + "\"}\"");
  }

  // A JSON string key (with its quotes) that is none of the given property names: a trie of
  // the names, each node's rule either diverging (another character, then anything) or
  // following a child, and closing only where the prefix is not a name. Only unescaped
  // characters: an escape such as \u0061 could spell a known name.
  std::string other_key(const std::vector<std::pair<std::string, std::string>>& props, const std::string& hint) {
    if (!rules_.count("pchar")) rules_["pchar"] = "[^\"\\\\\\x00-\\x1F]";
    struct TNode {
      std::map<uint32_t, int> kids;
      bool terminal = false;
    };
    std::vector<TNode> t(1);
    for (const auto& [k, v] : props) {
      int cur = 0;
      for (size_t i = 0; i < k.size();) {
        const unsigned char c = static_cast<unsigned char>(k[i]);
        if (c < 0x20 || c == '"' || c == '\\')
          unsupported("additionalProperties", hint, "beside property names that need escaping");
        const size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
        uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
        for (size_t j = 1; j < len && i + j < k.size(); ++j) cp = (cp << 6) | (static_cast<unsigned char>(k[i + j]) & 0x3F);
        i += len;
        auto it = t[size_t(cur)].kids.find(cp);
        if (it != t[size_t(cur)].kids.end()) {
          cur = it->second;
          continue;
        }
        t.emplace_back();
        const int nid = int(t.size()) - 1;
        t[size_t(cur)].kids[cp] = nid;
        cur = nid;
      }
      t[size_t(cur)].terminal = true;
    }
    auto cls_char = [](uint32_t cp) {
      char buf[16];
      if (cp < 0x80 && std::isalnum(int(cp))) return std::string(1, char(cp));
      std::snprintf(buf, sizeof buf, cp <= 0xFFFF ? "\\u%04X" : "\\U%08X", cp);
      return std::string(buf);
    };
    std::vector<std::string> names(t.size());
    for (size_t i = t.size(); i-- > 0;) {  // children have larger indices: named first
      std::string cls = "[^\"\\\\\\x00-\\x1F";
      for (const auto& [cp, kid] : t[i].kids) cls += cls_char(cp);
      std::string body = cls + "] pchar* \"\\\"\"";
      for (const auto& [cp, kid] : t[i].kids) body += " | [" + cls_char(cp) + "] " + names[size_t(kid)];
      if (!t[i].terminal) body += " | \"\\\"\"";
      names[i] = add_rule(hint + "-okey" + std::to_string(i), body);
    }
    return add_rule(hint + "-okey", "\"\\\"\" " + names[0]);
  }
};

}  // namespace

const std::string& json_gbnf(bool object_only) {
  static const std::string any = std::string("root ::= value\n") + kJsonRules;
  static const std::string obj = std::string("root ::= object\n") + kJsonRules;
  return object_only ? obj : any;
}

std::string json_schema_to_gbnf(const ojson& schema, bool strict) {
  Converter c(schema, strict);
  return c.run();
}

// defined in regex.cpp
std::string regex_to_gbnf_impl(std::string_view re, bool json_string);
std::string Converter::regex_to_gbnf_json(const std::string& re) { return regex_to_gbnf_impl(re, true); }

}  // namespace kvboost::grammar
