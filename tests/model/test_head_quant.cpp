// LoadOptions::head_quant: the output projection quantized once at load (Q8_0 / Q6_K / Q4_0,
// llama.cpp's reference quantizers) against the float head of the same checkpoint.
//
// Error measures, over every position of a few prompts (all logits): max |Δ| relative to the
// logit scale (the largest |logit| of the float head), cosine of each logit row, top-1
// agreement. Tolerances are set from the measured values (printed by each test) with headroom;
// they include the quantized matmul's 8-bit activation rounding, which the float head does not
// do. The embedding lookup is not touched (a tied table stays the stored one, exactly).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "gguf_builder.h"
#include "kvboost/kernels.h"
#include "kvboost/model.h"
#include "testing/fixture.h"
#include "test_util.h"

using namespace kvboost;
using kernels::WType;
using nlohmann::json;

namespace {

// The stored layout (no packing at load): these tests compare heads, and the tied table's
// bytes, as stored (test_pack_weights covers packing).
LoadOptions head(HeadQuant q) {
  LoadOptions o;
  o.head_quant = q;
  o.pack_weights = false;
  return o;
}

// A qwen2-shaped random model; hidden 256 so that Q6_K's 256-element blocks fit the rows.
FixtureSpec spec(bool tie) {
  FixtureSpec s;
  s.arch = "qwen2", s.dtype = "bf16", s.tokenizer_kind = "";
  s.hidden = 256, s.intermediate = 512, s.layers = 2, s.heads = 4, s.kv_heads = 2, s.vocab = 1024;
  s.tie = tie, s.init_std = 0.05f, s.seed = 7;
  return s;
}

std::string fixture(bool tie) {
  static std::string dirs[2];
  std::string& d = dirs[tie ? 1 : 0];
  if (d.empty()) {
    d = test::make_temp_dir(tie ? "head_quant_tied" : "head_quant_untied");
    write_fixture_model(d, spec(tie));
  }
  return d;
}

std::vector<std::vector<int32_t>> prompts(int64_t vocab) {
  std::vector<std::vector<int32_t>> ps;
  uint32_t seed = 3;
  for (int p = 0; p < 4; ++p) {
    std::vector<int32_t> ids;
    for (int i = 0; i < 12 + 3 * p; ++i) seed = seed * 1664525u + 1013904223u, ids.push_back(int32_t((seed >> 8) % uint32_t(vocab)));
    ps.push_back(ids);
  }
  return ps;
}

std::vector<float> all_logits(const Model& m, const std::vector<int32_t>& ids) {
  KvCache kv(m.config(), int64_t(ids.size()));
  std::vector<float> out(ids.size() * size_t(m.config().vocab_size));
  m.forward(ids.data(), int64_t(ids.size()), kv, out.data(), /*all_logits=*/true);
  return out;
}

struct Err {
  double rel_max = 0;  // max |Δ| / max |logit of the reference|
  double min_cos = 1;
  int64_t top1_same = 0, rows = 0;
};

Err compare(const Model& ref, const Model& q, const std::vector<std::vector<int32_t>>& ps) {
  const int64_t V = ref.config().vocab_size;
  Err e;
  double scale = 0, dmax = 0;
  for (const auto& ids : ps) {
    const std::vector<float> a = all_logits(ref, ids), b = all_logits(q, ids);
    for (size_t r = 0; r < ids.size(); ++r) {
      const float* x = a.data() + r * size_t(V);
      const float* y = b.data() + r * size_t(V);
      double xy = 0, xx = 0, yy = 0;
      for (int64_t i = 0; i < V; ++i) {
        scale = std::max(scale, double(std::fabs(x[i])));
        dmax = std::max(dmax, double(std::fabs(x[i] - y[i])));
        xy += double(x[i]) * y[i], xx += double(x[i]) * x[i], yy += double(y[i]) * y[i];
      }
      e.min_cos = std::min(e.min_cos, xy / std::sqrt(xx * yy));
      e.top1_same += kernels::argmax(x, V) == kernels::argmax(y, V);
      e.rows++;
    }
  }
  e.rel_max = dmax / scale;
  return e;
}

void report(const char* what, const Err& e) {
  std::printf("[ measured ] %s: max |dlogit| / logit scale %.4f%%, min cosine %.7f, top-1 %lld/%lld\n", what,
              100 * e.rel_max, e.min_cos, (long long)e.top1_same, (long long)e.rows);
}

std::vector<int32_t> greedy(const Model& m, const std::vector<int32_t>& ids, int max_new, const std::vector<int32_t>& stop) {
  KvCache kv(m.config(), int64_t(ids.size()) + max_new);
  std::vector<float> logits(size_t(m.config().vocab_size));
  m.forward(ids.data(), int64_t(ids.size()), kv, logits.data());
  std::vector<int32_t> out;
  for (int i = 0; i < max_new; ++i) {
    const int32_t t = int32_t(kernels::argmax(logits.data(), m.config().vocab_size));
    if (std::find(stop.begin(), stop.end(), t) != stop.end()) break;
    out.push_back(t);
    if (i + 1 < max_new) m.forward(&t, 1, kv, logits.data());
  }
  return out;
}

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

}  // namespace

TEST(HeadQuant, ParseNamesTheBadValue) {
  EXPECT_EQ(parse_head_quant("auto"), HeadQuant::Auto);
  EXPECT_EQ(parse_head_quant("none"), HeadQuant::None);
  EXPECT_EQ(parse_head_quant("Q8_0"), HeadQuant::Q8_0);
  EXPECT_EQ(parse_head_quant("q6_k"), HeadQuant::Q6_K);
  EXPECT_EQ(parse_head_quant("q4_0"), HeadQuant::Q4_0);
  for (HeadQuant q : {HeadQuant::Auto, HeadQuant::None, HeadQuant::Q8_0, HeadQuant::Q6_K, HeadQuant::Q4_0})
    EXPECT_EQ(parse_head_quant(head_quant_name(q)), q);
  try {
    parse_head_quant("q3_k", "--head-quant");
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("--head-quant"), std::string::npos) << m;
    EXPECT_NE(m.find("\"q3_k\""), std::string::npos) << m;
    EXPECT_NE(m.find("q8_0"), std::string::npos) << m;  // the choices
  }
  EXPECT_THROW(parse_head_quant(""), Error);
}

TEST(HeadQuant, TiedHeadQuantizedEmbeddingUntouched) {
  const std::string dir = fixture(true);
  auto ref = Model::load(dir, head(HeadQuant::None));
  EXPECT_EQ(ref->lm_head().type, WType::BF16);
  EXPECT_EQ(ref->lm_head().data, ref->embedding().data);  // tied: one table
  const int64_t V = ref->config().vocab_size, H = ref->config().hidden_size;
  const auto ps = prompts(V);
  struct Case {
    HeadQuant q;
    WType type;
    double rel_max, min_cos, top1;  // tolerances: max relative error, min cosine, min top-1 share
  } cases[] = {// measured 0.81% / 0.999965 / 66 of 66; 2.2% / 0.99980 / 62; 9.1% / 0.99598 / 54
               {HeadQuant::Q8_0, WType::Q8_0, 0.02, 0.9999, 0.95},
               {HeadQuant::Q6_K, WType::Q6_K, 0.04, 0.999, 0.85},
               {HeadQuant::Q4_0, WType::Q4_0, 0.15, 0.99, 0.7}};
  for (const Case& c : cases) {
    auto m = Model::load(dir, head(c.q));
    SCOPED_TRACE(head_quant_name(c.q));
    EXPECT_EQ(m->lm_head().type, c.type);
    EXPECT_NE(m->lm_head().data, m->embedding().data);
    // The lookup still reads the stored bf16 table, unchanged.
    EXPECT_EQ(m->embedding().type, WType::BF16);
    EXPECT_EQ(std::memcmp(m->embedding().data, ref->embedding().data, size_t(V * H * 2)), 0);
    EXPECT_EQ(m->decode_weight_bytes(), ref->decode_weight_bytes() - size_t(V * H * 2) +
                                            size_t(V * kernels::wtype_row_bytes(c.type, H)));
    EXPECT_EQ(m->weight_bytes(), ref->weight_bytes() + size_t(V * kernels::wtype_row_bytes(c.type, H)));
    const Err e = compare(*ref, *m, ps);
    report(head_quant_name(c.q), e);
    EXPECT_LE(e.rel_max, c.rel_max);
    EXPECT_GE(e.min_cos, c.min_cos);
    EXPECT_GE(double(e.top1_same), c.top1 * double(e.rows));
  }
}

TEST(HeadQuant, UntiedHeadQuantizedAndItsFloatCopyReleased) {
  const std::string dir = fixture(false);
  auto ref = Model::load(dir, head(HeadQuant::None));
  auto m = Model::load(dir, head(HeadQuant::Q8_0));
  const int64_t V = ref->config().vocab_size, H = ref->config().hidden_size;
  EXPECT_EQ(ref->lm_head().type, WType::BF16);
  EXPECT_EQ(m->lm_head().type, WType::Q8_0);
  EXPECT_EQ(m->weight_bytes(), ref->weight_bytes() - size_t(V * H * 2) + size_t(V * kernels::wtype_row_bytes(WType::Q8_0, H)));
  const Err e = compare(*ref, *m, prompts(V));
  report("untied q8_0", e);  // measured 0.85%, 0.999966
  EXPECT_LE(e.rel_max, 0.02);
  EXPECT_GE(e.min_cos, 0.9999);
}

TEST(HeadQuant, Q6KFallsBackToQ8_0WhenRowsAreNotWhole256Blocks) {
  FixtureSpec s = spec(true);
  s.hidden = 64, s.intermediate = 128;
  const std::string dir = test::make_temp_dir("head_quant_h64");
  write_fixture_model(dir, s);
  EXPECT_EQ(Model::load(dir, head(HeadQuant::Q6_K))->lm_head().type, WType::Q8_0);
  EXPECT_EQ(Model::load(dir, head(HeadQuant::Q4_0))->lm_head().type, WType::Q4_0);
}

TEST(HeadQuant, AutoQuantizesAwqHeadsOnly) {
  EXPECT_EQ(Model::load(fixture(true))->lm_head().type, WType::BF16);  // default: auto
  FixtureSpec s = spec(true);
  s.quant = "awq", s.group_size = 128;
  const std::string dir = test::make_temp_dir("head_quant_awq");
  write_fixture_model(dir, s);
  auto awq = Model::load(dir);
  EXPECT_EQ(awq->lm_head().type, WType::Q8_0);
  EXPECT_EQ(awq->embedding().type, WType::BF16);
  auto awq_float = Model::load(dir, head(HeadQuant::None));
  EXPECT_EQ(awq_float->lm_head().type, WType::BF16);
  const Err e = compare(*awq_float, *awq, prompts(awq->config().vocab_size));
  report("awq, q8_0 head vs float head", e);  // measured 0.88%, 0.999963
  EXPECT_LE(e.rel_max, 0.02);
  EXPECT_GE(e.min_cos, 0.9999);
}

// Layer streaming keeps the (quantized) head resident; logits are bit-identical to the
// resident model with the same head.
TEST(HeadQuant, LayerStreamingKeepsTheQuantizedHeadResident) {
  FixtureSpec s = spec(true);
  s.layers = 4;
  const std::string dir = test::make_temp_dir("head_quant_stream");
  write_fixture_model(dir, s);
  auto resident = Model::load(dir, head(HeadQuant::Q8_0));
  const ModelConfig& c = resident->config();
  const int64_t H = c.hidden_size, I = c.intermediate_size, hd = c.head_dim, V = c.vocab_size;
  // One layer's bf16 matrices plus the streamer's 4096-byte alignment of each: two slots.
  const uint64_t layer = uint64_t(2 * (H * hd * (2 * c.n_heads + 2 * c.n_kv_heads) + 3 * H * I)) + 7 * 4096;
  LoadOptions o = head(HeadQuant::Q8_0);
  o.weight_budget = 2 * layer;
  auto streamed = Model::load(dir, o);
  ASSERT_TRUE(streamed->stream_info().streaming);
  EXPECT_EQ(streamed->lm_head().type, WType::Q8_0);
  EXPECT_EQ(streamed->stream_info().resident_bytes,
            uint64_t(V * H * 2) + uint64_t(V * kernels::wtype_row_bytes(WType::Q8_0, H)));
  for (const auto& ids : prompts(V)) {
    const std::vector<float> a = all_logits(*resident, ids), b = all_logits(*streamed, ids);
    ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  }
}

// GGUF: a head already in blocks is kept as it is (no requantization); a float output tensor is
// quantized like a safetensors one.
TEST(HeadQuant, GgufQuantizedHeadKeptFloatHeadQuantized) {
  using kernels::GgmlType;
  const int64_t H = 64, V = 96;
  auto build = [&](GgmlType out_type) {
    test::Builder b;
    test::add_random_llama(b, {H, 128, V, 2, 4, 2, 16}, 5, [&](uint32_t& seed) {
      const auto out = test::lcg_values(seed, V * H, 1.0f);
      if (out_type == GgmlType::F32) {
        b.tensor("output.weight", GgmlType::F32, {H, V}, out.data(), out.size() * 4);
      } else {
        std::vector<uint8_t> q(size_t(V * kernels::wtype_row_bytes(WType::Q8_0, H)));
        kernels::quantize_row(out.data(), WType::Q8_0, q.data(), V * H);
        b.tensor("output.weight", GgmlType::Q8_0, {H, V}, q.data(), q.size());
      }
    });
    const std::string dir = test::make_temp_dir(out_type == GgmlType::F32 ? "head_quant_gguf_f32" : "head_quant_gguf_q8");
    return test::write(dir, "m.gguf", b.finish());
  };
  const std::string q8 = build(GgmlType::Q8_0), f32 = build(GgmlType::F32);
  // Already quantized: every option leaves the stored blocks (logits bit-identical).
  auto kept = Model::load(q8, head(HeadQuant::None));
  EXPECT_EQ(kept->lm_head().type, WType::Q8_0);
  for (HeadQuant q : {HeadQuant::Auto, HeadQuant::Q4_0, HeadQuant::Q6_K}) {
    auto m = Model::load(q8, head(q));
    EXPECT_EQ(m->lm_head().type, WType::Q8_0) << head_quant_name(q);
    const std::vector<int32_t> ids{1, 17, 30, 4, 95};
    const std::vector<float> a = all_logits(*kept, ids), b = all_logits(*m, ids);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  }
  // A float output tensor: quantized on request, kept by auto (not AWQ).
  EXPECT_EQ(Model::load(f32)->lm_head().type, WType::F32);
  auto ref = Model::load(f32, head(HeadQuant::None));
  auto m = Model::load(f32, head(HeadQuant::Q4_0));
  EXPECT_EQ(m->lm_head().type, WType::Q4_0);
  const Err e = compare(*ref, *m, {{1, 17, 30, 4, 95, 50, 3, 71}});
  report("gguf f32 output -> q4_0", e);  // measured 7.2%, 0.99702
  EXPECT_LE(e.rel_max, 0.15);
  EXPECT_GE(e.min_cos, 0.99);
}

// The real stories260K (tied f32 embeddings, hidden 64: Q6_K falls back to Q8_0): greedy
// continuations of the oracle prompts with the quantized head against the float head's (which
// equal llama2.c's reference_greedy.json, test_model).
TEST(HeadQuant, Stories260KGreedy) {
  const std::string dir = test::model_path("stories260K");
  KVBOOST_REQUIRE_PATH(dir);
  auto ref = Model::load(dir, head(HeadQuant::None));
  auto q8 = Model::load(dir, head(HeadQuant::Q8_0));
  auto q4 = Model::load(dir, head(HeadQuant::Q4_0));
  ASSERT_EQ(q8->lm_head().type, WType::Q8_0);
  const json cases = json::parse(read_file(dir + "/reference_greedy.json"))["cases"];
  std::vector<std::vector<int32_t>> ps;
  size_t n8 = 0, n4 = 0, total = 0;
  for (const auto& cs : cases) {
    const auto prompt = cs["prompt_ids"].get<std::vector<int32_t>>();
    ps.push_back(prompt);
    const auto stop = ref->config().eos_token_ids;
    const auto want = greedy(*ref, prompt, 64, stop);
    const auto g8 = greedy(*q8, prompt, 64, stop), g4 = greedy(*q4, prompt, 64, stop);
    n8 += common_prefix(want, g8), n4 += common_prefix(want, g4), total += want.size();
    std::printf("[ measured ] \"%s\": float head %zu tokens; identical prefix q8_0 %zu, q4_0 %zu\n",
                cs["prompt"].get<std::string>().c_str(), want.size(), common_prefix(want, g8), common_prefix(want, g4));
    EXPECT_EQ(g8, want) << cs["prompt"];
  }
  std::printf("[ measured ] greedy tokens identical before the first difference: q8_0 %zu/%zu, q4_0 %zu/%zu\n", n8, total,
              n4, total);
  const Err e8 = compare(*ref, *q8, ps), e4 = compare(*ref, *q4, ps);
  report("stories260K q8_0", e8);
  report("stories260K q4_0", e4);
  // measured: q8_0 1.08%, cosine 0.999957, top-1 52 of 52, greedy 320 of 320 tokens identical;
  // q4_0 10.9%, 0.99795, 48 of 52, greedy identical for 121 of 320 tokens (not asserted).
  EXPECT_LE(e8.rel_max, 0.02);
  EXPECT_GE(e8.min_cos, 0.9999);
  EXPECT_EQ(e8.top1_same, e8.rows);
}
