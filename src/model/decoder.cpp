// The Llama-family decoder shared by llama, mistral, qwen2, qwen3 and gemma3: weight binding
// with shape/dtype checks, RoPE tables, and the forward pass. Architecture differences are
// configuration (QKV bias, q/k norm, sliding window, rope scaling; Gemma 3's embedding scale,
// sandwich norms, GELU-tanh gate and local RoPE base), not separate code paths.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <array>
#include <numbers>
#include <optional>

#include "kvboost/kernels.h"
#include "kvboost/model.h"
#include "layer_stream.h"
#include "weight_check.h"

namespace kvboost {

using kernels::WType;

struct Model::Layer {
  std::vector<float> attn_norm, mlp_norm, q_norm, k_norm, q_bias, k_bias, v_bias, o_bias;
  std::vector<float> post_attn_norm, post_mlp_norm;  // sandwich norms (gemma3), else empty
  Weight wq, wk, wv, wo, w_gate, w_up, w_down;
  int64_t window = 0;
};

namespace {

// TensorInfo dtype strings are kernels::wtype_name's: F32, F16, BF16, and the quantized blocks
// Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K (GGUF) and Q4_Z / Q4_Z128 (AWQ), which the matmul reads as they are.
WType wtype_of(const TensorInfo& t) {
  for (WType w : {WType::F32, WType::F16, WType::BF16, WType::Q8_0, WType::Q4_0, WType::Q5_0, WType::Q4_K,
                  WType::Q5_K, WType::Q6_K, WType::Q4_Z, WType::Q4_Z128})
    if (t.dtype == kernels::wtype_name(w)) return w;
  fail(t.file, ": tensor \"", t.name, "\" has dtype ", t.dtype,
       " (supported: F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K, Q4_Z, Q4_Z128)");
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

// full = false (layer matrices under layer streaming, which must not read the whole file at
// load): the three-row sample only.
Weight matrix(const WeightFiles& f, const std::string& dir, const std::string& name, int64_t rows, int64_t cols,
              bool full = true) {
  const TensorInfo& t = require(f, dir, name, {rows, cols});
  const WType wt = wtype_of(t);
  const int64_t be = kernels::wtype_block_elems(wt);
  if (cols % be != 0)
    fail(t.file, ": tensor \"", name, "\": rows of ", cols, " elements are not whole ", t.dtype, " blocks of ", be);
  const size_t want = size_t(rows) * size_t(kernels::wtype_row_bytes(wt, cols));
  if (t.nbytes != want)
    fail(t.file, ": tensor \"", name, "\" (", t.dtype, " [", rows, ", ", cols, "]) has ", t.nbytes, " bytes, expected ", want);
  // NaN/Inf weights give empty output with no warning: every matrix is scanned in full (plain
  // types element by element, quantized blocks by their scales; src/model/weight_check.h). It
  // reads each mapped page once, which the prefault below would do anyway. The environment
  // variable KVBOOST_WEIGHT_CHECK=sample keeps the earlier check (rows 0, rows/2 and rows-1 of
  // plain matrices; A/B runs of one binary, bench/weight_check_bench).
  static const bool sample_env = [] {
    const char* e = std::getenv("KVBOOST_WEIGHT_CHECK");
    return e && std::string(e) == "sample";
  }();
  const bool sample = sample_env || !full;
  if (t.data && sample && !kernels::wtype_is_quantized(wt)) {
    const size_t rb = size_t(kernels::wtype_row_bytes(wt, cols));
    for (int64_t r : {int64_t(0), rows / 2, rows - 1}) {
      const int64_t at = weight_check::find_nonfinite(static_cast<const uint8_t*>(t.data) + size_t(r) * rb, wt, cols);
      if (at >= 0) fail(t.file, ": tensor \"", name, "\" has a non-finite value at [", r, ", ", at, "]: corrupt weights");
    }
  } else if (t.data && !sample) {
    const int64_t at = weight_check::find_nonfinite(t.data, wt, rows * cols);
    if (at >= 0) {
      const int64_t r = at / cols, i = at % cols;
      if (kernels::wtype_is_quantized(wt))
        fail(t.file, ": tensor \"", name, "\" (", t.dtype, ") has a non-finite block scale in the block at [", r, ", ", i,
             "]: corrupt weights");
      float v = 0;
      kernels::to_f32(static_cast<const uint8_t*>(t.data) + size_t(at) * size_t(kernels::wtype_size(wt)), wt, &v, 1);
      fail(t.file, ": tensor \"", name, "\" has a non-finite value (", v, ") at [", r, ", ", i, "]: corrupt weights");
    }
  }
  return Weight{t.data, wt, rows, cols};
}

// By shape and type: streamed layers (data bound per pass) count the same as resident ones.
size_t matrix_bytes(const Weight& w) { return size_t(w.rows) * size_t(kernels::wtype_row_bytes(w.type, w.cols)); }

// The matrices a layer streams, in the order the streamer is given them.
constexpr int kLayerMats = 7;
const char* const kMatNames[kLayerMats] = {"self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                           "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                                           "mlp.gate_proj.weight",    "mlp.up_proj.weight",
                                           "mlp.down_proj.weight"};
std::array<Weight*, kLayerMats> layer_mats(Model::Layer& L) {
  return {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down};
}

// y [M, w.rows] = x [M, w.cols] · wᵀ (+ bias [w.rows]), in whichever layout the weight is held.
inline void linear(const float* x, const Weight& w, const float* bias, float* y, int64_t M) {
  if (w.packed) kernels::matmul_packed(x, *w.packed, bias, y, M);
  else kernels::matmul(x, w.data, w.type, bias, y, M, w.rows, w.cols);
}

std::vector<float> vec(const WeightFiles& f, const std::string& dir, const std::string& name, int64_t n) {
  const TensorInfo& t = require(f, dir, name, {n});
  std::vector<float> out(static_cast<size_t>(n));
  kernels::to_f32(t.data, wtype_of(t), out.data(), n);
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(out[size_t(i)]))
      fail(t.file, ": tensor \"", name, "\" has a non-finite value (", out[size_t(i)], ") at [", i, "]: corrupt weights");
  return out;
}

// An RMSNorm weight as the kernels use it: config's offset added (Gemma's 1 + w).
std::vector<float> norm_vec(const WeightFiles& f, const std::string& dir, const std::string& name, int64_t n,
                            const ModelConfig& c) {
  std::vector<float> v = vec(f, dir, name, n);
  if (c.norm_weight_offset != 0.0f)
    for (float& x : v) x += c.norm_weight_offset;
  return v;
}

// Hugging Face's inv_freq, in float32 as torch computes it, with llama3 / linear scaling.
std::vector<float> compute_inv_freq(const ModelConfig& c, double theta) {
  const int64_t half = c.head_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv[size_t(i)] = 1.0f / std::pow(float(theta), float(2 * i) / float(c.head_dim));
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

const std::vector<float>& Model::rope_inv_freq(int64_t layer) const {
  const bool local = !inv_freq_local_.empty() && layers_.at(size_t(layer)).window > 0;
  return local ? inv_freq_local_ : inv_freq_;
}

Model::Model() = default;
Model::~Model() = default;

size_t Model::weight_bytes() const {
  size_t n = matrix_bytes(embed_) + (lm_head_.data == embed_.data ? 0 : matrix_bytes(lm_head_));
  n += final_norm_store_.size() * sizeof(float);
  for (const Layer& L : layers_) {
    for (const Weight* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) n += matrix_bytes(*w);
    for (const auto* v : {&L.attn_norm, &L.mlp_norm, &L.q_norm, &L.k_norm, &L.q_bias, &L.k_bias, &L.v_bias, &L.o_bias,
                          &L.post_attn_norm, &L.post_mlp_norm})
      n += v->size() * sizeof(float);
  }
  return n;
}

size_t Model::decode_weight_bytes() const {
  size_t n = matrix_bytes(lm_head_);
  for (const Layer& L : layers_)
    for (const Weight* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) n += matrix_bytes(*w);
  return n;
}

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
  std::vector<float> fn = norm_vec(f, dir, "model.norm.weight", H, c);
  if (c.tie_word_embeddings) {
    m->lm_head_ = m->embed_;
  } else {
    if (!f.find("lm_head.weight"))
      fail(dir, ": weight \"lm_head.weight\" is missing and config.json has tie_word_embeddings = false");
    m->lm_head_ = matrix(f, dir, "lm_head.weight", c.vocab_size, H);
  }
  m->layers_.resize(size_t(c.n_layers));
  const bool full = opt.weight_budget == 0;  // layer streaming: the layers are not read at load
  for (int64_t l = 0; l < c.n_layers; ++l) {
    Layer& L = m->layers_[size_t(l)];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    L.attn_norm = norm_vec(f, dir, p + "input_layernorm.weight", H, c);
    if (c.sandwich_norms) {  // gemma3: post_attention_layernorm is the attention output's norm
      L.post_attn_norm = norm_vec(f, dir, p + "post_attention_layernorm.weight", H, c);
      L.mlp_norm = norm_vec(f, dir, p + "pre_feedforward_layernorm.weight", H, c);
      L.post_mlp_norm = norm_vec(f, dir, p + "post_feedforward_layernorm.weight", H, c);
    } else {
      L.mlp_norm = norm_vec(f, dir, p + "post_attention_layernorm.weight", H, c);
    }
    L.wq = matrix(f, dir, p + "self_attn.q_proj.weight", nq, H, full);
    L.wk = matrix(f, dir, p + "self_attn.k_proj.weight", nkv, H, full);
    L.wv = matrix(f, dir, p + "self_attn.v_proj.weight", nkv, H, full);
    L.wo = matrix(f, dir, p + "self_attn.o_proj.weight", H, nq, full);
    if (c.attention_bias) {
      L.q_bias = vec(f, dir, p + "self_attn.q_proj.bias", nq);
      L.k_bias = vec(f, dir, p + "self_attn.k_proj.bias", nkv);
      L.v_bias = vec(f, dir, p + "self_attn.v_proj.bias", nkv);
      // qwen2 biases q/k/v only; llama/qwen3 attention_bias covers o_proj too.
      if (c.model_type != "qwen2") L.o_bias = vec(f, dir, p + "self_attn.o_proj.bias", H);
    }
    if (c.qk_norm) {
      L.q_norm = norm_vec(f, dir, p + "self_attn.q_norm.weight", hd, c);
      L.k_norm = norm_vec(f, dir, p + "self_attn.k_norm.weight", hd, c);
    }
    L.w_gate = matrix(f, dir, p + "mlp.gate_proj.weight", I, H, full);
    L.w_up = matrix(f, dir, p + "mlp.up_proj.weight", I, H, full);
    L.w_down = matrix(f, dir, p + "mlp.down_proj.weight", H, I, full);
    L.window = c.layer_window[size_t(l)];
    if (opt.progress) opt.progress("layers", size_t(l + 1), size_t(c.n_layers));
  }
  bool awq = false;  // Q4_Z / Q4_Z128 exist only as repacked AWQ layers
  for (const Layer& L : m->layers_)
    for (const Weight* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
      awq = awq || w->type == WType::Q4_Z || w->type == WType::Q4_Z128;
  const void* float_head = m->lm_head_.data;
  m->quantize_head(opt, awq);
  m->final_norm_ = Weight{nullptr, WType::F32, 1, H};
  m->final_norm_store_ = std::move(fn);
  m->final_norm_.data = m->final_norm_store_.data();
  m->inv_freq_ = compute_inv_freq(c, c.rope_theta);
  if (c.rope_local_theta > 0 && c.rope_local_theta != c.rope_theta)
    m->inv_freq_local_ = compute_inv_freq(c, c.rope_local_theta);
  if (opt.weight_budget > 0) m->setup_streaming(opt);
  // Packed copies replace the stored matrices (their pages are dropped as each is packed).
  const size_t packed_bytes = m->stream_ ? 0 : m->pack_weights(opt);
  if (opt.prefault && !m->stream_ && packed_bytes == 0) {
    f.prefault([&](size_t done, size_t total) {
      if (opt.progress) opt.progress("weights", done, total);
    });
  } else if (opt.prefault) {
    // Streaming: only what stays resident is paged in (the layer matrices are never touched
    // through the mapping, so they cost no memory there). Packed: the packed copies are
    // resident already; what is still read in the stored layout (an embedding table beside a
    // packed or quantized head, quantized matrices) is paged in.
    std::vector<const Weight*> res = {&m->embed_};
    if (m->lm_head_.data != m->embed_.data) res.push_back(&m->lm_head_);
    if (!m->stream_)
      for (Layer& L : m->layers_)
        for (const Weight* w : layer_mats(L)) res.push_back(w);
    size_t total = 0;
    for (const Weight* r : res)
      if (r->data && !r->packed) total += matrix_bytes(*r);
    size_t done = 0;
    volatile uint8_t sink = 0;
    for (const Weight* r : res) {
      if (!r || !r->data || r->packed) continue;
      const uint8_t* p = static_cast<const uint8_t*>(r->data);
      const size_t nb = matrix_bytes(*r);
      for (size_t i = 0; i < nb; i += 4096) sink = sink + p[i];
      done += nb;
      if (opt.progress) opt.progress("weights", std::min(done, total), total);
    }
    if (opt.progress) opt.progress("weights", total, total);
    (void)sink;
  }
  // An untied float head that was quantized is never read again: give its memory back (pages
  // of the mapping drop out of this process, an owned buffer is freed).
  if (!m->lm_head_store_.empty() && !c.tie_word_embeddings && float_head) {
    const size_t nb = size_t(c.vocab_size) * size_t(kernels::wtype_row_bytes(wtype_of(*f.find("lm_head.weight")), H));
    if (m->files_.locate(float_head, nb, nullptr, nullptr)) {
      const uintptr_t b = (uintptr_t(float_head) + 4095) & ~uintptr_t(4095), e = (uintptr_t(float_head) + nb) & ~uintptr_t(4095);
      if (e > b) ::madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED);
    } else {
      m->files_.release_owned(float_head);
    }
  }
  return m;
}

HeadQuant parse_head_quant(const std::string& s, const std::string& what) {
  std::string v = s;
  for (char& ch : v) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  for (HeadQuant q : {HeadQuant::Auto, HeadQuant::None, HeadQuant::Q8_0, HeadQuant::Q6_K, HeadQuant::Q4_0})
    if (v == head_quant_name(q)) return q;
  fail(what, ": \"", s, "\" is not a head quantization (auto, none, q8_0, q6_k, q4_0)");
}

const char* head_quant_name(HeadQuant q) {
  switch (q) {
    case HeadQuant::Auto: return "auto";
    case HeadQuant::None: return "none";
    case HeadQuant::Q8_0: return "q8_0";
    case HeadQuant::Q6_K: return "q6_k";
    case HeadQuant::Q4_0: return "q4_0";
  }
  return "?";
}

// LoadOptions::head_quant: the [vocab, hidden] head converted row by row (f32 -> blocks) into
// an owned buffer; embed_ keeps pointing at the stored table.
void Model::quantize_head(const LoadOptions& opt, bool awq) {
  HeadQuant q = opt.head_quant;
  if (q == HeadQuant::Auto) q = awq ? HeadQuant::Q8_0 : HeadQuant::None;
  if (q == HeadQuant::None || kernels::wtype_is_quantized(lm_head_.type)) return;  // GGUF blocks stay
  const int64_t V = lm_head_.rows, H = lm_head_.cols;
  WType wt = q == HeadQuant::Q8_0 ? WType::Q8_0 : q == HeadQuant::Q6_K ? WType::Q6_K : WType::Q4_0;
  if (wt == WType::Q6_K && H % kernels::wtype_block_elems(wt) != 0) {
    std::fprintf(stderr, "kvboost: %s: head_quant q6_k needs rows of whole 256-element blocks, hidden_size is %lld: "
                 "using q8_0 for the output projection\n", dir_.c_str(), (long long)H);
    wt = WType::Q8_0;
  }
  if (H % kernels::wtype_block_elems(wt) != 0) {
    if (opt.head_quant == HeadQuant::Auto) return;
    fail(dir_, ": head_quant ", head_quant_name(q), ": hidden_size ", H, " is not a multiple of the ",
         kernels::wtype_name(wt), " block of ", kernels::wtype_block_elems(wt));
  }
  const size_t src_rb = size_t(kernels::wtype_row_bytes(lm_head_.type, H));
  const size_t rb = size_t(kernels::wtype_row_bytes(wt, H));
  std::vector<uint8_t> store(size_t(V) * rb);
  const uint8_t* src = static_cast<const uint8_t*>(lm_head_.data);
  const WType st = lm_head_.type;
  parallel_for(V, 1, 64, [&](int64_t b, int64_t e) {
    std::vector<float> row(static_cast<size_t>(H));
    for (int64_t r = b; r < e; ++r) {
      kernels::to_f32(src + size_t(r) * src_rb, st, row.data(), H);
      kernels::quantize_row(row.data(), wt, store.data() + size_t(r) * rb, H);
    }
  });
  lm_head_store_ = std::move(store);
  lm_head_ = Weight{lm_head_store_.data(), wt, V, H};
}

// LoadOptions::pack_weights: each plain matrix into PackedWeight panels, the stored copy
// dropped right after (mapped pages MADV_DONTNEED, owned buffers freed). The head goes first:
// peak memory is then about the packed total plus one layer matrix (the largest, the head,
// is packed while nothing else is resident yet), not plus the head. A tied table is packed
// once and serves both the head and the embedding lookup (kernels::packed_row).
size_t Model::pack_weights(const LoadOptions& opt) {
  if (!opt.pack_weights) return 0;
  if (const char* e = std::getenv("KVBOOST_PACK_WEIGHTS"); e && std::string(e) == "0") return 0;
  const bool tied = lm_head_.data == embed_.data;
  std::vector<Weight*> todo = {&lm_head_};
  for (Layer& L : layers_)
    for (Weight* w : layer_mats(L)) todo.push_back(w);
  size_t total = 0, done = 0;
  for (const Weight* w : todo)
    if (w->data && !kernels::wtype_is_quantized(w->type)) total += matrix_bytes(*w);
  for (Weight* w : todo) {
    if (!w->data || kernels::wtype_is_quantized(w->type)) continue;
    const void* raw = w->data;
    const size_t nb = matrix_bytes(*w);
    auto pw = std::make_unique<kernels::PackedWeight>(kernels::pack_weight(raw, w->type, w->rows, w->cols));
    w->data = pw->data();
    w->packed = pw.get();
    packed_.push_back(std::move(pw));
    if (w == &lm_head_ && tied) embed_ = lm_head_;
    if (files_.locate(raw, nb, nullptr, nullptr)) {
      // Whole pages inside the tensor only (the edge pages may hold a neighbour's bytes).
      const uintptr_t b = (uintptr_t(raw) + 4095) & ~uintptr_t(4095), e = (uintptr_t(raw) + nb) & ~uintptr_t(4095);
      if (e > b) ::madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED);
    } else {
      files_.release_owned(raw);
    }
    done += nb;
    if (opt.progress) opt.progress("packing", done, total);
  }
  return done;
}


// Plans what each layer streams and from where. Matrices inside a mapped weight file are read
// from that file; matrices that live in owned buffers (re-laid-out at load: GGUF Q/K rows
// un-permuted, dequantized or repacked tensors) have no file offset, so they are written once
// into a scratch file in $TMPDIR (unlinked as soon as it is open: deleted at exit, even after
// a crash) and their buffers are freed, so that they stream like the rest.
void Model::setup_streaming(const LoadOptions& opt) {
  const ModelConfig& c = cfg_;
  std::vector<std::string> paths;
  std::vector<std::vector<stream::TensorRef>> refs(size_t(c.n_layers));
  struct Copy {
    const void* src;
    uint64_t n, off;
  };
  std::vector<Copy> copies;
  int scratch = -1;
  uint64_t scratch_end = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    for (int i = 0; i < kLayerMats; ++i) {
      const std::string name = "model.layers." + std::to_string(l) + "." + kMatNames[i];
      const TensorInfo* t = files_.find(name);
      if (!t || !t->data) fail(dir_, ": layer streaming: tensor \"", name, "\" has no data");
      std::string path;
      uint64_t off = 0;
      if (files_.locate(t->data, t->nbytes, &path, &off)) {
        auto it = std::find(paths.begin(), paths.end(), path);
        const int idx = int(it - paths.begin());
        if (it == paths.end()) paths.push_back(path);
        refs[size_t(l)].push_back({idx, off, t->nbytes});
      } else {
        if (scratch < 0) scratch = int(paths.size()), paths.push_back("");
        off = (scratch_end + stream::LayerStreamer::kAlign - 1) / stream::LayerStreamer::kAlign *
              stream::LayerStreamer::kAlign;
        copies.push_back({t->data, t->nbytes, off});
        scratch_end = off + t->nbytes;
        refs[size_t(l)].push_back({scratch, off, t->nbytes});
      }
    }
  }
  const uint64_t slot = stream::LayerStreamer::slot_bytes_for(refs);
  if (opt.weight_budget >= slot * uint64_t(c.n_layers)) return;  // every layer fits: resident
  stream::LayerStreamer::check_budget(refs, opt.weight_budget);

  std::string scratch_path;
  int wfd = -1;
  if (!copies.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    scratch_path = std::string(tmp && *tmp ? tmp : "/tmp") + "/kvboost-stream-XXXXXX";
    wfd = ::mkstemp(scratch_path.data());
    if (wfd < 0) fail(scratch_path, ": cannot create the layer streaming scratch file: ", std::strerror(errno));
    for (const Copy& cp : copies) {
      for (uint64_t done = 0; done < cp.n;) {
        const ssize_t r = ::pwrite(wfd, static_cast<const uint8_t*>(cp.src) + done, size_t(cp.n - done), off_t(cp.off + done));
        if (r <= 0) {
          const int err = errno;
          ::close(wfd), ::unlink(scratch_path.c_str());
          fail(scratch_path, ": writing the layer streaming scratch file failed: ", std::strerror(err));
        }
        done += uint64_t(r);
      }
    }
    ::fdatasync(wfd);
    ::posix_fadvise(wfd, 0, 0, POSIX_FADV_DONTNEED);  // its pages are read back by the streamer
    paths[size_t(scratch)] = scratch_path;
  }
  try {
    // KVBOOST_STREAM_IO=buffered: pread through the page cache (dropping each extent after it
    // is read) instead of O_DIRECT, for file systems or disks where that reads faster.
    const char* io = std::getenv("KVBOOST_STREAM_IO");
    const bool direct = !(io && std::string(io) == "buffered");
    stream_ = std::make_unique<stream::LayerStreamer>(paths, refs, opt.weight_budget, direct);
  } catch (...) {
    if (wfd >= 0) ::close(wfd), ::unlink(scratch_path.c_str());
    throw;
  }
  if (wfd >= 0) ::close(wfd), ::unlink(scratch_path.c_str());
  for (const Copy& cp : copies) files_.release_owned(cp.src);
  // Streamed matrices are bound per pass to their slot. Those whose owned buffer was just freed
  // would dangle: null; the others keep pointing into the mapping, which is never touched.
  for (Layer& L : layers_)
    for (Weight* w : layer_mats(L))
      if (!files_.locate(w->data, 1, nullptr, nullptr)) w->data = nullptr;
  resident_bytes_ = matrix_bytes(embed_) + (lm_head_.data == embed_.data ? 0 : matrix_bytes(lm_head_));
}

Model::StreamInfo Model::stream_info() const {
  StreamInfo si;
  if (!stream_) return si;
  const stream::StreamStats st = stream_->stats();
  si.streaming = true;
  si.direct = st.direct;
  si.n_slots = stream_->n_slots();
  si.slot_bytes = stream_->slot_bytes();
  si.pass_bytes = stream_->pass_bytes();
  si.resident_bytes = resident_bytes_;
  si.bytes_read = st.bytes_read, si.layers_read = st.layers_read, si.passes = st.passes;
  si.read_ms = st.read_ms, si.wait_ms = st.wait_ms;
  return si;
}

namespace {

// A contiguous run of positions of one sequence among the rows of a pass: attention is one
// kernel call per run (queries pos0 .. pos0 + n - 1 over keys [0, pos0 + n)).
struct Run {
  int64_t seq, row0, n, pos0;
};

// The token rows one pass computes: which sequence and position each row is.
struct Rows {
  std::vector<int64_t> seq, pos;
  std::vector<Run> runs;
  int64_t size() const { return int64_t(pos.size()); }
  void add(int64_t s, int64_t p) {
    const int64_t r = size();
    seq.push_back(s);
    pos.push_back(p);
    if (!runs.empty() && runs.back().seq == s && runs.back().pos0 + runs.back().n == p)
      ++runs.back().n;
    else
      runs.push_back(Run{s, r, 1, p});
  }
};

// Activations of one pass: x [n, H] is the residual stream; the rest is scratch.
// pending: h holds the last layer's MLP output, not yet added to x. The add is fused into the
// next RMSNorm that reads x (the next layer's input norm, or the final norm of the logit rows:
// kernels::add_rms_norm), which saves a pass over x per layer; residual_row() applies it to the
// rows whose x is read directly.
struct Work {
  std::vector<float> x, h, q, k, v, att, gate, up, cos, sin, part, lse, lse_part;
  bool pending = false;
  std::vector<float> cos_local, sin_local;  // sliding layers with their own RoPE base (gemma3)
  // The current layer's matrices (in kMatNames order) when streamed: they live in a slot of
  // the streamer for this layer only. nullptr: the resident ones of the Layer.
  const Weight* mats = nullptr;
  void resize(const ModelConfig& c, int64_t n, bool paged_in) {
    const int64_t H = c.hidden_size, nq = c.n_heads * c.head_dim, nkv = c.n_kv_heads * c.head_dim;
    x.resize(size_t(n * H)), h.resize(size_t(n * H)), q.resize(size_t(n * nq));
    k.resize(size_t(n * nkv)), v.resize(size_t(n * nkv)), att.resize(size_t(n * nq));
    gate.resize(size_t(n * c.intermediate_size)), up.resize(size_t(n * c.intermediate_size));
    cos.resize(size_t(n * c.head_dim / 2)), sin.resize(size_t(n * c.head_dim / 2));
    if (paged_in) part.resize(size_t(n * nq)), lse.resize(size_t(n * c.n_heads)), lse_part.resize(lse.size());
  }
  // Row r of the residual stream into out [H], with a pending add applied.
  void residual_row(int64_t r, int64_t H, float* out) const {
    const float* xr = &x[size_t(r * H)];
    if (!pending) {
      std::memcpy(out, xr, size_t(H) * sizeof(float));
      return;
    }
    const float* hr = &h[size_t(r * H)];
    for (int64_t i = 0; i < H; ++i) out[i] = xr[i] + hr[i];
  }
};

void rope_table(const std::vector<float>& inv_freq, const Rows& rows, std::vector<float>& cos,
                std::vector<float>& sin) {
  const int64_t half = int64_t(inv_freq.size());
  cos.resize(size_t(rows.size() * half)), sin.resize(size_t(rows.size() * half));
  for (int64_t t = 0; t < rows.size(); ++t)
    for (int64_t i = 0; i < half; ++i) {
      const float ang = float(rows.pos[size_t(t)]) * inv_freq[size_t(i)];
      cos[size_t(t * half + i)] = float(std::cos(double(ang)));
      sin[size_t(t * half + i)] = float(std::sin(double(ang)));
    }
}

// inv_freq_local: empty unless sliding layers use another RoPE base.
void rope_tables(const std::vector<float>& inv_freq, const std::vector<float>& inv_freq_local, const Rows& rows,
                 Work& w) {
  rope_table(inv_freq, rows, w.cos, w.sin);
  if (!inv_freq_local.empty()) rope_table(inv_freq_local, rows, w.cos_local, w.sin_local);
}

void check_tokens(const ModelConfig& c, const int32_t* tokens, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= c.vocab_size)
      fail("token id ", tokens[i], " is outside the vocabulary [0, ", c.vocab_size, ")");
}

// The block table of a sequence with blocks [first, first + n) resident (cold tier) or as is.
const int32_t* table_for(const KvView& kv, int64_t first, int64_t n) {
  return kv.page_in ? kv.page_in(first, n) : kv.block_table;
}

// Reads the K/V (f32 rows of nkv floats) stored for position p.
inline float* slot_ptr(float* pool, const int32_t* table, int64_t bs, int64_t p, int64_t nkv) {
  return pool + (int64_t(table[p / bs]) * bs + p % bs) * nkv;
}

}  // namespace

namespace {
// A layer's matrices with data in the streamer's slot (shapes and types as bound at load).
const Weight* bind_streamed(const Model::Layer& L, const std::vector<const uint8_t*>& p, Weight* out) {
  const Weight* src[kLayerMats] = {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down};
  for (int i = 0; i < kLayerMats; ++i) {
    out[i] = *src[i];
    out[i].data = p[size_t(i)];
  }
  return out;
}
}  // namespace

// One decoder layer over `rows`. before_write(k, v), when set, sees the fresh post-RoPE K/V of
// every row before they overwrite the slots (CacheBlend's deviation check).
void Model::run_layer(int64_t l, const SeqBatch* seqs, const void* rows_p, void* work_p,
                      const std::function<void(const float*, const float*)>* before_write, bool kv_only) const {
  const Rows& rows = *static_cast<const Rows*>(rows_p);
  Work& w = *static_cast<Work*>(work_p);
  const ModelConfig& c = cfg_;
  const Layer& L = layers_[size_t(l)];
  const Weight* m = w.mats;  // streamed matrices, else the resident ones
  const Weight &wq = m ? m[0] : L.wq, &wk = m ? m[1] : L.wk, &wv = m ? m[2] : L.wv, &wo = m ? m[3] : L.wo;
  const Weight &w_gate = m ? m[4] : L.w_gate, &w_up = m ? m[5] : L.w_up, &w_down = m ? m[6] : L.w_down;
  const int64_t n = rows.size(), H = c.hidden_size, I = c.intermediate_size, hd = c.head_dim;
  const int64_t nq = c.n_heads * hd, nkv = c.n_kv_heads * hd;
  // Gemma 3 scales by 1/sqrt(query_pre_attn_scalar) (llama.cpp gemma3.cpp: f_attention_scale).
  const float scale = 1.0f / std::sqrt(float(c.query_pre_attn_scalar > 0 ? c.query_pre_attn_scalar : double(hd)));
  const float eps = float(c.rms_norm_eps);
  // Sliding layers of gemma3 rotate with the local base (llama.cpp get_rope_freq_base).
  const bool local = L.window > 0 && !w.cos_local.empty();
  const float* cos = local ? w.cos_local.data() : w.cos.data();
  const float* sin = local ? w.sin_local.data() : w.sin.data();
  auto bias = [](const std::vector<float>& b) { return b.empty() ? nullptr : b.data(); };

  // The previous layer's MLP output joins the residual stream here, fused with this norm.
  if (w.pending) kernels::add_rms_norm(w.x.data(), w.h.data(), L.attn_norm.data(), w.h.data(), n, H, eps);
  else kernels::rms_norm(w.x.data(), L.attn_norm.data(), w.h.data(), n, H, eps);
  w.pending = false;
  if (!kv_only) linear(w.h.data(), wq, bias(L.q_bias), w.q.data(), n);
  linear(w.h.data(), wk, bias(L.k_bias), w.k.data(), n);
  linear(w.h.data(), wv, bias(L.v_bias), w.v.data(), n);
  if (c.qk_norm) {
    if (!kv_only) kernels::rms_norm(w.q.data(), L.q_norm.data(), w.q.data(), n * c.n_heads, hd, eps);
    kernels::rms_norm(w.k.data(), L.k_norm.data(), w.k.data(), n * c.n_kv_heads, hd, eps);
  }
  if (!kv_only) kernels::rope_rotate_half(w.q.data(), cos, sin, n, c.n_heads, hd);
  kernels::rope_rotate_half(w.k.data(), cos, sin, n, c.n_kv_heads, hd);
  if (before_write) (*before_write)(w.k.data(), w.v.data());

  // Every row's K/V into its slot first, so that a run attends to rows of earlier runs.
  for (const Run& r : rows.runs) {
    const KvView& kv = seqs[r.seq].kv;
    const int64_t bs = kv.block_size;
    const int32_t* table = table_for(kv, r.pos0 / bs, (r.pos0 + r.n - 1) / bs - r.pos0 / bs + 1);
    for (int64_t t = 0; t < r.n; ++t) {
      const int64_t p = r.pos0 + t, row = r.row0 + t;
      std::memcpy(slot_ptr(kv.k_pools[l], table, bs, p, nkv), &w.k[size_t(row * nkv)], size_t(nkv) * sizeof(float));
      std::memcpy(slot_ptr(kv.v_pools[l], table, bs, p, nkv), &w.v[size_t(row * nkv)], size_t(nkv) * sizeof(float));
    }
  }
  if (kv_only) return;
  for (const Run& r : rows.runs) {
    const KvView& kv = seqs[r.seq].kv;
    const int64_t bs = kv.block_size, end = r.pos0 + r.n;
    float* att = &w.att[size_t(r.row0 * nq)];
    const float* q = &w.q[size_t(r.row0 * nq)];
    if (!kv.page_in) {
      kernels::paged_attention(q, kv.k_pools[l], kv.v_pools[l], kv.block_table, att, r.n, r.pos0, end, bs,
                               c.n_heads, c.n_kv_heads, hd, L.window, scale);
      continue;
    }
    // K/V in ranges of blocks, each paged in before use; the scan direction alternates per
    // layer so that the blocks an LRU hot pool still holds are the ones needed first.
    float* lse = &w.lse[size_t(r.row0 * c.n_heads)];
    float* part = &w.part[size_t(r.row0 * nq)];
    float* lse_part = &w.lse_part[size_t(r.row0 * c.n_heads)];
    const int64_t n_blocks = (end + bs - 1) / bs, rb = std::max<int64_t>(1, kv.range_blocks);
    const int64_t n_ranges = (n_blocks + rb - 1) / rb;
    std::fill(lse, lse + r.n * c.n_heads, -std::numeric_limits<float>::infinity());
    for (int64_t i = 0; i < n_ranges; ++i) {
      const int64_t b0 = (l % 2 == 0 ? i : n_ranges - 1 - i) * rb, nb = std::min(rb, n_blocks - b0);
      const int64_t k0 = b0 * bs, k1 = std::min(end, (b0 + nb) * bs);
      if (L.window > 0 && k1 <= r.pos0 - L.window + 1) continue;  // outside every query's window
      const int32_t* table = kv.page_in(b0, nb);
      kernels::paged_attention_lse(q, kv.k_pools[l], kv.v_pools[l], table + b0, part, lse_part, r.n, r.pos0 - k0,
                                   k1 - k0, bs, c.n_heads, c.n_kv_heads, hd, L.window, scale);
      kernels::attention_merge(att, lse, part, lse_part, r.n * c.n_heads, hd);
    }
  }
  linear(w.att.data(), wo, bias(L.o_bias), w.h.data(), n);
  // Gemma 3 (llama.cpp gemma3.cpp): attn_post_norm on the attention output before the
  // residual add, ffn_post_norm on the MLP output before its add.
  if (c.sandwich_norms) kernels::rms_norm(w.h.data(), L.post_attn_norm.data(), w.h.data(), n, H, eps);
  kernels::add_rms_norm(w.x.data(), w.h.data(), L.mlp_norm.data(), w.h.data(), n, H, eps);  // x += attn; h = norm(x)
  linear(w.h.data(), w_gate, nullptr, w.gate.data(), n);
  linear(w.h.data(), w_up, nullptr, w.up.data(), n);
  if (c.hidden_act == "gelu_pytorch_tanh")
    kernels::gelu_tanh_mul(w.gate.data(), w.up.data(), w.gate.data(), n * I);
  else
    kernels::silu_mul(w.gate.data(), w.up.data(), w.gate.data(), n * I);
  linear(w.gate.data(), w_down, nullptr, w.h.data(), n);
  if (c.sandwich_norms) kernels::rms_norm(w.h.data(), L.post_mlp_norm.data(), w.h.data(), n, H, eps);
  w.pending = true;  // x += h happens in the next norm (see Work)
}

void Model::embed(const int32_t* tokens, int64_t n, float* x) const {
  const int64_t H = cfg_.hidden_size;
  // One row at a time: a quantized table is dequantized only for the tokens looked up.
  const size_t row_bytes = size_t(kernels::wtype_row_bytes(embed_.type, H));
  for (int64_t t = 0; t < n; ++t) {
    if (embed_.packed)  // a tied table kept only packed (LoadOptions::pack_weights)
      kernels::packed_row(*embed_.packed, tokens[t], x + t * H);
    else
      kernels::to_f32(static_cast<const uint8_t*>(embed_.data) + size_t(tokens[t]) * row_bytes, embed_.type,
                      x + t * H, H);
  }
  if (cfg_.embed_scale != 1.0f)  // gemma3: * sqrt(hidden_size), in f32 as llama.cpp's ggml_scale
    for (int64_t i = 0; i < n * H; ++i) x[i] *= cfg_.embed_scale;
}

void Model::forward(const int32_t* tokens, int64_t n, const KvView& kv, float* logits, bool all_logits) const {
  if (n <= 0) fail("forward: no tokens");
  SeqBatch s;
  s.tokens = tokens;
  s.n = n;
  s.kv = kv;
  s.logits = logits;
  s.n_logits = all_logits ? n : 1;
  forward_batch(&s, 1);
}

void Model::forward_batch(const SeqBatch* seqs, int64_t n_seqs) const {
  const ModelConfig& c = cfg_;
  const int64_t H = c.hidden_size;
  Rows rows;
  bool paged_in = false;
  for (int64_t s = 0; s < n_seqs; ++s) {
    const SeqBatch& b = seqs[s];
    if (b.n <= 0) fail("forward: sequence ", s, " of the batch has no tokens");
    check_tokens(c, b.tokens, b.n);
    for (int64_t i = 0; i < b.n; ++i) {
      const int64_t p = b.positions ? b.positions[i] : b.kv.n_past + i;
      if (b.positions && i > 0 && p <= b.positions[i - 1])
        fail("forward: positions of sequence ", s, " are not increasing at index ", i);
      rows.add(s, p);
    }
    paged_in = paged_in || bool(b.kv.page_in);
  }
  const int64_t n = rows.size();
  if (n == 0) return;
  Work w;
  w.resize(c, n, paged_in);
  for (int64_t s = 0, row = 0; s < n_seqs; row += seqs[s].n, ++s) embed(seqs[s].tokens, seqs[s].n, &w.x[size_t(row * H)]);
  rope_tables(inv_freq_, inv_freq_local_, rows, w);
  std::optional<stream::LayerStreamer::Pass> pass;  // streaming: one pass over every layer
  if (stream_) pass.emplace(*stream_);
  Weight mats[kLayerMats];
  for (int64_t l = 0; l < c.n_layers; ++l) {
    if (pass) w.mats = bind_streamed(layers_[size_t(l)], pass->acquire(l), mats);
    run_layer(l, seqs, &rows, &w, nullptr);
    if (pass) pass->release();
  }
  w.mats = nullptr;
  pass.reset();  // the next pass may start while the logits are computed

  // Logits: the requested rows of every sequence in one matmul.
  std::vector<int64_t> src;
  for (int64_t s = 0, row = 0; s < n_seqs; row += seqs[s].n, ++s)
    if (seqs[s].logits)
      for (int64_t i = seqs[s].n - std::clamp<int64_t>(seqs[s].n_logits, 0, seqs[s].n); i < seqs[s].n; ++i)
        src.push_back(row + i);
  if (src.empty()) return;
  const int64_t m = int64_t(src.size());
  std::vector<float> xs(size_t(m * H));
  for (int64_t i = 0; i < m; ++i) w.residual_row(src[size_t(i)], H, &xs[size_t(i * H)]);  // the last layer's add, for these rows only
  kernels::rms_norm(xs.data(), final_norm_store_.data(), xs.data(), m, H, float(c.rms_norm_eps));
  const bool direct = n_seqs == 1;  // one sequence: straight into its buffer
  std::vector<float> out(direct ? 0 : size_t(m * c.vocab_size));
  float* y = direct ? seqs[0].logits : out.data();
  linear(xs.data(), lm_head_, nullptr, y, m);
  if (direct) return;
  for (int64_t s = 0, i = 0; s < n_seqs; ++s) {
    if (!seqs[s].logits) continue;
    const int64_t k = std::clamp<int64_t>(seqs[s].n_logits, 0, seqs[s].n);
    std::memcpy(seqs[s].logits, &out[size_t(i * c.vocab_size)], size_t(k * c.vocab_size) * sizeof(float));
    i += k;
  }
}

BlendStats Model::forward_blend(const int32_t* tokens, int64_t n, const KvView& kv, const BlendOptions& opt,
                                float* logits) const {
  const ModelConfig& c = cfg_;
  const int64_t H = c.hidden_size, nkv = c.n_kv_heads * c.head_dim;
  if (n <= 0) fail("forward_blend: no tokens");
  if (kv.page_in) fail("forward_blend: K/V in a cold tier are not supported (use selective repair)");
  if (opt.ratio < 0 || opt.ratio > 1) fail("blend ratio ", opt.ratio, " is outside [0, 1]");
  if (opt.first_ratio < 0 || opt.first_ratio > 1) fail("blend first ratio ", opt.first_ratio, " is outside [0, 1]");
  check_tokens(c, tokens, n);
  SeqBatch seq;
  seq.kv = kv;
  Rows rows;
  for (int64_t i = 0; i < n; ++i) rows.add(0, kv.n_past + i);
  Work w;
  w.resize(c, n, false);
  embed(tokens, n, w.x.data());
  rope_tables(inv_freq_, inv_freq_local_, rows, w);
  const int64_t check = std::clamp<int64_t>(opt.check_layer, 0, c.n_layers - 1);
  BlendStats st;
  std::optional<stream::LayerStreamer::Pass> pass;  // streaming: one pass over every layer
  if (stream_) pass.emplace(*stream_);
  Weight mats[kLayerMats];
  for (int64_t l = 0; l < check; ++l) {
    if (pass) w.mats = bind_streamed(layers_[size_t(l)], pass->acquire(l), mats);
    run_layer(l, &seq, &rows, &w, nullptr);
    if (pass) pass->release();
  }
  // Candidates: reused tokens other than the last; every other row runs in every layer.
  std::vector<uint8_t> is_cand(size_t(n), 0);
  int64_t n_cand = 0;
  for (int64_t t = 0; t < n - 1; ++t) n_cand += is_cand[size_t(t)] = opt.reused && opt.reused[t];
  auto count = [&](double ratio) {
    return std::min<int64_t>(n_cand, int64_t(std::ceil(std::max(0.0, ratio) * double(n_cand))));
  };
  const int64_t n_final = count(opt.ratio);
  const int64_t n_first = std::max(n_final, count(opt.first_ratio));
  const int64_t taper = n_first > n_final ? std::max<int64_t>(1, opt.taper_layers) : 0;
  // Candidates kept for layer l (check <= l): n_first at the check layer, linearly down to
  // n_final at check + taper.
  auto keep_at = [&](int64_t l) {
    const int64_t d = l - check;
    if (d >= taper) return n_final;
    return n_final + (n_first - n_final) * (taper - d) / taper;
  };
  std::vector<int64_t> tok(static_cast<size_t>(n));  // token index of each current row
  for (int64_t t = 0; t < n; ++t) tok[size_t(t)] = t;
  int64_t n_kept = n_cand;  // candidates among the current rows
  std::vector<float> dev;
  // Deviation of each current candidate row's fresh K/V from its cached K/V at layer l.
  int64_t measured_layer = 0;
  const std::function<void(const float*, const float*)> measure = [&](const float* k, const float* v) {
    const int64_t bs = kv.block_size, l = measured_layer;
    dev.assign(tok.size(), 0.0f);
    for (size_t r = 0; r < tok.size(); ++r) {
      if (!is_cand[size_t(tok[r])]) continue;
      const int64_t p = kv.n_past + tok[r];
      const float* ck = slot_ptr(kv.k_pools[l], kv.block_table, bs, p, nkv);
      const float* cv = slot_ptr(kv.v_pools[l], kv.block_table, bs, p, nkv);
      // Relative to the fresh vectors' size, K and V each: a token whose small K/V changed
      // by half ranks above one whose large K/V moved by a tenth (Gemma 3 RAG, 48 prompts: KL
      // 0.028 -> 0.0165 against the absolute squared distance, docs/chunk-reuse.md).
      double dk2 = 0, dv2 = 0, k2 = 0, v2 = 0;
      for (int64_t i = 0; i < nkv; ++i) {
        const double kk = k[int64_t(r) * nkv + i], vv = v[int64_t(r) * nkv + i];
        const double dk = kk - ck[i], dv = vv - cv[i];
        dk2 += dk * dk, dv2 += dv * dv, k2 += kk * kk, v2 += vv * vv;
      }
      dev[r] = float(dk2 / std::max(k2, 1e-30) + dv2 / std::max(v2, 1e-30));
    }
  };
  st.n_full_layers = check;
  for (int64_t l = check; l < c.n_layers; ++l) {
    if (pass) w.mats = bind_streamed(layers_[size_t(l)], pass->acquire(l), mats);
    const int64_t target = keep_at(l);
    if (l == check || target < n_kept) {
      // K/V of every current row first (they measure and are stored: a row dropped here keeps
      // its fresh K/V of this layer), then queries, attention and MLP for the rows kept.
      measured_layer = l;
      run_layer(l, &seq, &rows, &w, &measure, /*kv_only=*/true);
      std::vector<int64_t> cand;
      for (size_t r = 0; r < tok.size(); ++r)
        if (is_cand[size_t(tok[r])]) cand.push_back(int64_t(r));
      const int64_t n_sel = std::min<int64_t>(target, int64_t(cand.size()));
      std::partial_sort(cand.begin(), cand.begin() + n_sel, cand.end(), [&](int64_t a, int64_t b) {
        return dev[size_t(a)] != dev[size_t(b)] ? dev[size_t(a)] > dev[size_t(b)] : a < b;
      });
      std::vector<uint8_t> keep(tok.size(), 0);
      for (size_t r = 0; r < tok.size(); ++r) keep[r] = !is_cand[size_t(tok[r])];
      for (int64_t i = 0; i < n_sel; ++i) keep[size_t(cand[size_t(i)])] = 1;
      int64_t m = 0;
      for (uint8_t x : keep) m += x;
      Rows next;
      Work w2;
      w2.resize(c, m, false);
      std::vector<int64_t> next_tok;
      for (size_t r = 0; r < tok.size(); ++r) {
        if (!keep[r]) continue;
        next.add(0, kv.n_past + tok[r]);
        std::memcpy(&w2.x[size_t(int64_t(next_tok.size()) * H)], &w.x[r * size_t(H)], size_t(H) * sizeof(float));
        next_tok.push_back(tok[r]);
      }
      rope_tables(inv_freq_, inv_freq_local_, next, w2);
      w2.mats = w.mats;
      w = std::move(w2);
      rows = std::move(next);
      tok = std::move(next_tok);
      n_kept = n_sel;
    }
    run_layer(l, &seq, &rows, &w, nullptr);
    st.n_row_layers += rows.size();
    if (pass) pass->release();
  }
  st.n_selected = n_kept;
  st.n_rows_late = rows.size();
  w.mats = nullptr;
  pass.reset();
  std::vector<float> last(static_cast<size_t>(H));
  w.residual_row(rows.size() - 1, H, last.data());
  kernels::rms_norm(last.data(), final_norm_store_.data(), w.h.data(), 1, H, float(c.rms_norm_eps));
  linear(w.h.data(), lm_head_, nullptr, logits, 1);
  return st;
}

}  // namespace kvboost
