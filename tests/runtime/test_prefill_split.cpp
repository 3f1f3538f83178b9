// A prompt's logits must not depend on how its prefill was cut: into steps of prefill_chunk
// tokens, or into an exact prefix found in the cache plus the rest. The guard's exact recompute
// relies on this (it recomputes [first approximate position, n) after an exact prefix and is
// compared with a full prefill), and so does every prefix-cache hit. Catches: a causal or
// sliding-window mask taken relative to the step instead of the sequence, K/V of an earlier step
// read at the wrong rows, per-step state (norm, rope, quantization) that leaks across steps.
// Real model: Gemma 3 270M (sliding window 512 on five of six layers, so a 1,200-token prompt
// crosses the window inside and across steps).
//
// Found 2026-12-04 (docs/chunk-reuse.md "Batch invariance"): flash attention started a sliding
// window's key tiles at the unit's first visible key, so the tile grid, and the last bits of
// every row, moved with the cut; Gemma 3's int8 activation blocks turned them into 0.5-0.9
// logits. Still not bit-identical: a call of fewer than kQGemmMinM (16) tokens (its quantized
// matmuls take other kernels, whose f32 sums are ordered differently: ~1e-6, then amplified the
// same way), so prefill steps here are >= 97 tokens and prefixes are cut where the rest is long.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "kvboost/model.h"
#include "kvboost/runtime.h"
#include "test_util.h"

using namespace kvboost;

namespace {
std::vector<float> first_logits(Engine& e, const std::vector<int32_t>& ids, bool prefix_cache) {
  std::vector<float> out;
  GenerateOptions o;
  o.max_new_tokens = 1;
  o.sampling.temperature = 0;
  o.prefix_cache = prefix_cache;
  o.reuse.store = false;
  o.on_logits = [&](const float* l, int64_t v) {
    if (out.empty()) out.assign(l, l + v);
  };
  e.generate_ids(ids, o);
  return out;
}

float worst_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float w = 0;
  for (size_t j = 0; j < a.size(); ++j) w = std::max(w, std::fabs(a[j] - b[j]));
  return w;
}
}  // namespace

TEST(PrefillSplit, StepsAndPrefixHitsGiveTheSameLogitsGemma) {
  const std::string path = test::gemma3_path();
  KVBOOST_REQUIRE_GEMMA3(path);
  // Prose with enough variety that the model's next-token distribution is not trivial.
  const char* parts[] = {"The harbour master counted the boats that came in before the storm. ",
                         "In the archive of Ostrel the clerk kept a card for every visitor, ",
                         "and the keeper of the lighthouse wrote the weather in a small blue book. ",
                         "Nobody in the town remembered a winter as long as that one; ",
                         "the fishermen mended their nets and waited for the wind to drop. "};
  std::string text;
  for (int i = 0; i < 120; ++i) text += parts[(i * 7 + i / 5) % 5] + std::to_string(1000 + i * 37) + ". ";
  std::vector<float> ref;
  std::vector<int32_t> ids;
  std::vector<int64_t> chunks{4096, 512, 200, 97};
  if (const char* c = std::getenv("KVB_SPLIT_CHUNKS")) {  // diagnosis: other step sizes
    chunks = {4096};
    for (std::stringstream cs(c); cs.good();) {
      int64_t v;
      if (cs >> v) chunks.push_back(v);
    }
  }
  for (int64_t chunk : chunks) {
    EngineOptions eo;
    eo.prefill_chunk = chunk;
    auto e = Engine::load(path, eo);
    if (ids.empty()) {
      std::vector<int64_t> segs;
      ids = e->encode_segments({text}, true, &segs);
      ids.resize(std::min<size_t>(ids.size(), 1200));
      ASSERT_EQ(ids.size(), 1200u);
    }
    const std::vector<float> l = first_logits(*e, ids, false);
    if (ref.empty()) {
      ref = l;
      continue;
    }
    std::fprintf(stderr, "prefill_chunk %lld: worst logit difference %.6f\n", (long long)chunk, double(worst_diff(l, ref)));
    EXPECT_EQ(worst_diff(l, ref), 0.0f) << "prefill_chunk " << chunk;
    if (chunk < 128) continue;  // with 97-token steps after a prefix the last step can be < 16 tokens
    // An exact prefix from the cache (whole chunks of it), then the rest.
    for (size_t p : {128u, 300u, 640u, 700u}) {
      e->warm(std::vector<int32_t>(ids.begin(), ids.begin() + p), {});
      const std::vector<float> h = first_logits(*e, ids, true);
      std::fprintf(stderr, "prefill_chunk %lld, cached prefix %zu: worst logit difference %.6f\n", (long long)chunk, p,
                   double(worst_diff(h, ref)));
      EXPECT_EQ(worst_diff(h, ref), 0.0f) << "prefill_chunk " << chunk << ", prefix " << p;
    }
  }
}

// The same cut one level down: Model::forward on a contiguous KvCache, the prompt in one call
// against calls of 97 tokens (no engine, scheduler or paged blocks): bit-identical.
// KVB_SPLIT_STEP / KVB_SPLIT_FIRST try other cuts (a first call of 128 and then 97-token steps
// leaves a 5-token last call: 0.47, the open case above).
TEST(PrefillSplit, ModelForwardInStepsGemma) {
  const std::string path = test::gemma3_path();
  KVBOOST_REQUIRE_GEMMA3(path);
  auto model = Model::load(path);
  const ModelConfig& c = model->config();
  std::vector<int32_t> ids;
  for (int i = 0; i < 1200; ++i) ids.push_back(int32_t(1000 + (i * 7919) % 20000));
  std::vector<float> ref(size_t(c.vocab_size)), l(size_t(c.vocab_size));
  KvCache kv(c, 1300);
  model->forward(ids.data(), 1200, kv, ref.data());
  int64_t step = 97;
  if (const char* s = std::getenv("KVB_SPLIT_STEP")) step = std::atoll(s);
  int64_t first = step;
  if (const char* s = std::getenv("KVB_SPLIT_FIRST")) first = std::atoll(s);
  KvCache kv2(c, 1300);
  model->forward(ids.data(), first, kv2, l.data());
  for (int64_t p = first; p < 1200; p += step) model->forward(ids.data() + p, std::min<int64_t>(step, 1200 - p), kv2, l.data());
  std::fprintf(stderr, "Model::forward, steps of %lld: worst logit difference %.6f\n", (long long)step, double(worst_diff(l, ref)));
  EXPECT_EQ(worst_diff(l, ref), 0.0f);
}
