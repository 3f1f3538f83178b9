// The Llama-family decoder shared by llama, mistral, qwen2 and qwen3: weight binding with
// shape/dtype checks, RoPE tables, and the forward pass. Architecture differences are
// configuration (QKV bias, q/k norm, sliding window, rope scaling), not separate code paths.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

#include "kvboost/kernels.h"
#include "kvboost/model.h"

namespace kvboost {

using kernels::WType;

struct Model::Layer {
  std::vector<float> attn_norm, mlp_norm, q_norm, k_norm, q_bias, k_bias, v_bias, o_bias;
  Weight wq, wk, wv, wo, w_gate, w_up, w_down;
  int64_t window = 0;
};

namespace {

WType wtype_of(const TensorInfo& t) {
  if (t.dtype == "F32") return WType::F32;
  if (t.dtype == "F16") return WType::F16;
  if (t.dtype == "BF16") return WType::BF16;
  fail(t.file, ": tensor \"", t.name, "\" has dtype ", t.dtype, " (supported: F32, F16, BF16)");
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

const TensorInfo& require(const WeightFiles& files, const std::string& dir, const std::string& name,
                          const std::vector<int64_t>& shape) {
  const TensorInfo* t = files.find(name);
  if (!t) fail(dir, ": weight \"", name, "\" is missing from the safetensors files");
  if (t->shape != shape)
    fail(t->file, ": tensor \"", name, "\" has shape ", shape_str(t->shape), ", expected ", shape_str(shape));
  wtype_of(*t);
  return *t;
}

Weight matrix(const WeightFiles& f, const std::string& dir, const std::string& name, int64_t rows, int64_t cols) {
  const TensorInfo& t = require(f, dir, name, {rows, cols});
  return Weight{t.data, wtype_of(t), rows, cols};
}

std::vector<float> vec(const WeightFiles& f, const std::string& dir, const std::string& name, int64_t n) {
  const TensorInfo& t = require(f, dir, name, {n});
  std::vector<float> out(static_cast<size_t>(n));
  kernels::to_f32(t.data, wtype_of(t), out.data(), n);
  return out;
}

// Hugging Face's inv_freq, in float32 as torch computes it, with llama3 / linear scaling.
std::vector<float> rope_inv_freq(const ModelConfig& c) {
  const int64_t half = c.head_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv[size_t(i)] = 1.0f / std::pow(float(c.rope_theta), float(2 * i) / float(c.head_dim));
  const RopeScaling& rs = c.rope_scaling;
  if (rs.type == "linear") {
    for (auto& f : inv) f = float(f / rs.factor);
  } else if (rs.type == "llama3") {
    const double old_ctx = double(rs.original_max_position_embeddings);
    const double low_wavelen = old_ctx / rs.low_freq_factor;
    const double high_wavelen = old_ctx / rs.high_freq_factor;
    for (auto& f : inv) {
      const double wavelen = 2 * std::numbers::pi / f;
      if (wavelen > low_wavelen) {
        f = float(f / rs.factor);
      } else if (wavelen >= high_wavelen) {
        const double smooth = (old_ctx / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
        f = float((1 - smooth) * f / rs.factor + smooth * f);
      }
    }
  }
  return inv;
}

}  // namespace

KvCache::KvCache(const ModelConfig& cfg, int64_t capacity)
    : capacity_(capacity), layer_stride_(capacity * cfg.n_kv_heads * cfg.head_dim) {
  k_.assign(size_t(layer_stride_ * cfg.n_layers), 0.0f);
  v_.assign(size_t(layer_stride_ * cfg.n_layers), 0.0f);
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    k_ptrs_.push_back(k_.data() + l * layer_stride_);
    v_ptrs_.push_back(v_.data() + l * layer_stride_);
  }
}

KvView KvCache::view() const {
  KvView v;
  v.k_pools = k_ptrs_.data();
  v.v_pools = v_ptrs_.data();
  v.block_table = &block0_;
  v.block_size = capacity_;
  v.n_past = size_;
  return v;
}

void Model::forward(const int32_t* tokens, int64_t n, KvCache& kv, float* logits, bool all_logits) const {
  if (kv.size() + n > kv.capacity())
    fail("forward: ", kv.size() + n, " tokens exceed the KV cache capacity of ", kv.capacity());
  forward(tokens, n, kv.view(), logits, all_logits);
  kv.set_size(kv.size() + n);
}

Model::Model() = default;
Model::~Model() = default;

size_t Model::weight_bytes() const { return files_.total_bytes(); }

std::unique_ptr<Model> Model::load(const std::string& dir, const LoadOptions& opt) {
  std::unique_ptr<Model> m(new Model());
  m->dir_ = dir;
  if (const std::string g = gguf_model_file(dir); !g.empty()) {  // GGUF: src/model/gguf_model.cpp
    m->cfg_ = ModelConfig::from_gguf(g);
    m->files_ = WeightFiles::open_gguf(g);
  } else {
    m->cfg_ = ModelConfig::from_dir(dir);
    m->files_ = WeightFiles::open_dir(dir);
  }
  const ModelConfig& c = m->cfg_;
  const WeightFiles& f = m->files_;
  const int64_t H = c.hidden_size, I = c.intermediate_size, hd = c.head_dim;
  const int64_t nq = c.n_heads * hd, nkv = c.n_kv_heads * hd;

  m->embed_ = matrix(f, dir, "model.embed_tokens.weight", c.vocab_size, H);
  std::vector<float> fn = vec(f, dir, "model.norm.weight", H);
  if (c.tie_word_embeddings) {
    m->lm_head_ = m->embed_;
  } else {
    if (!f.find("lm_head.weight"))
      fail(dir, ": weight \"lm_head.weight\" is missing and config.json has tie_word_embeddings = false");
    m->lm_head_ = matrix(f, dir, "lm_head.weight", c.vocab_size, H);
  }
  m->layers_.resize(size_t(c.n_layers));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    Layer& L = m->layers_[size_t(l)];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    L.attn_norm = vec(f, dir, p + "input_layernorm.weight", H);
    L.mlp_norm = vec(f, dir, p + "post_attention_layernorm.weight", H);
    L.wq = matrix(f, dir, p + "self_attn.q_proj.weight", nq, H);
    L.wk = matrix(f, dir, p + "self_attn.k_proj.weight", nkv, H);
    L.wv = matrix(f, dir, p + "self_attn.v_proj.weight", nkv, H);
    L.wo = matrix(f, dir, p + "self_attn.o_proj.weight", H, nq);
    if (c.attention_bias) {
      L.q_bias = vec(f, dir, p + "self_attn.q_proj.bias", nq);
      L.k_bias = vec(f, dir, p + "self_attn.k_proj.bias", nkv);
      L.v_bias = vec(f, dir, p + "self_attn.v_proj.bias", nkv);
      // qwen2 biases q/k/v only; llama/qwen3 attention_bias covers o_proj too.
      if (c.model_type != "qwen2") L.o_bias = vec(f, dir, p + "self_attn.o_proj.bias", H);
    }
    if (c.qk_norm) {
      L.q_norm = vec(f, dir, p + "self_attn.q_norm.weight", hd);
      L.k_norm = vec(f, dir, p + "self_attn.k_norm.weight", hd);
    }
    L.w_gate = matrix(f, dir, p + "mlp.gate_proj.weight", I, H);
    L.w_up = matrix(f, dir, p + "mlp.up_proj.weight", I, H);
    L.w_down = matrix(f, dir, p + "mlp.down_proj.weight", H, I);
    L.window = c.layer_window[size_t(l)];
    if (opt.progress) opt.progress("layers", size_t(l + 1), size_t(c.n_layers));
  }
  m->final_norm_ = Weight{nullptr, WType::F32, 1, H};
  m->final_norm_store_ = std::move(fn);
  m->final_norm_.data = m->final_norm_store_.data();
  m->inv_freq_ = rope_inv_freq(c);
  if (opt.prefault) {
    f.prefault([&](size_t done, size_t total) {
      if (opt.progress) opt.progress("weights", done, total);
    });
  }
  return m;
}

void Model::forward(const int32_t* tokens, int64_t n, const KvView& kv, float* logits, bool all_logits) const {
  const ModelConfig& c = cfg_;
  const int64_t H = c.hidden_size, I = c.intermediate_size, hd = c.head_dim, half = hd / 2;
  const int64_t nq = c.n_heads * hd, nkv = c.n_kv_heads * hd;
  const int64_t pos0 = kv.n_past;
  if (n <= 0) fail("forward: no tokens");
  for (int64_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= c.vocab_size)
      fail("token id ", tokens[i], " is outside the vocabulary [0, ", c.vocab_size, ")");

  // Activations for this call: x [n, H], h [n, H], q [n, nq], k/v [n, nkv], attn [n, nq],
  // gate/up [n, I].
  std::vector<float> x(size_t(n * H)), h(size_t(n * H)), q(size_t(n * nq)), k(size_t(n * nkv)),
      v(size_t(n * nkv)), att(size_t(n * nq)), gate(size_t(n * I)), up(size_t(n * I));
  std::vector<float> cos(size_t(n * half)), sin(size_t(n * half));
  for (int64_t t = 0; t < n; ++t) {
    kernels::to_f32(static_cast<const uint8_t*>(embed_.data) + size_t(tokens[t]) * H * kernels::wtype_size(embed_.type),
                    embed_.type, &x[size_t(t * H)], H);
    for (int64_t i = 0; i < half; ++i) {
      const float ang = float(pos0 + t) * inv_freq_[size_t(i)];
      cos[size_t(t * half + i)] = float(std::cos(double(ang)));
      sin[size_t(t * half + i)] = float(std::sin(double(ang)));
    }
  }
  const float scale = 1.0f / std::sqrt(float(hd));
  const float eps = float(c.rms_norm_eps);
  const int32_t* table = kv.block_table;
  std::vector<float> part, lse, lse_part;  // range-by-range attention (kv.page_in)
  if (kv.page_in) part.resize(size_t(n * nq)), lse.resize(size_t(n * c.n_heads)), lse_part.resize(lse.size());
  auto bias = [](const std::vector<float>& b) { return b.empty() ? nullptr : b.data(); };

  for (int64_t l = 0; l < c.n_layers; ++l) {
    const Layer& L = layers_[size_t(l)];
    kernels::rms_norm(x.data(), L.attn_norm.data(), h.data(), n, H, eps);
    kernels::matmul(h.data(), L.wq.data, L.wq.type, bias(L.q_bias), q.data(), n, nq, H);
    kernels::matmul(h.data(), L.wk.data, L.wk.type, bias(L.k_bias), k.data(), n, nkv, H);
    kernels::matmul(h.data(), L.wv.data, L.wv.type, bias(L.v_bias), v.data(), n, nkv, H);
    if (c.qk_norm) {
      kernels::rms_norm(q.data(), L.q_norm.data(), q.data(), n * c.n_heads, hd, eps);
      kernels::rms_norm(k.data(), L.k_norm.data(), k.data(), n * c.n_kv_heads, hd, eps);
    }
    kernels::rope_rotate_half(q.data(), cos.data(), sin.data(), n, c.n_heads, hd);
    kernels::rope_rotate_half(k.data(), cos.data(), sin.data(), n, c.n_kv_heads, hd);
    const int64_t bs = kv.block_size;
    if (kv.page_in) table = kv.page_in(pos0 / bs, (pos0 + n - 1) / bs - pos0 / bs + 1);
    for (int64_t t = 0; t < n; ++t) {  // K/V of position pos0 + t into its slot
      const int64_t p = pos0 + t;
      const int64_t slot = int64_t(table[p / bs]) * bs + p % bs;
      std::memcpy(kv.k_pools[l] + slot * nkv, &k[size_t(t * nkv)], size_t(nkv) * sizeof(float));
      std::memcpy(kv.v_pools[l] + slot * nkv, &v[size_t(t * nkv)], size_t(nkv) * sizeof(float));
    }
    if (!kv.page_in) {
      kernels::paged_attention(q.data(), kv.k_pools[l], kv.v_pools[l], table, att.data(), n, pos0,
                               pos0 + n, bs, c.n_heads, c.n_kv_heads, hd, L.window, scale);
    } else {
      // K/V in ranges of blocks, each paged in before use; the scan direction alternates per
      // layer so that the blocks an LRU hot pool still holds are the ones needed first.
      const int64_t n_blocks = (pos0 + n + bs - 1) / bs, rb = std::max<int64_t>(1, kv.range_blocks);
      const int64_t n_ranges = (n_blocks + rb - 1) / rb;
      std::fill(lse.begin(), lse.end(), -std::numeric_limits<float>::infinity());
      for (int64_t i = 0; i < n_ranges; ++i) {
        const int64_t b0 = (l % 2 == 0 ? i : n_ranges - 1 - i) * rb, nb = std::min(rb, n_blocks - b0);
        const int64_t k0 = b0 * bs, k1 = std::min(pos0 + n, (b0 + nb) * bs);
        if (L.window > 0 && k1 <= pos0 - L.window + 1) continue;  // outside every query's window
        table = kv.page_in(b0, nb);
        kernels::paged_attention_lse(q.data(), kv.k_pools[l], kv.v_pools[l], table + b0, part.data(),
                                     lse_part.data(), n, pos0 - k0, k1 - k0, bs, c.n_heads, c.n_kv_heads,
                                     hd, L.window, scale);
        kernels::attention_merge(att.data(), lse.data(), part.data(), lse_part.data(), n * c.n_heads, hd);
      }
    }
    kernels::matmul(att.data(), L.wo.data, L.wo.type, bias(L.o_bias), h.data(), n, H, nq);
    for (size_t i = 0; i < x.size(); ++i) x[i] += h[i];

    kernels::rms_norm(x.data(), L.mlp_norm.data(), h.data(), n, H, eps);
    kernels::matmul(h.data(), L.w_gate.data, L.w_gate.type, nullptr, gate.data(), n, I, H);
    kernels::matmul(h.data(), L.w_up.data, L.w_up.type, nullptr, up.data(), n, I, H);
    kernels::silu_mul(gate.data(), up.data(), gate.data(), n * I);
    kernels::matmul(gate.data(), L.w_down.data, L.w_down.type, nullptr, h.data(), n, H, I);
    for (size_t i = 0; i < x.size(); ++i) x[i] += h[i];
  }
  const int64_t first = all_logits ? 0 : n - 1;
  const int64_t rows = n - first;
  kernels::rms_norm(&x[size_t(first * H)], final_norm_store_.data(), h.data(), rows, H, eps);
  kernels::matmul(h.data(), lm_head_.data, lm_head_.type, nullptr, logits, rows, c.vocab_size, H);
}

}  // namespace kvboost
