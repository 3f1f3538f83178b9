// AWQ 4-bit checkpoints (AutoAWQ "gemm"): the Q4_Z repack on hand-packed and random tensors,
// loader errors on bad configs and tensors, the repack against an independent numpy
// dequantization (tools/oracle/awq_oracle.py, run by the ctest fixture awq_fixture.generate), and
// whole-model logits against the exactly dequantized f32 reference model.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "awq.h"
#include "kvboost/kernels.h"
#include "kvboost/model.h"
#include "kvboost/model_files.h"
#include "testing/fixture.h"
#include "test_util.h"

using namespace kvboost;

namespace {

// AutoAWQ's order_map (awq/modules/linear/gemm.py), written out here rather than taken from
// awq.h so that the test packs independently of the code under test.
constexpr int kAwqOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};

// Packs logical [rows][cols] nibbles into AWQ int32 [rows][cols / 8] the way AutoAWQ does:
// packed[:, col] |= v[:, col * 8 + order_map[i]] << 4i.
std::vector<int32_t> awq_pack(const std::vector<int>& v, int64_t rows, int64_t cols) {
  std::vector<int32_t> p(size_t(rows * cols / 8), 0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols / 8; ++c)
      for (int i = 0; i < 8; ++i)
        p[size_t(r * cols / 8 + c)] |= int32_t(uint32_t(v[size_t(r * cols + c * 8 + kAwqOrder[i])]) << (4 * i));
  return p;
}

struct Layer {
  int64_t in, out, group;
  std::vector<int> q, z;  // q: [in][out], z: [in / group][out]
  std::vector<uint16_t> s;
  std::vector<int32_t> qweight, qzeros;
};

Layer random_layer(int64_t in, int64_t out, int64_t group, uint32_t seed) {
  std::mt19937 rng(seed);
  Layer L{in, out, group, {}, {}, {}, {}, {}};
  for (int64_t i = 0; i < in * out; ++i) L.q.push_back(int(rng() % 16));
  for (int64_t i = 0; i < in / group * out; ++i) L.z.push_back(int(rng() % 16));
  std::uniform_real_distribution<float> d(1e-4f, 0.05f);
  for (int64_t i = 0; i < in / group * out; ++i) L.s.push_back(f32_to_f16(d(rng)));
  L.qweight = awq_pack(L.q, in, out);
  L.qzeros = awq_pack(L.z, in / group, out);
  return L;
}

std::vector<uint8_t> repack(const Layer& L) {
  std::vector<uint8_t> dst(size_t(L.out * L.in / 32 * 20), 0xAB);
  awq::repack_q4z(L.qweight.data(), L.qzeros.data(), L.s.data(), L.in, L.out, L.group, dst.data());
  return dst;
}

std::string load_error(const std::string& dir) {
  try {
    Model::load(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

void write(const std::string& path, const std::string& data) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << data;
}

FixtureSpec awq_spec() {
  FixtureSpec s = fixture_preset("tiny");
  s.tokenizer_kind = "";
  s.vocab = 256;
  s.intermediate = 192;
  s.quant = "awq";
  s.group_size = 32;
  return s;
}

std::vector<float> all_logits(const Model& m, const std::vector<int32_t>& ids) {
  KvCache kv(m.config(), int64_t(ids.size()));
  std::vector<float> out(ids.size() * size_t(m.config().vocab_size));
  m.forward(ids.data(), int64_t(ids.size()), kv, out.data(), /*all_logits=*/true);
  return out;
}

std::vector<int32_t> greedy(const Model& m, const std::vector<int32_t>& ids, int n) {
  KvCache kv(m.config(), int64_t(ids.size()) + n);
  std::vector<float> logits(size_t(m.config().vocab_size));
  m.forward(ids.data(), int64_t(ids.size()), kv, logits.data());
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    int32_t t = int32_t(kernels::argmax(logits.data(), m.config().vocab_size));
    out.push_back(t);
    if (i + 1 < n) m.forward(&t, 1, kv, logits.data());
  }
  return out;
}

double max_abs(const std::vector<float>& a) {
  double m = 0;
  for (float v : a) m = std::max(m, double(std::fabs(v)));
  return m;
}
double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, double(std::fabs(a[i] - b[i])));
  return d;
}

}  // namespace

// ---- the repack ----

TEST(AwqRepack, HandPackedBlockHasTheQ4ZLayout) {
  // in = 64 (two blocks, one group of 32 each), out = 16 (two int32 columns).
  const int64_t in = 64, out = 16, group = 32;
  Layer L{in, out, group, {}, {}, {}, {}, {}};
  for (int64_t k = 0; k < in; ++k)
    for (int64_t n = 0; n < out; ++n) L.q.push_back(int((k + 3 * n) % 16));
  for (int64_t g = 0; g < 2; ++g)
    for (int64_t n = 0; n < out; ++n) L.z.push_back(int((n + 5 * g) % 16));
  for (int64_t g = 0; g < 2; ++g)
    for (int64_t n = 0; n < out; ++n) L.s.push_back(f32_to_f16(0.25f * float(n + 1) + float(g)));
  L.qweight = awq_pack(L.q, in, out);
  L.qzeros = awq_pack(L.z, 2, out);
  // One int32 spelled out: row 0, columns 0..7 hold q = 3n % 16 = 0 3 6 9 12 15 2 5; nibble i
  // holds column order[i] = 0 2 4 6 1 3 5 7, so nibbles 0..7 are 0 6 12 2 3 9 15 5.
  EXPECT_EQ(uint32_t(L.qweight[0]), 0x5F932C60u);
  const std::vector<uint8_t> d = repack(L);
  for (int64_t n = 0; n < out; ++n) {
    for (int64_t b = 0; b < 2; ++b) {
      const uint8_t* blk = d.data() + (n * 2 + b) * 20;
      uint16_t dh;
      std::memcpy(&dh, blk, 2);
      EXPECT_EQ(dh, L.s[size_t(b * out + n)]) << n << " " << b;
      EXPECT_EQ(blk[2], L.z[size_t(b * out + n)]);
      EXPECT_EQ(blk[3], 0);
      for (int j = 0; j < 16; ++j) {
        EXPECT_EQ(blk[4 + j] & 15, L.q[size_t((b * 32 + j) * out + n)]) << n << " " << b << " " << j;
        EXPECT_EQ(blk[4 + j] >> 4, L.q[size_t((b * 32 + 16 + j) * out + n)]) << n << " " << b << " " << j;
      }
    }
  }
}

TEST(AwqRepack, RandomLayersDequantizeExactly) {
  for (auto [in, out, group] : {std::tuple<int64_t, int64_t, int64_t>{256, 48, 64}, {128, 8, 128}, {96, 24, 32},
                                {384, 136, 128}}) {
    SCOPED_TRACE(std::to_string(in) + "x" + std::to_string(out) + " g" + std::to_string(group));
    const Layer L = random_layer(in, out, group, uint32_t(in * 7 + out));
    const std::vector<uint8_t> d = repack(L);
    std::vector<float> row(static_cast<size_t>(in));
    for (int64_t n = 0; n < out; ++n) {
      awq::dequantize_q4z_row_ref(d.data() + n * (in / 32) * 20, row.data(), in);
      for (int64_t k = 0; k < in; ++k) {
        const float want = f16_to_f32(L.s[size_t(k / group * out + n)]) *
                           float(L.q[size_t(k * out + n)] - L.z[size_t(k / group * out + n)]);
        ASSERT_EQ(row[size_t(k)], want) << "n " << n << " k " << k;
      }
    }
    // awq::dequantize (what the fixture's reference model stores) agrees.
    std::vector<float> w(static_cast<size_t>(in * out));
    awq::dequantize(L.qweight.data(), L.qzeros.data(), L.s.data(), in, out, group, w.data());
    for (int64_t n = 0; n < out; ++n) {
      awq::dequantize_q4z_row_ref(d.data() + n * (in / 32) * 20, row.data(), in);
      ASSERT_EQ(0, std::memcmp(row.data(), w.data() + n * in, size_t(in) * 4)) << n;
    }
  }
}

TEST(AwqRepack, KernelsReadTheRepackedRowsAsTheReference) {
  // The kernels' own Q4_Z decoding (to_f32, matmul_ref) sees exactly the AWQ values.
  const int64_t in = 256, out = 40, group = 128, M = 3;
  const Layer L = random_layer(in, out, group, 9);
  const std::vector<uint8_t> d = repack(L);
  ASSERT_EQ(kernels::wtype_row_bytes(kernels::WType::Q4_Z, in), in / 32 * 20);
  std::vector<float> w(static_cast<size_t>(in * out)), row(static_cast<size_t>(in));
  awq::dequantize(L.qweight.data(), L.qzeros.data(), L.s.data(), in, out, group, w.data());
  for (int64_t n = 0; n < out; ++n) {
    kernels::to_f32(d.data() + n * (in / 32) * 20, kernels::WType::Q4_Z, row.data(), in);
    ASSERT_EQ(0, std::memcmp(row.data(), w.data() + n * in, size_t(in) * 4)) << n;
  }
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  std::vector<float> x(static_cast<size_t>(M * in)), bias(static_cast<size_t>(out));
  for (auto& v : x) v = nd(rng);
  for (auto& v : bias) v = nd(rng);
  std::vector<float> yq(static_cast<size_t>(M * out)), yf(yq.size()), yk(yq.size());
  kernels::matmul_ref(x.data(), d.data(), kernels::WType::Q4_Z, bias.data(), yq.data(), M, out, in);
  kernels::matmul_ref(x.data(), w.data(), kernels::WType::F32, bias.data(), yf.data(), M, out, in);
  EXPECT_EQ(yq, yf);  // both accumulate the same products in double
  // The fast matmul rounds x to 8 bits per block of 32: close, within its documented bound.
  kernels::matmul(x.data(), d.data(), kernels::WType::Q4_Z, bias.data(), yk.data(), M, out, in);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < out; ++n) {
      double bound = 0;
      for (int64_t b = 0; b < in / 32; ++b) {
        float amax = 0, wsum = 0;
        for (int64_t k = b * 32; k < b * 32 + 32; ++k) {
          amax = std::max(amax, std::fabs(x[size_t(m * in + k)]));
          wsum += std::fabs(w[size_t(n * in + k)]);
        }
        bound += amax / 127 / 2 * wsum;
      }
      EXPECT_NEAR(yk[size_t(m * out + n)], yf[size_t(m * out + n)], bound * 1.01 + 1e-5) << m << " " << n;
    }
}

// Groups of 128 (or a multiple): the Q4_Z rows regrouped into Q4_Z128 hold the same values, and
// the kernels read them as the AWQ dequantization (to_f32, matmul_ref exactly; matmul within the
// activation-rounding bound, and close to the Q4_Z matmul of the same weights).
TEST(AwqRepack, Q4Z128RegroupIsExact) {
  using kernels::WType;
  for (auto [in, out, group] : {std::tuple<int64_t, int64_t, int64_t>{256, 40, 128}, {768, 24, 256}, {128, 8, 128}}) {
    SCOPED_TRACE(std::to_string(in) + "x" + std::to_string(out) + " g" + std::to_string(group));
    const Layer L = random_layer(in, out, group, uint32_t(in + out));
    const std::vector<uint8_t> d = repack(L);
    std::vector<uint8_t> g(size_t(out * kernels::wtype_row_bytes(WType::Q4_Z128, in)), 0xCD);
    awq::q4z_to_q4z128(d.data(), out, in, g.data());
    std::vector<float> w(static_cast<size_t>(in * out)), row(static_cast<size_t>(in));
    awq::dequantize(L.qweight.data(), L.qzeros.data(), L.s.data(), in, out, group, w.data());
    const int64_t rb = kernels::wtype_row_bytes(WType::Q4_Z128, in);
    ASSERT_EQ(rb, in / 128 * 68);
    for (int64_t n = 0; n < out; ++n) {
      kernels::to_f32(g.data() + n * rb, WType::Q4_Z128, row.data(), in);
      ASSERT_EQ(0, std::memcmp(row.data(), w.data() + n * in, size_t(in) * 4)) << n;
    }
    const int64_t M = 2;
    std::mt19937 rng(3);
    std::normal_distribution<float> nd;
    std::vector<float> x(static_cast<size_t>(M * in));
    for (auto& v : x) v = nd(rng);
    std::vector<float> yq(static_cast<size_t>(M * out)), yf(yq.size()), yz(yq.size()), yg(yq.size());
    kernels::matmul_ref(x.data(), g.data(), WType::Q4_Z128, nullptr, yq.data(), M, out, in);
    kernels::matmul_ref(x.data(), w.data(), WType::F32, nullptr, yf.data(), M, out, in);
    EXPECT_EQ(yq, yf);
    for (int64_t m : {int64_t(1), M}) {
      kernels::matmul(x.data(), d.data(), WType::Q4_Z, nullptr, yz.data(), m, out, in);
      kernels::matmul(x.data(), g.data(), WType::Q4_Z128, nullptr, yg.data(), m, out, in);
      for (int64_t i = 0; i < m * out; ++i) {
        // The same integer dots per block of 32; only the f32 summation order differs.
        EXPECT_NEAR(yg[size_t(i)], yz[size_t(i)], 1e-4 * (1 + std::fabs(yf[size_t(i)]))) << m << " " << i;
      }
    }
  }
  // A group of 64 (two headers per 128) cannot be regrouped.
  const Layer L = random_layer(128, 8, 64, 4);
  const std::vector<uint8_t> d = repack(L);
  std::vector<uint8_t> g(size_t(8 * 68));
  EXPECT_THROW(awq::q4z_to_q4z128(d.data(), 8, 128, g.data()), Error);
}

TEST(AwqRepack, QuantizerIsWithinHalfAStep) {
  const int64_t out = 16, in = 256, group = 64;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  std::vector<float> w(static_cast<size_t>(out * in));
  for (auto& v : w) v = nd(rng);
  w[5] = 0.3f;  // an outlier widens its group's step
  std::vector<int32_t> qw(static_cast<size_t>(in * out / 8)), qz(size_t(in / group * out / 8));
  std::vector<uint16_t> sc(static_cast<size_t>(in / group * out));
  awq::quantize(w.data(), out, in, group, qw.data(), qz.data(), sc.data());
  std::vector<float> back(w.size());
  awq::dequantize(qw.data(), qz.data(), sc.data(), in, out, group, back.data());
  for (int64_t n = 0; n < out; ++n)
    for (int64_t k = 0; k < in; ++k) {
      const float s = f16_to_f32(sc[size_t(k / group * out + n)]);
      ASSERT_LE(std::fabs(back[size_t(n * in + k)] - w[size_t(n * in + k)]), 0.5f * s * 1.01f) << n << " " << k;
    }
}

// ---- configs and tensors the loader refuses ----

TEST(AwqConfig, RefusedConfigsNameFieldAndValue) {
  auto err = [](const std::string& qc) {
    try {
      awq::parse_config(nlohmann::json::parse(R"({"quantization_config": )" + qc + "}"), "m/config.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  std::string e = err(R"({"quant_method": "gptq", "bits": 4, "group_size": 128})");
  EXPECT_NE(e.find("m/config.json: quantization_config.quant_method = \"gptq\" is not supported"), std::string::npos) << e;
  e = err(R"({"quant_method": "bitsandbytes", "load_in_4bit": true})");
  EXPECT_NE(e.find("\"bitsandbytes\""), std::string::npos) << e;
  e = err(R"({"quant_method": "fp8"})");
  EXPECT_NE(e.find("\"fp8\""), std::string::npos) << e;
  e = err(R"({"bits": 4})");
  EXPECT_NE(e.find("quantization_config.quant_method is missing"), std::string::npos) << e;
  e = err(R"({"quant_method": "awq", "bits": 8, "group_size": 128, "version": "gemm"})");
  EXPECT_NE(e.find("quantization_config.bits = 8 is not supported"), std::string::npos) << e;
  e = err(R"({"quant_method": "awq", "w_bit": 3, "q_group_size": 128, "version": "GEMM"})");
  EXPECT_NE(e.find("quantization_config.w_bit = 3"), std::string::npos) << e;
  e = err(R"({"quant_method": "awq", "bits": 4, "group_size": 48, "version": "gemm"})");
  EXPECT_NE(e.find("quantization_config.group_size = 48 is not supported"), std::string::npos) << e;
  e = err(R"({"quant_method": "awq", "bits": 4, "group_size": 0, "version": "gemm"})");
  EXPECT_NE(e.find("group_size = 0"), std::string::npos) << e;
  e = err(R"({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"})");
  EXPECT_NE(e.find("quantization_config.version = \"gemv\" is not supported"), std::string::npos) << e;
  e = err(R"({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": false})");
  EXPECT_NE(e.find("zero_point = false"), std::string::npos) << e;
  e = err(R"({"quant_method": "awq", "bits": 4, "group_size": 128, "modules_to_not_convert": "lm_head"})");
  EXPECT_NE(e.find("modules_to_not_convert must be a list"), std::string::npos) << e;
  // Accepted: AutoAWQ's own spelling, upper-case version, -1 (one group per row), null lists.
  auto c = awq::parse_config(nlohmann::json::parse(R"({"quantization_config": {"quant_method": "AWQ",
      "w_bit": 4, "q_group_size": 64, "version": "GEMM", "zero_point": true, "modules_to_not_convert": null}})"), "x");
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->group_size, 64);
  c = awq::parse_config(nlohmann::json::parse(R"({"quantization_config": {"quant_method": "awq", "bits": 4,
      "group_size": -1, "modules_to_not_convert": ["visual", "lm_head"]}})"), "x");
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->group_size, 0);
  EXPECT_TRUE(awq::not_converted(*c, "model.visual.blocks.0.attn"));
  EXPECT_FALSE(awq::not_converted(*c, "model.layers.0.mlp.up_proj"));
  EXPECT_FALSE(awq::parse_config(nlohmann::json::parse(R"({"model_type": "llama"})"), "x").has_value());
}

TEST(AwqLoader, BadCheckpointsGiveErrorsNamingFileFieldValue) {
  const std::string dir = test::make_temp_dir("awq_loader");
  write_fixture_model(dir, awq_spec());
  ASSERT_NO_THROW(WeightFiles::open_dir(dir));
  const std::string cfg_path = dir + "/config.json", st = dir + "/model.safetensors";
  const std::string cfg = read_file(cfg_path), good = read_file(st);
  auto with_config = [&](const std::string& from, const std::string& to) {
    std::string c = cfg;
    const size_t at = c.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) c.replace(at, from.size(), to);
    write(cfg_path, c);
    std::string e = load_error(dir);
    write(cfg_path, cfg);
    return e;
  };
  // config.json fields (the fixture writes them as transformers does, indent 2)
  std::string e = with_config("\"quant_method\": \"awq\"", "\"quant_method\": \"gptq\"");
  EXPECT_NE(e.find(cfg_path), std::string::npos) << e;
  EXPECT_NE(e.find("quant_method = \"gptq\""), std::string::npos) << e;
  e = with_config("\"bits\": 4", "\"bits\": 8");
  EXPECT_NE(e.find(cfg_path + ": quantization_config.bits = 8"), std::string::npos) << e;
  e = with_config("\"group_size\": 32", "\"group_size\": 40");
  EXPECT_NE(e.find(cfg_path + ": quantization_config.group_size = 40"), std::string::npos) << e;
  // a valid group size the layers cannot have: 128 does not divide hidden = 64
  e = with_config("\"group_size\": 32", "\"group_size\": 128");
  EXPECT_NE(e.find(cfg_path + ": quantization_config.group_size = 128 does not divide in_features = "),
            std::string::npos) << e;
  // 64 divides every input size but the tensors hold 32-input groups
  e = with_config("\"group_size\": 32", "\"group_size\": 64");
  EXPECT_NE(e.find(".qzeros\" has shape [6, 8], expected [3, 8]"), std::string::npos) << e;
  e = with_config("\"version\": \"gemm\"", "\"version\": \"exllama\"");
  EXPECT_NE(e.find("version = \"exllama\""), std::string::npos) << e;
  // AWQ tensors without a quantization_config
  e = with_config("\"quantization_config\"", "\"no_quantization_config\"");
  EXPECT_NE(e.find("is an AWQ tensor but"), std::string::npos) << e;
  EXPECT_NE(e.find("has no quantization_config"), std::string::npos) << e;

  // Tensor edits that keep the header length: a renamed tensor, changed dtype or shape.
  auto with_header = [&](const std::string& from, const std::string& to) {
    std::string d = good;
    uint64_t hl = 0;
    for (int i = 0; i < 8; ++i) hl |= uint64_t(uint8_t(d[size_t(i)])) << (8 * i);
    const size_t at = d.substr(0, 8 + hl).find(from);
    EXPECT_NE(at, std::string::npos) << from;
    EXPECT_EQ(from.size(), to.size());
    if (at != std::string::npos) d.replace(at, from.size(), to);
    write(st, d);
    std::string err = load_error(dir);
    write(st, good);
    return err;
  };
  const std::string q = "model.layers.0.self_attn.q_proj";
  e = with_header("\"" + q + ".qzeros\"", "\"" + q + ".qzeroX\"");
  EXPECT_NE(e.find(st), std::string::npos) << e;
  EXPECT_NE(e.find(q + ".qzeros\" is missing"), std::string::npos) << e;
  e = with_header("\"" + q + ".scales\"", "\"" + q + ".scaleX\"");
  EXPECT_NE(e.find(q + ".scales\" is missing"), std::string::npos) << e;
  e = with_header("\"" + q + ".qweight\"", "\"" + q + ".qweighX\"");
  EXPECT_NE(e.find(q + ".qzeros\" has no \"" + q + ".qweight\""), std::string::npos) << e;
  // q_proj: qweight [64, 8] I32, qzeros [2, 8] I32, scales [2, 64] F16
  e = with_header("{\"dtype\":\"I32\",\"shape\":[64,8]", "{\"dtype\":\"F32\",\"shape\":[64,8]");
  EXPECT_NE(e.find(".qweight\" has dtype F32, AWQ qweight must be I32"), std::string::npos) << e;
  EXPECT_NE(e.find(st), std::string::npos) << e;
  e = with_header("{\"dtype\":\"F16\",\"shape\":[2,64]", "{\"dtype\":\"I16\",\"shape\":[2,64]");
  EXPECT_NE(e.find(q + ".scales\" has dtype I16, AWQ scales must be F16"), std::string::npos) << e;
  e = with_header("{\"dtype\":\"I32\",\"shape\":[2,8]", "{\"dtype\":\"U32\",\"shape\":[2,8]");
  EXPECT_NE(e.find(q + ".qzeros\" has dtype U32, AWQ qzeros must be I32"), std::string::npos) << e;
  // ill-shaped: [64, 8] read as [8, 64] (same bytes): in = 8, out = 512
  e = with_header("{\"dtype\":\"I32\",\"shape\":[64,8]", "{\"dtype\":\"I32\",\"shape\":[8,64]");
  EXPECT_NE(e.find(st), std::string::npos) << e;
  EXPECT_NE(e.find("[8, 64]"), std::string::npos) << e;
  // truncated: [64, 8] declared as [64, 9] (36 more bytes than its data_offsets span)
  e = with_header("{\"dtype\":\"I32\",\"shape\":[64,8]", "{\"dtype\":\"I32\",\"shape\":[64,9]");
  EXPECT_NE(e.find(st), std::string::npos) << e;
  EXPECT_NE(e.find(".qweight\""), std::string::npos) << e;
  EXPECT_NE(e.find("data_offsets span"), std::string::npos) << e;
  // a whole file cut short
  write(st, good.substr(0, good.size() - 100));
  e = load_error(dir);
  write(st, good);
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
}

TEST(AwqLoader, PresentsQ4ZWeightsAndKeepsUnconvertedLayers) {
  const std::string dir = test::make_temp_dir("awq_present");
  FixtureSpec s = awq_spec();
  s.arch = "qwen2";
  s.awq_not_convert = {"down_proj"};
  write_fixture_model(dir, s);
  const WeightFiles w = WeightFiles::open_dir(dir);
  const TensorInfo* q = w.find("model.layers.1.self_attn.q_proj.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->dtype, "Q4_Z");
  EXPECT_EQ(q->shape, (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(q->nbytes, size_t(64 * 2 * 20));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(q->data) % 64, 0u);
  EXPECT_EQ(w.find("model.layers.1.self_attn.q_proj.qweight"), nullptr);
  EXPECT_EQ(w.find("model.layers.1.self_attn.q_proj.bias")->dtype, "F32");  // tiny preset dtype
  EXPECT_EQ(w.find("model.layers.0.mlp.up_proj.weight")->shape, (std::vector<int64_t>{192, 64}));
  EXPECT_EQ(w.find("model.layers.0.mlp.down_proj.weight")->dtype, "F32");  // modules_to_not_convert
  EXPECT_EQ(w.find("model.embed_tokens.weight")->dtype, "F32");
}

TEST(AwqLoader, Group128LoadsAsQ4Z128) {
  const std::string dir = test::make_temp_dir("awq_g128");
  FixtureSpec s = awq_spec();
  s.arch = "qwen2";
  s.hidden = 128, s.heads = 4, s.kv_heads = 2, s.head_dim = 32, s.intermediate = 256, s.group_size = 128;
  write_fixture_model(dir, s);
  {
    const WeightFiles w = WeightFiles::open_dir(dir);
    const TensorInfo* q = w.find("model.layers.1.self_attn.q_proj.weight");
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(q->dtype, "Q4_Z128");
    EXPECT_EQ(q->shape, (std::vector<int64_t>{128, 128}));
    EXPECT_EQ(q->nbytes, size_t(128 * 68));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(q->data) % 64, 0u);
    EXPECT_EQ(w.find("model.layers.0.mlp.down_proj.weight")->dtype, "Q4_Z128");  // in = 256
  }
  ::setenv("KVBOOST_AWQ_BLOCK", "32", 1);
  const WeightFiles w32 = WeightFiles::open_dir(dir);
  ::unsetenv("KVBOOST_AWQ_BLOCK");
  EXPECT_EQ(w32.find("model.layers.1.self_attn.q_proj.weight")->dtype, "Q4_Z");
}

// ---- against the independent numpy dequantization (tools/oracle/awq_oracle.py) ----

namespace {
std::string oracle_dir() {
  const char* e = std::getenv("KVBOOST_AWQ_FIXTURE_DIR");
  return e && *e ? e : kvboost::test::binary_dir() + "/tests/oracle/awq_fixtures";
}
}  // namespace

TEST(AwqOracle, RepackMatchesNumpyDequantizationBitForBit) {
  const std::string m = oracle_dir() + "/manifest.json";
  if (!file_exists(m)) {
    if (test::oracles_required()) FAIL() << "missing " << m;
    GTEST_SKIP() << "no AWQ fixtures in " << oracle_dir() << " (ctest runs tools/oracle/awq_oracle.py; needs numpy)";
  }
  const auto j = nlohmann::json::parse(read_file(m));
  int cases = 0;
  for (const auto& [name, c] : j.items()) {
    SCOPED_TRACE(name);
    const WeightFiles awq = WeightFiles::open_dir(c["model"].get<std::string>());
    const WeightFiles oracle = WeightFiles::open_file(c["oracle"].get<std::string>());
    const WeightFiles ref = WeightFiles::open_dir(c["reference"].get<std::string>());
    int layers = 0;
    for (const auto& [tname, o] : oracle.tensors()) {
      const TensorInfo* t = awq.find(tname);
      ASSERT_NE(t, nullptr) << tname;
      ASSERT_TRUE(t->dtype == "Q4_Z" || t->dtype == "Q4_Z128") << tname << " " << t->dtype;
      ASSERT_EQ(t->shape, o.shape) << tname;
      const int64_t N = t->shape[0], K = t->shape[1];
      std::vector<float> w(static_cast<size_t>(N * K));
      const kernels::WType wt = t->dtype == "Q4_Z" ? kernels::WType::Q4_Z : kernels::WType::Q4_Z128;
      const int64_t rb = kernels::wtype_row_bytes(wt, K);
      for (int64_t n = 0; n < N; ++n) {
        const uint8_t* row = static_cast<const uint8_t*>(t->data) + n * rb;
        if (wt == kernels::WType::Q4_Z) awq::dequantize_q4z_row_ref(row, w.data() + n * K, K);
        else kernels::to_f32(row, wt, w.data() + n * K, K);
      }
      EXPECT_EQ(0, std::memcmp(w.data(), o.data, w.size() * 4)) << tname << " vs numpy";
      const TensorInfo* r = ref.find(tname);
      ASSERT_NE(r, nullptr);
      EXPECT_EQ(0, std::memcmp(w.data(), r->data, w.size() * 4)) << tname << " vs the reference model";
      ++layers;
    }
    EXPECT_GT(layers, 0);
    // Every projection that is not an oracle tensor must have stayed unquantized (down_proj of
    // qwen2_g64 is in modules_to_not_convert).
    for (const auto& [tname, t] : awq.tensors())
      if (t.dtype == "Q4_Z" || t.dtype == "Q4_Z128") {
        EXPECT_NE(oracle.find(tname), nullptr) << tname;
      }
    ++cases;
  }
  EXPECT_EQ(cases, 3);
}

// ---- whole models: AWQ vs the f32 model it exactly represents ----

TEST(AwqModel, LogitsAndGreedyMatchTheDequantizedReference) {
  // qwen2_g128: groups of 128, loaded as Q4_Z128 (the others are Q4_Z: groups of 32 and 64).
  for (const std::string name : {"llama", "qwen2", "qwen3", "qwen2_g128"}) {
    SCOPED_TRACE(name);
    const std::string arch = name == "qwen2_g128" ? "qwen2" : name;
    const std::string dir = test::make_temp_dir("awq_model_" + name);
    FixtureSpec s = awq_spec();
    s.arch = arch;
    s.dtype = arch == "llama" ? "f16" : "bf16";
    s.tokenizer_kind = "bytelevel";
    s.vocab = 0;
    s.dequant_dir = dir + "/reference";
    s.seed = 21;
    if (arch == "qwen3") s.hidden = 128, s.heads = 4, s.kv_heads = 2, s.head_dim = 32, s.intermediate = 256, s.group_size = 64;
    if (name == "qwen2_g128")
      s.hidden = 128, s.heads = 4, s.kv_heads = 2, s.head_dim = 32, s.intermediate = 256, s.group_size = 128;
    write_fixture_model(dir + "/awq", s);
    EXPECT_EQ(WeightFiles::open_dir(dir + "/awq").find("model.layers.0.mlp.up_proj.weight")->dtype,
              name == "qwen2_g128" ? "Q4_Z128" : "Q4_Z");
    auto a = Model::load(dir + "/awq");
    auto r = Model::load(dir + "/reference");
    std::mt19937 rng(5);
    std::vector<int32_t> ids;
    for (int i = 0; i < 24; ++i) ids.push_back(int32_t(rng() % uint32_t(a->config().vocab_size)));
    const auto la = all_logits(*a, ids), lr = all_logits(*r, ids);
    const double scale = std::max(1.0, max_abs(lr)), diff = max_abs_diff(la, lr);
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < la.size(); ++i) ab += double(la[i]) * lr[i], aa += double(la[i]) * la[i], bb += double(lr[i]) * lr[i];
    const double cos = ab / std::sqrt(aa * bb);
    int top1 = 0;
    const int64_t V = a->config().vocab_size;
    for (size_t t = 0; t < ids.size(); ++t)
      top1 += kernels::argmax(la.data() + t * V, V) == kernels::argmax(lr.data() + t * V, V);
    std::printf("  %-10s max|awq - dequantized f32| %.3e (max |logit| %.3f), cosine %.6f, top-1 %d/%zu\n",
                name.c_str(), diff, scale, cos, top1, ids.size());
    // The same weights; but the quantized matmul rounds activations to 8 bits per block of 32
    // (kernels.h) and the f32 one does not: close, not equal. Stated tolerance: max |diff| <=
    // 5% of the largest logit, cosine >= 0.999, the same greedy tokens.
    EXPECT_LE(diff, 5e-2 * scale);
    EXPECT_GE(cos, 0.999);
    EXPECT_EQ(greedy(*a, ids, 16), greedy(*r, ids, 16));
  }
}

TEST(AwqModel, LayerStreamingGivesBitIdenticalLogits) {
  // The repacked Q4_Z / Q4_Z128 layers are owned buffers, not file ranges: the layer streamer must
  // serve them too (through its scratch file) and give exactly the resident model's logits.
  for (const int64_t group : {32, 128}) {
  SCOPED_TRACE(group);
  const std::string dir = test::make_temp_dir("awq_stream_g" + std::to_string(group));
  FixtureSpec s = awq_spec();
  s.layers = 3;
  if (group == 128) s.hidden = 128, s.heads = 4, s.kv_heads = 2, s.head_dim = 32, s.intermediate = 256, s.group_size = 128;
  write_fixture_model(dir, s);
  LoadOptions stored;  // streamed layers keep the stored layout: compare with the same
  stored.pack_weights = false;
  auto resident = Model::load(dir, stored);
  const std::vector<int32_t> ids = {1, 17, 200, 4, 99, 250, 3, 42, 8, 128, 77, 5};
  const auto want = all_logits(*resident, ids);
  // The smallest budget the streamer takes (two layer slots): found by trying, so that the test
  // does not depend on the streamer's extent alignment.
  std::unique_ptr<Model> m;
  for (uint64_t budget = 4096; !m && budget <= uint64_t(resident->weight_bytes()); budget += 4096) {
    LoadOptions o;
    o.weight_budget = budget;
    try {
      m = Model::load(dir, o);
    } catch (const Error&) {
    }
  }
  ASSERT_TRUE(m);
  ASSERT_TRUE(m->stream_info().streaming);
  EXPECT_EQ(m->stream_info().n_slots, 2);
  const auto got = all_logits(*m, ids);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)));
  }
}
