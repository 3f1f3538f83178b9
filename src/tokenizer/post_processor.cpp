// Post-processors, reduced to what they do to a single sequence's ids: special tokens before
// and after it. TemplateProcessing, Bert/Roberta, ByteLevel (no-op), Sequence.
#include "internal.h"

namespace kvboost::tok {
namespace {

std::vector<int32_t> template_ids(const json& special_tokens, const std::string& name, const std::string& where) {
  if (!special_tokens.contains(name))
    fail(where, ".special_tokens: no entry for '", name, "' used in the template");
  std::vector<int32_t> ids;
  for (const json& id : special_tokens[name].at("ids")) ids.push_back(json_id(id, where + ".special_tokens[\"" + name + "\"].ids"));
  return ids;
}

}  // namespace

PostProcessor make_post_processor(const json& j, const std::string& where) {
  PostProcessor pp;
  if (j.is_null()) return pp;
  const std::string type = json_type(j, where);
  try {
    if (type == "ByteLevel") return pp;
    if (type == "TemplateProcessing") {
      const json& single = j.at("single");
      const json& specials = j.contains("special_tokens") ? j["special_tokens"] : json::object();
      bool seen_a = false;
      for (const json& item : single) {
        if (item.contains("Sequence")) {
          seen_a = true;
        } else if (item.contains("SpecialToken")) {
          auto ids = template_ids(specials, item["SpecialToken"].at("id").get<std::string>(), where);
          auto& dst = seen_a ? pp.suffix : pp.prefix;
          dst.insert(dst.end(), ids.begin(), ids.end());
        } else {
          fail(where, ".single: unexpected item ", item.dump());
        }
      }
      if (!pp.prefix.empty()) pp.first_special = pp.prefix.front();
      return pp;
    }
    if (type == "BertProcessing" || type == "RobertaProcessing") {
      pp.prefix = {json_id(j.at("cls").at(1), where + ".cls")};
      pp.suffix = {json_id(j.at("sep").at(1), where + ".sep")};
      pp.first_special = pp.prefix.front();
      return pp;
    }
    if (type == "Sequence") {
      const json& items = j.at("processors");
      for (size_t i = 0; i < items.size(); ++i) {
        PostProcessor p = make_post_processor(items[i], where + ".processors[" + std::to_string(i) + "]");
        // Each processor wraps the result of the previous one.
        pp.prefix.insert(pp.prefix.begin(), p.prefix.begin(), p.prefix.end());
        pp.suffix.insert(pp.suffix.end(), p.suffix.begin(), p.suffix.end());
        if (!pp.first_special) pp.first_special = p.first_special;
      }
      return pp;
    }
  } catch (const json::exception& e) {
    fail(where, " (", type, "): ", e.what());
  }
  fail(where, ": unsupported post_processor type '", type, "'");
}

}  // namespace kvboost::tok
