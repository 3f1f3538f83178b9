// Loading: the config and weight files of a model path (safetensors directory or GGUF file),
// and binding every tensor of the architecture's table (src/model/arch/) with shape, dtype and
// finiteness checks. Weight preparation after binding is prepare.cpp; the forward pass is
// forward.cpp over the blocks of blocks.h.
#include <cmath>

#include <cstdlib>
#include <string>

#include "layer_stream.h"
#include "model_impl.h"
#include "weight_check.h"

namespace kvboost {

using kernels::WType;

namespace detail {

ModelImpl::~ModelImpl() = default;

// TensorInfo dtype strings are kernels::wtype_name's: F32, F16, BF16, and the quantized blocks
// Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K (GGUF) and Q4_Z / Q4_Z128 (AWQ), which the matmul reads as they are.
WType wtype_of(const TensorInfo& t) {
  for (WType w : {WType::F32, WType::F16, WType::BF16, WType::Q8_0, WType::Q4_0, WType::Q5_0, WType::Q4_K,
                  WType::Q5_K, WType::Q6_K, WType::Q4_Z, WType::Q4_Z128})
    if (t.dtype == kernels::wtype_name(w)) return w;
  fail(t.file, ": tensor \"", t.name, "\" has dtype ", t.dtype,
       " (supported: F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K, Q4_Z, Q4_Z128)");
}

namespace {

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
  // reads each mapped page once, which the prefault would do anyway. The environment variable
  // KVBOOST_WEIGHT_CHECK=sample keeps the earlier check (rows 0, rows/2 and rows-1 of plain
  // matrices; A/B runs of one binary, bench/weight_check_bench).
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

// Layer l's tensors, in the architecture's table order.
void bind_layer(const arch::Arch& a, const WeightFiles& f, const std::string& dir, const ModelConfig& c, int64_t l,
                LayerWeights& L, bool full) {
  using arch::Role;
  const int64_t H = c.hidden_size, I = c.intermediate_size, hd = c.head_dim;
  const int64_t nq = c.n_heads * hd, nkv = c.n_kv_heads * hd;
  const std::string p = "model.layers." + std::to_string(l) + ".";
  for (const arch::LayerTensor& t : a.tensors) {
    if (t.when == arch::When::AttentionBias && !c.attention_bias) continue;
    const std::string name = p + t.hf;
    switch (t.role) {
      case Role::AttnNorm: L.attn_norm = norm_vec(f, dir, name, H, c); break;
      case Role::PostAttnNorm: L.post_attn_norm = norm_vec(f, dir, name, H, c); break;
      case Role::MlpNorm: L.mlp_norm = norm_vec(f, dir, name, H, c); break;
      case Role::PostMlpNorm: L.post_mlp_norm = norm_vec(f, dir, name, H, c); break;
      case Role::QNorm: L.q_norm = norm_vec(f, dir, name, hd, c); break;
      case Role::KNorm: L.k_norm = norm_vec(f, dir, name, hd, c); break;
      case Role::Wq: L.wq = matrix(f, dir, name, nq, H, full); break;
      case Role::Wk: L.wk = matrix(f, dir, name, nkv, H, full); break;
      case Role::Wv: L.wv = matrix(f, dir, name, nkv, H, full); break;
      case Role::Wo: L.wo = matrix(f, dir, name, H, nq, full); break;
      case Role::QBias: L.q_bias = vec(f, dir, name, nq); break;
      case Role::KBias: L.k_bias = vec(f, dir, name, nkv); break;
      case Role::VBias: L.v_bias = vec(f, dir, name, nkv); break;
      case Role::OBias: L.o_bias = vec(f, dir, name, H); break;
      case Role::Gate: L.w_gate = matrix(f, dir, name, I, H, full); break;
      case Role::Up: L.w_up = matrix(f, dir, name, I, H, full); break;
      case Role::Down: L.w_down = matrix(f, dir, name, H, I, full); break;
    }
  }
  L.window = c.layer_window[size_t(l)];
}

}  // namespace
}  // namespace detail

using detail::matrix_bytes;

Model::Model() = default;
Model::~Model() = default;

const std::string& Model::dir() const { return impl_->dir; }
std::vector<std::string> Model::weight_paths() const { return impl_->files.paths(); }
const Weight& Model::embedding() const { return impl_->embed; }
const Weight& Model::lm_head() const { return impl_->lm_head; }
int64_t Model::n_packed() const { return int64_t(impl_->packed.size()); }
const std::vector<float>& Model::rope_inv_freq() const { return impl_->inv_freq; }
const std::vector<float>& Model::rope_inv_freq(int64_t layer) const {
  const bool local = !impl_->inv_freq_local.empty() && impl_->layers.at(size_t(layer)).window > 0;
  return local ? impl_->inv_freq_local : impl_->inv_freq;
}

size_t Model::weight_bytes() const {
  const detail::ModelImpl& m = *impl_;
  size_t n = matrix_bytes(m.embed) + (m.lm_head.data == m.embed.data ? 0 : matrix_bytes(m.lm_head));
  n += m.final_norm_store.size() * sizeof(float);
  for (const detail::LayerWeights& L : m.layers) {
    for (const Weight* w : detail::layer_mats(L)) n += matrix_bytes(*w);
    for (const auto* v : {&L.attn_norm, &L.mlp_norm, &L.q_norm, &L.k_norm, &L.q_bias, &L.k_bias, &L.v_bias, &L.o_bias,
                          &L.post_attn_norm, &L.post_mlp_norm})
      n += v->size() * sizeof(float);
  }
  return n;
}

size_t Model::decode_weight_bytes() const {
  size_t n = matrix_bytes(impl_->lm_head);
  for (const detail::LayerWeights& L : impl_->layers)
    for (const Weight* w : detail::layer_mats(L)) n += matrix_bytes(*w);
  return n;
}

std::unique_ptr<Model> Model::load(const std::string& dir, const LoadOptions& opt) {
  kernels::require_device(opt.device, "device");
  if (!opt.device.is_cpu())  // docs/gpu.md: the device runner is the engine's (src/runtime/runner.h)
    fail("device ", opt.device.name(), ": Model's own forward passes run on the CPU; the engine runs on a CUDA "
         "device (Engine::load with EngineOptions::load.device, --device) -- see docs/gpu.md");
  std::unique_ptr<Model> model(new Model());
  model->impl_ = std::make_unique<detail::ModelImpl>();
  detail::ModelImpl& m = *model->impl_;
  m.dir = dir;
  if (const std::string g = gguf_model_file(dir); !g.empty()) {  // GGUF: src/model/gguf_model.cpp
    model->cfg_ = ModelConfig::from_gguf(g);
    m.files = WeightFiles::open_gguf(g);
  } else {
    model->cfg_ = ModelConfig::from_dir(dir);
    m.files = WeightFiles::open_dir(dir);
  }
  const ModelConfig& c = model->cfg_;
  const WeightFiles& f = m.files;
  m.arch = arch::find(c.model_type);
  if (!m.arch) fail(dir, ": model_type \"", c.model_type, "\" has no architecture");  // from_json checked it
  const int64_t H = c.hidden_size;

  m.embed = detail::matrix(f, dir, "model.embed_tokens.weight", c.vocab_size, H);
  std::vector<float> fn = detail::norm_vec(f, dir, "model.norm.weight", H, c);
  if (c.tie_word_embeddings) {
    m.lm_head = m.embed;
  } else {
    if (!f.find("lm_head.weight"))
      fail(dir, ": weight \"lm_head.weight\" is missing and config.json has tie_word_embeddings = false");
    m.lm_head = detail::matrix(f, dir, "lm_head.weight", c.vocab_size, H);
  }
  m.layers.resize(size_t(c.n_layers));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    // Layer streaming: the layer matrices are not read at load (the three-row sample only).
    detail::bind_layer(*m.arch, f, dir, c, l, m.layers[size_t(l)], /*full=*/opt.weight_budget == 0);
    if (opt.progress) opt.progress("layers", size_t(l + 1), size_t(c.n_layers));
  }
  bool awq = false;  // Q4_Z / Q4_Z128 exist only as repacked AWQ layers
  for (const detail::LayerWeights& L : m.layers)
    for (const Weight* w : detail::layer_mats(L)) awq = awq || w->type == WType::Q4_Z || w->type == WType::Q4_Z128;
  const void* float_head = m.lm_head.data;
  detail::quantize_head(m, opt, awq);
  m.final_norm = Weight{nullptr, WType::F32, 1, H};
  m.final_norm_store = std::move(fn);
  m.final_norm.data = m.final_norm_store.data();
  m.inv_freq = detail::compute_inv_freq(c, c.rope_theta);
  if (c.rope_local_theta > 0 && c.rope_local_theta != c.rope_theta)
    m.inv_freq_local = detail::compute_inv_freq(c, c.rope_local_theta);
  if (opt.weight_budget > 0) detail::setup_streaming(m, c, opt);
  // Packed copies replace the stored matrices (their pages are dropped as each is packed).
  const size_t packed_bytes = m.stream ? 0 : detail::pack_weights(m, opt);
  detail::prefault(m, opt, packed_bytes);
  detail::drop_float_head(m, c, float_head);
  return model;
}

}  // namespace kvboost
