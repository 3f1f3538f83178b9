// AWQ 4-bit checkpoints: config validation and the load-time repack into Q4_Z rows (see awq.h
// for the format). The packing facts were checked against AutoAWQ's own packer and dequantizer
// (casper-hansen/AutoAWQ awq/modules/linear/gemm.py WQLinear_GEMM.from_linear: order_map
// [0, 2, 4, 6, 1, 3, 5, 7], qweight[:, col] |= intweight[:, col * 8 + order_map[i]] << 4i, the
// same for qzeros; awq/utils/packing_utils.py dequantize_gemm: unpack by shifts 0, 4, .., 28,
// reorder with AWQ_REVERSE_ORDER, (iweight - izeros) * scales with scales/zeros repeated
// group_size times along the input dimension), which vLLM's AWQ loader and transformers'
// awq integration share.
#include "awq.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "kvboost/common.h"
#include "kvboost/model.h"
#include "kvboost/model_files.h"

namespace kvboost {

using nlohmann::json;

namespace awq {

namespace {

const json* field(const json& qc, std::initializer_list<const char*> keys, std::string* name) {
  for (const char* k : keys) {
    auto it = qc.find(k);
    if (it != qc.end() && !it->is_null()) {
      *name = k;
      return &*it;
    }
  }
  *name = *keys.begin();
  return nullptr;
}

}  // namespace

std::optional<Config> parse_config(const json& config, const std::string& source) {
  auto it = config.find("quantization_config");
  if (it == config.end() || it->is_null()) return std::nullopt;
  const json& qc = *it;
  const std::string where = source + ": quantization_config";
  if (!qc.is_object()) fail(where, " must be an object, got ", qc.dump());
  auto qm = qc.find("quant_method");
  if (qm == qc.end() || !qm->is_string())
    fail(where, ".quant_method is missing or not a string (supported: \"awq\")");
  std::string method = qm->get<std::string>();
  std::transform(method.begin(), method.end(), method.begin(), [](unsigned char ch) { return char(std::tolower(ch)); });
  if (method != "awq")
    fail(where, ".quant_method = \"", qm->get<std::string>(),
         "\" is not supported (supported: \"awq\" 4-bit gemm; gptq, bitsandbytes, fp8, ... are not)");
  Config c;
  std::string name;
  // AutoAWQ's own quant_config.json says w_bit / q_group_size; transformers' config.json says
  // bits / group_size. vLLM accepts both; so do we.
  if (const json* b = field(qc, {"bits", "w_bit"}, &name)) {
    if (!b->is_number_integer()) fail(where, ".", name, " must be an integer, got ", b->dump());
    c.bits = b->get<int64_t>();
  }
  if (c.bits != 4) fail(where, ".", name, " = ", c.bits, " is not supported (AWQ checkpoints here must be 4-bit)");
  if (const json* g = field(qc, {"group_size", "q_group_size"}, &name)) {
    if (!g->is_number_integer()) fail(where, ".", name, " must be an integer, got ", g->dump());
    c.group_size = g->get<int64_t>();
  } else {
    fail(where, ".group_size is missing");
  }
  if (c.group_size == -1) {
    c.group_size = 0;  // one group per row: resolved per layer (in_features)
  } else if (c.group_size <= 0 || c.group_size % 32 != 0) {
    fail(where, ".", name, " = ", c.group_size, " is not supported (a positive multiple of 32, or -1)");
  }
  if (const json* z = field(qc, {"zero_point"}, &name)) {
    if (!z->is_boolean()) fail(where, ".zero_point must be true or false, got ", z->dump());
    c.zero_point = z->get<bool>();
  }
  if (!c.zero_point) fail(where, ".zero_point = false is not supported (asymmetric AWQ with qzeros only)");
  if (const json* v = field(qc, {"version"}, &name)) {
    if (!v->is_string()) fail(where, ".version must be a string, got ", v->dump());
    c.version = v->get<std::string>();
  }
  std::string lower = c.version;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char ch) { return char(std::tolower(ch)); });
  if (lower != "gemm")
    fail(where, ".version = \"", c.version, "\" is not supported (supported: \"gemm\"; gemv, gemv_fast, ",
         "exllama, marlin and ipex pack differently)");
  c.version = lower;
  if (const json* m = field(qc, {"modules_to_not_convert"}, &name)) {
    if (!m->is_array()) fail(where, ".modules_to_not_convert must be a list or null, got ", m->dump());
    for (const auto& s : *m) {
      if (!s.is_string()) fail(where, ".modules_to_not_convert entries must be strings, got ", s.dump());
      c.modules_to_not_convert.push_back(s.get<std::string>());
    }
  }
  return c;
}

bool not_converted(const Config& c, const std::string& prefix) {
  for (const auto& m : c.modules_to_not_convert)
    if (!m.empty() && prefix.find(m) != std::string::npos) return true;
  return false;
}

void repack_q4z(const int32_t* qweight, const int32_t* qzeros, const uint16_t* scales, int64_t in,
                int64_t out, int64_t group_size, uint8_t* dst) {
  const int64_t n_pack = out / 8, n_blocks = in / kQ4ZBlockElems;
  const size_t row_bytes = size_t(n_blocks * kQ4ZBlockBytes);
  parallel_for(n_pack, 1, 2, [&](int64_t c0, int64_t c1) {
    for (int64_t b = 0; b < n_blocks; ++b) {
      const int64_t g = b * kQ4ZBlockElems / group_size;
      for (int64_t c = c0; c < c1; ++c) {
        uint8_t qs[8][16] = {};
        for (int64_t kk = 0; kk < kQ4ZBlockElems; ++kk) {
          const uint32_t word = uint32_t(qweight[(b * kQ4ZBlockElems + kk) * n_pack + c]);
          const int shift = kk < 16 ? 0 : 4;
          for (int i = 0; i < 8; ++i)
            qs[kOrderMap[i]][kk & 15] |= uint8_t(((word >> (4 * i)) & 15u) << shift);
        }
        const uint32_t zword = uint32_t(qzeros[g * n_pack + c]);
        for (int i = 0; i < 8; ++i) {
          const int64_t n = c * 8 + kOrderMap[i];
          uint8_t* blk = dst + size_t(n) * row_bytes + size_t(b * kQ4ZBlockBytes);
          const uint16_t d = scales[g * out + n];
          std::memcpy(blk, &d, 2);  // little-endian f16, bit for bit
          blk[2] = uint8_t((zword >> (4 * i)) & 15u);
          blk[3] = 0;
          std::memcpy(blk + 4, qs[kOrderMap[i]], 16);
        }
      }
    }
  });
}

void q4z_to_q4z128(const uint8_t* src, int64_t rows, int64_t K, uint8_t* dst) {
  const int64_t n128 = K / kQ4Z128BlockElems;
  const size_t src_rb = size_t(K / kQ4ZBlockElems * kQ4ZBlockBytes), dst_rb = size_t(n128 * kQ4Z128BlockBytes);
  parallel_for(rows, 1, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t b = 0; b < n128; ++b) {
        const uint8_t* s = src + size_t(r) * src_rb + size_t(4 * b * kQ4ZBlockBytes);
        uint8_t* d = dst + size_t(r) * dst_rb + size_t(b * kQ4Z128BlockBytes);
        uint8_t q[128];
        for (int c = 0; c < 4; ++c) {
          const uint8_t* blk = s + c * kQ4ZBlockBytes;
          if (std::memcmp(blk, s, 4) != 0) fail("q4z_to_q4z128: row ", r, " block ", 4 * b + c, " has another (d, z) than its group of 128");
          for (int j = 0; j < 16; ++j) q[32 * c + j] = blk[4 + j] & 15, q[32 * c + 16 + j] = blk[4 + j] >> 4;
        }
        std::memcpy(d, s, 4);  // f16 d, z, reserved
        for (int h = 0; h < 2; ++h)
          for (int j = 0; j < 32; ++j) d[4 + 32 * h + j] = uint8_t(q[64 * h + j] | (q[64 * h + 32 + j] << 4));
      }
  });
}

void dequantize_q4z_row_ref(const uint8_t* row, float* dst, int64_t K) {
  for (int64_t b = 0; b < K / kQ4ZBlockElems; ++b) {
    const uint8_t* blk = row + b * kQ4ZBlockBytes;
    uint16_t dh;
    std::memcpy(&dh, blk, 2);
    const float d = f16_to_f32(dh);
    const int z = blk[2];
    float* x = dst + b * kQ4ZBlockElems;
    for (int j = 0; j < 16; ++j) {
      x[j] = d * float(int(blk[4 + j] & 15) - z);
      x[j + 16] = d * float(int(blk[4 + j] >> 4) - z);
    }
  }
}

void quantize(const float* w, int64_t out, int64_t in, int64_t group_size, int32_t* qweight, int32_t* qzeros,
              uint16_t* scales) {
  const int64_t n_groups = in / group_size, n_pack = out / 8;
  std::fill(qweight, qweight + in * n_pack, 0);
  std::fill(qzeros, qzeros + n_groups * n_pack, 0);
  // AWQ packs output column n into int32 column n / 8 at nibble slot[n % 8], the inverse of
  // order_map.
  int slot[8];
  for (int i = 0; i < 8; ++i) slot[kOrderMap[i]] = i;
  for (int64_t n = 0; n < out; ++n) {
    const int sh = 4 * slot[n % 8];
    for (int64_t g = 0; g < n_groups; ++g) {
      const float* x = w + n * in + g * group_size;
      float mn = x[0], mx = x[0];
      for (int64_t k = 1; k < group_size; ++k) mn = std::min(mn, x[k]), mx = std::max(mx, x[k]);
      const uint16_t sh16 = f32_to_f16(std::max(mx - mn, 1e-5f) / 15.0f);
      const float s = f16_to_f32(sh16);
      const int z = int(std::clamp(-std::nearbyint(mn / s), 0.0f, 15.0f));
      scales[g * out + n] = sh16;
      qzeros[g * n_pack + n / 8] |= int32_t(uint32_t(z) << sh);
      for (int64_t k = 0; k < group_size; ++k) {
        const int q = int(std::clamp(std::nearbyint(x[k] / s) + float(z), 0.0f, 15.0f));
        qweight[(g * group_size + k) * n_pack + n / 8] |= int32_t(uint32_t(q) << sh);
      }
    }
  }
}

void dequantize(const int32_t* qweight, const int32_t* qzeros, const uint16_t* scales, int64_t in, int64_t out,
                int64_t group_size, float* w) {
  const int64_t n_pack = out / 8;
  for (int64_t k = 0; k < in; ++k) {
    const int64_t g = k / group_size;
    for (int64_t c = 0; c < n_pack; ++c) {
      const uint32_t qw = uint32_t(qweight[k * n_pack + c]), zw = uint32_t(qzeros[g * n_pack + c]);
      for (int i = 0; i < 8; ++i) {
        const int64_t n = c * 8 + kOrderMap[i];
        const int q = int((qw >> (4 * i)) & 15u), z = int((zw >> (4 * i)) & 15u);
        w[n * in + k] = f16_to_f32(scales[g * out + n]) * float(q - z);
      }
    }
  }
}

}  // namespace awq

namespace {

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace

// Called by open_dir: when config.json declares AWQ, every <prefix>.qweight/.qzeros/.scales
// triple becomes one Q4_Z tensor "<prefix>.weight" [out, in] in an owned buffer, so that the
// decoder binds AWQ layers as it binds any other weight. Tensors without qweight (embeddings,
// lm_head, norms, biases, modules_to_not_convert) are left as they are.
void WeightFiles::apply_quantization(const std::string& dir) {
  const std::string cfg_path = path_join(dir, "config.json");
  if (!file_exists(cfg_path)) return;
  json cfg;
  try {
    cfg = json::parse(read_file(cfg_path));
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number like 1e512
    fail(cfg_path, ": malformed JSON: ", e.what());
  }
  const std::optional<awq::Config> qc = cfg.is_object() ? awq::parse_config(cfg, cfg_path) : std::nullopt;

  std::vector<std::string> prefixes;
  for (const auto& [name, t] : tensors_) {
    for (const char* suf : {".qweight", ".qzeros", ".scales"}) {
      if (!ends_with(name, suf)) continue;
      const std::string prefix = name.substr(0, name.size() - std::strlen(suf));
      if (!qc)
        fail(t.file, ": tensor \"", name, "\" is an AWQ tensor but ", cfg_path, " has no quantization_config");
      if (std::string(suf) == ".qweight") {
        prefixes.push_back(prefix);
      } else if (!tensors_.count(prefix + ".qweight")) {
        fail(t.file, ": tensor \"", name, "\" has no \"", prefix, ".qweight\" beside it (AWQ layer ", prefix,
             " is incomplete)");
      }
    }
  }
  if (!qc) return;
  // Groups of 128 inputs (or a multiple) become Q4_Z128 blocks (one header per group, 15% fewer
  // bytes than Q4_Z); KVBOOST_AWQ_BLOCK=32 keeps Q4_Z (A/B measurements, debugging).
  const char* block_env = std::getenv("KVBOOST_AWQ_BLOCK");
  const bool keep_q4z = block_env && std::string(block_env) == "32";

  for (const std::string& prefix : prefixes) {
    const TensorInfo qw = tensors_.at(prefix + ".qweight");
    const std::string where = qw.file + ": AWQ layer \"" + prefix + "\"";
    const TensorInfo* qz = find(prefix + ".qzeros");
    const TensorInfo* sc = find(prefix + ".scales");
    if (!qz) fail(where, ": tensor \"", prefix, ".qzeros\" is missing (qweight without zero points)");
    if (!sc) fail(where, ": tensor \"", prefix, ".scales\" is missing (qweight without scales)");
    if (qw.dtype != "I32") fail(qw.file, ": tensor \"", qw.name, "\" has dtype ", qw.dtype, ", AWQ qweight must be I32");
    if (qz->dtype != "I32") fail(qz->file, ": tensor \"", qz->name, "\" has dtype ", qz->dtype, ", AWQ qzeros must be I32");
    if (sc->dtype != "F16") fail(sc->file, ": tensor \"", sc->name, "\" has dtype ", sc->dtype, ", AWQ scales must be F16");
    if (qw.shape.size() != 2 || qw.shape[0] <= 0 || qw.shape[1] <= 0)
      fail(qw.file, ": tensor \"", qw.name, "\" has shape ", shape_str(qw.shape), ", AWQ qweight must be [in_features, out_features / 8]");
    const int64_t in = qw.shape[0], n_pack = qw.shape[1], out = n_pack * 8;
    const int64_t group = qc->group_size > 0 ? qc->group_size : in;
    if (group % 32 != 0)
      fail(where, ": group_size -1 means one group of in_features = ", in, " inputs, which is not a multiple of 32");
    if (in % group != 0)
      fail(cfg_path, ": quantization_config.group_size = ", group, " does not divide in_features = ", in,
           " of AWQ layer \"", prefix, "\" (", qw.file, ": qweight shape ", shape_str(qw.shape), ")");
    const int64_t n_groups = in / group;
    if (qz->shape != std::vector<int64_t>{n_groups, n_pack})
      fail(qz->file, ": tensor \"", qz->name, "\" has shape ", shape_str(qz->shape), ", expected ",
           shape_str({n_groups, n_pack}), " for qweight ", shape_str(qw.shape), " and group_size ", group);
    if (sc->shape != std::vector<int64_t>{n_groups, out})
      fail(sc->file, ": tensor \"", sc->name, "\" has shape ", shape_str(sc->shape), ", expected ",
           shape_str({n_groups, out}), " for qweight ", shape_str(qw.shape), " and group_size ", group);
    const std::string wname = prefix + ".weight";
    if (tensors_.count(wname))
      fail(where, ": has both \"", wname, "\" and an AWQ qweight (which one is the layer?)");

    const size_t q4z_bytes = size_t(out) * size_t(in / awq::kQ4ZBlockElems) * size_t(awq::kQ4ZBlockBytes);
    const bool g128 = group % awq::kQ4Z128BlockElems == 0 && !keep_q4z;
    const size_t nbytes =
        g128 ? size_t(out) * size_t(in / awq::kQ4Z128BlockElems) * size_t(awq::kQ4Z128BlockBytes) : q4z_bytes;
    auto buf = std::make_shared<std::vector<uint8_t>>(nbytes + 64);
    uint8_t* p = buf->data();
    while (reinterpret_cast<uintptr_t>(p) % 64) ++p;
    std::vector<uint8_t> q4z(g128 ? q4z_bytes : 0);
    awq::repack_q4z(static_cast<const int32_t*>(qw.data), static_cast<const int32_t*>(qz->data),
                    static_cast<const uint16_t*>(sc->data), in, out, group, g128 ? q4z.data() : p);
    if (g128) awq::q4z_to_q4z128(q4z.data(), out, in, p);
    owned_.push_back(buf);
    TensorInfo ti;
    ti.name = wname;
    ti.dtype = g128 ? "Q4_Z128" : "Q4_Z";
    ti.shape = {out, in};
    ti.data = p;
    ti.nbytes = nbytes;
    ti.file = qw.file;
    tensors_.erase(prefix + ".qweight");
    tensors_.erase(prefix + ".qzeros");
    tensors_.erase(prefix + ".scales");
    tensors_[wname] = std::move(ti);
  }
}

}  // namespace kvboost
