// The NaN / Inf scan of weight matrices at load (src/model/weight_check.h): the fast scan agrees
// with its scalar reference on every stored type, and a single bad value in the middle of a
// matrix -- a row the old three-row sample never read, a quantized block's scale -- is refused at
// load with the tensor, the file and the position named.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "gguf_builder.h"
#include "kvboost/common.h"
#include "kvboost/kernels.h"
#include "kvboost/model.h"
#include "kvboost/model_files.h"
#include "testing/fixture.h"
#include "test_util.h"
#include "weight_check.h"

namespace kvboost {
namespace {

using kernels::WType;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

// Random blocks of `wt` whose scales are finite (f16 1.0), the elements of a plain type finite.
std::vector<uint8_t> random_finite(WType wt, int64_t n, std::mt19937& rng) {
  std::vector<uint8_t> b(size_t(kernels::wtype_row_bytes(wt, n)));
  for (auto& x : b) x = uint8_t(rng());
  auto put16 = [&](size_t at, uint16_t v) { std::memcpy(b.data() + at, &v, 2); };
  const int64_t bb = kernels::wtype_block_bytes(wt), nb = int64_t(b.size()) / bb;
  for (int64_t k = 0; k < nb; ++k) {
    const size_t o = size_t(k * bb);
    switch (wt) {
      case WType::F32: b[o + 3] &= 0xBF; break;            // exponent's top bit clear: finite
      case WType::F16: b[o + 1] &= 0xBF; break;
      case WType::BF16: b[o + 1] &= 0xBF; break;
      case WType::Q4_K: case WType::Q5_K: put16(o, 0x3C00); put16(o + 2, 0x3C00); break;
      case WType::Q6_K: put16(o + 208, 0x3C00); break;
      default: put16(o, 0x3C00); break;                    // d first: Q8_0, Q4_0, Q5_0, Q4_Z*
    }
  }
  return b;
}

// Makes element `at`'s value (plain) or its block's scale (quantized) NaN or Inf.
void poison(std::vector<uint8_t>& b, WType wt, int64_t at, bool nan) {
  const int64_t be = kernels::wtype_block_elems(wt), bb = kernels::wtype_block_bytes(wt);
  const size_t blk = size_t(at / be * bb);
  const uint16_t h = nan ? 0x7E00 : 0x7C00;
  switch (wt) {
    case WType::F32: { const uint32_t v = nan ? 0x7FC00000u : 0xFF800000u; std::memcpy(&b[blk], &v, 4); break; }
    case WType::F16: std::memcpy(&b[blk], &h, 2); break;
    case WType::BF16: { const uint16_t v = nan ? 0x7FC0 : 0xFF80; std::memcpy(&b[blk], &v, 2); break; }
    case WType::Q4_K: case WType::Q5_K: std::memcpy(&b[blk + (nan ? 2 : 0)], &h, 2); break;  // dmin or d
    case WType::Q6_K: std::memcpy(&b[blk + 208], &h, 2); break;
    default: std::memcpy(&b[blk], &h, 2); break;
  }
}

TEST(WeightCheck, FastScanAgreesWithTheReferenceOnEveryType) {
  std::mt19937 rng(7);
  for (WType wt : {WType::F32, WType::F16, WType::BF16, WType::Q8_0, WType::Q4_0, WType::Q5_0, WType::Q4_K,
                   WType::Q5_K, WType::Q6_K, WType::Q4_Z, WType::Q4_Z128}) {
    const int64_t n = 256 * 61;  // 15616 elements: several 4096-element chunks and a partial one
    const auto clean = random_finite(wt, n, rng);
    EXPECT_EQ(weight_check::find_nonfinite(clean.data(), wt, n), -1) << kernels::wtype_name(wt);
    EXPECT_EQ(weight_check::find_nonfinite_ref(clean.data(), wt, n), -1) << kernels::wtype_name(wt);
    const int64_t be = kernels::wtype_block_elems(wt);
    for (int64_t at : {int64_t(0), n / 2 + 3, n - 1, int64_t(4096), int64_t(4095)}) {
      for (bool nan : {true, false}) {
        auto b = clean;
        poison(b, wt, at, nan);
        const int64_t want = at / be * be;
        EXPECT_EQ(weight_check::find_nonfinite(b.data(), wt, n), want) << kernels::wtype_name(wt) << " at " << at;
        EXPECT_EQ(weight_check::find_nonfinite_ref(b.data(), wt, n), want) << kernels::wtype_name(wt) << " at " << at;
        // A second bad value later does not change the answer; one earlier does.
        poison(b, wt, n - 1, !nan);
        EXPECT_EQ(weight_check::find_nonfinite(b.data(), wt, n), want) << kernels::wtype_name(wt);
      }
    }
  }
}

// The tiny safetensors fixture with one NaN in the middle of a matrix (not the first, middle or
// last row, which were all the old check read): refused, naming the tensor, the file and [r, c].
TEST(WeightCheck, NanInTheMiddleOfAMatrixIsRefusedNamingTensorAndFile) {
  using json = nlohmann::json;
  const std::string d = test::make_temp_dir("weight_check_mid");
  write_fixture_model(d, fixture_preset("tiny"));
  const std::string name = "model.layers.1.mlp.down_proj.weight";
  const TensorInfo* t = nullptr;
  std::string path, dtype;
  int64_t rows = 0, cols = 0;
  {
    WeightFiles f = WeightFiles::open_dir(d);
    t = f.find(name);
    ASSERT_NE(t, nullptr);
    path = t->file, dtype = t->dtype, rows = t->shape[0], cols = t->shape[1];
  }
  ASSERT_GE(rows, 8);
  const int64_t r = rows / 2 + 1, c = cols / 3;
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  uint64_t hlen = 0;
  std::memcpy(&hlen, bytes.data(), 8);
  const json h = json::parse(bytes.substr(8, hlen));
  const uint64_t begin = h[name]["data_offsets"][0];
  const int es = dtype == "F32" ? 4 : 2;
  char* at = bytes.data() + 8 + hlen + begin + size_t(r * cols + c) * size_t(es);
  if (es == 4) {
    const float nan = std::nanf("");
    std::memcpy(at, &nan, 4);
  } else {
    const uint16_t v = dtype == "BF16" ? 0x7FC0 : 0x7E00;
    std::memcpy(at, &v, 2);
  }
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), std::streamsize(bytes.size()));
  const std::string m = error_of([&] { (void)Model::load(d); });
  std::printf("%s\n", m.c_str());
  EXPECT_NE(m.find(name), std::string::npos) << m;
  EXPECT_NE(m.find(path), std::string::npos) << m;
  EXPECT_NE(m.find("non-finite"), std::string::npos) << m;
  EXPECT_NE(m.find("[" + std::to_string(r) + ", " + std::to_string(c) + "]"), std::string::npos) << m;
}

// A GGUF whose Q8_0 attn_v has one block with an Inf scale, in the middle of the matrix.
TEST(WeightCheck, NonFiniteBlockScaleInAQuantizedMatrixIsRefused) {
  using kernels::GgmlType;
  const int64_t H = 64, I = 128, V = 96, nh = 4, hd = 16;
  std::string file;
  // A llama GGUF whose blk.1.attn_v is Q8_0 (attn_v: not permuted by the loader).
  test::Builder g;
  {
    uint32_t s2 = 11;
    g.kv_str("general.architecture", "llama");
    g.kv_u32("llama.block_count", 2);
    g.kv_u32("llama.embedding_length", uint32_t(H));
    g.kv_u32("llama.feed_forward_length", uint32_t(I));
    g.kv_u32("llama.attention.head_count", uint32_t(nh));
    g.kv_u32("llama.attention.head_count_kv", 2);
    g.kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
    auto add = [&](const std::string& n, std::vector<int64_t> ne, float scale, bool quant) {
      const auto v = test::lcg_values(s2, ne.size() == 1 ? ne[0] : ne[0] * ne[1], scale);
      if (!quant) {
        g.tensor(n, GgmlType::F32, ne, v.data(), v.size() * 4);
        return;
      }
      std::vector<uint8_t> blocks(size_t(kernels::wtype_row_bytes(WType::Q8_0, int64_t(v.size()))));
      kernels::quantize_row(v.data(), WType::Q8_0, blocks.data(), int64_t(v.size()));
      // Row rows/2 + 1, second block: its f16 d (the block's first two bytes) becomes Inf.
      const int64_t cols = ne[0], rows = ne[1];
      const size_t blk = size_t((rows / 2 + 1) * kernels::wtype_row_bytes(WType::Q8_0, cols) +
                                kernels::wtype_block_bytes(WType::Q8_0));
      const uint16_t inf = 0x7C00;
      std::memcpy(&blocks[blk], &inf, 2);
      g.tensor(n, GgmlType::Q8_0, ne, blocks.data(), blocks.size());
    };
    add("token_embd.weight", {H, V}, 1.0f, false);
    add("output_norm.weight", {H}, 2.0f, false);
    for (int l = 0; l < 2; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      add(p + "attn_norm.weight", {H}, 2.0f, false);
      add(p + "ffn_norm.weight", {H}, 2.0f, false);
      add(p + "attn_q.weight", {H, nh * hd}, 0.3f, false);
      add(p + "attn_k.weight", {H, 2 * hd}, 0.3f, false);
      add(p + "attn_v.weight", {H, 2 * hd}, 0.3f, l == 1);
      add(p + "attn_output.weight", {nh * hd, H}, 0.3f, false);
      add(p + "ffn_gate.weight", {H, I}, 0.3f, false);
      add(p + "ffn_up.weight", {H, I}, 0.3f, false);
      add(p + "ffn_down.weight", {I, H}, 0.3f, false);
    }
  }
  const std::string dir = test::make_temp_dir("weight_check_q8");
  file = test::write(dir, "m.gguf", g.finish());
  const std::string m = error_of([&] { (void)Model::load(file); });
  std::printf("%s\n", m.c_str());
  EXPECT_NE(m.find(file), std::string::npos) << m;
  EXPECT_NE(m.find("layers.1.self_attn.v_proj"), std::string::npos) << m;
  EXPECT_NE(m.find("non-finite block scale"), std::string::npos) << m;
  EXPECT_NE(m.find("[" + std::to_string(2 * hd / 2 + 1) + ", 32]"), std::string::npos) << m;
}

}  // namespace
}  // namespace kvboost
