// kvboost logits: the oracle interface. Runs a token-id sequence through one batched forward
// pass (logits at every position) and a greedy continuation over the KV cache (logits at each
// step), and writes them as JSON so tools/oracle/compare_logits.py can check them against
// Hugging Face transformers.
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_util.h"
#include "kvboost/kernels.h"

namespace kvboost::cli {

namespace {
struct LogitsArgs {
  std::string model, ids, out, force_ids;
  int greedy = 0;
};

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::stringstream ss(s);
  std::string tok;
  while (ss >> tok) {
    for (auto& ch : tok)
      if (ch == ',') ch = ' ';
    std::stringstream inner(tok);
    long v;
    while (inner >> v) ids.push_back(int32_t(v));
  }
  if (ids.empty()) fail("--ids: no token ids given");
  return ids;
}

void run_logits(const LogitsArgs& a) {
  auto model = Model::load(resolve_model_dir(a.model, true));  // a directory, .gguf or Hub id
  const ModelConfig& c = model->config();
  auto ids = parse_ids(a.ids);
  const int64_t n = int64_t(ids.size());
  KvCache kv(c, n + a.greedy + 1);
  std::vector<float> all(size_t(n * c.vocab_size));
  model->forward(ids.data(), n, kv, all.data(), /*all_logits=*/true);
  nlohmann::json j;
  j["prompt_logits"] = nlohmann::json::array();
  for (int64_t t = 0; t < n; ++t)
    j["prompt_logits"].push_back(std::vector<float>(all.begin() + t * c.vocab_size, all.begin() + (t + 1) * c.vocab_size));
  std::vector<float> last(all.end() - c.vocab_size, all.end());
  // Teacher forcing: the continuation consumes these ids (a reference's greedy ids) instead of
  // our argmax, so every step's logits stay comparable even past a near-tie.
  const std::vector<int32_t> forced = a.force_ids.empty() ? std::vector<int32_t>{} : parse_ids(a.force_ids);
  if (!forced.empty() && int64_t(forced.size()) < a.greedy)
    fail("--force-ids: ", forced.size(), " ids given for --greedy ", a.greedy);
  for (size_t i = 0; i < forced.size(); ++i)
    if (forced[i] < 0 || forced[i] >= c.vocab_size)
      fail("--force-ids: id ", forced[i], " (index ", i, ") is outside the vocabulary [0, ", c.vocab_size, ")");
  j["greedy_ids"] = nlohmann::json::array();
  j["greedy_logits"] = nlohmann::json::array();
  for (int i = 0; i < a.greedy; ++i) {
    const int32_t tok = forced.empty() ? int32_t(kernels::argmax(last.data(), c.vocab_size)) : forced[size_t(i)];
    j["greedy_ids"].push_back(tok);
    // row i: the logits of the step that consumed greedy_ids[i]
    model->forward(&tok, 1, kv, last.data());
    j["greedy_logits"].push_back(last);
  }
  std::ofstream out(a.out);
  if (!out) fail(a.out, ": cannot create");
  out << j.dump();
}
}  // namespace

void add_logits(CLI::App& app) {
  auto a = std::make_shared<LogitsArgs>();
  CLI::App* c = app.add_subcommand("logits", "Write prompt and greedy-continuation logits as JSON (for oracle comparisons)");
  c->add_option("-m,--model", a->model, "Hugging Face model directory")->required();
  c->add_option("--ids", a->ids, "Prompt token ids, separated by spaces or commas")->required();
  c->add_option("--greedy", a->greedy, "Greedy continuation length")->check(CLI::NonNegativeNumber);
  c->add_option("--force-ids", a->force_ids,
                 "Teacher forcing: the continuation consumes these ids (at least --greedy of them) instead of its argmax");
  c->add_option("-o,--out", a->out, "Output JSON file")->required();
  c->callback([a]() { run_logits(*a); });
}

}  // namespace kvboost::cli
