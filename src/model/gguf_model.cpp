// Llama-family models from GGUF files: hyper-parameters from the metadata (turned into the
// config.json fields ModelConfig::from_json already validates; an architecture's own keys by
// its gguf_config) and tensors renamed by the architecture's tensor table to the Hugging Face
// names the decoder binds, so the decoder has one weight-binding path.
//
// Two format facts matter here:
//  - GGUF lists dimensions innermost first (ne[0] = row length): a [rows, cols] nn.Linear
//    weight is stored with ne = {cols, rows}.
//  - llama.cpp's converter permutes the rows of Q and K (and their biases) for `llama` so that
//    its interleaved RoPE (pairs 2i, 2i+1) matches HF's rotate-half (pairs i, i + d/2): within
//    each head, stored row 2i + j is HF row j * d/2 + i. We undo that so the rotate-half RoPE
//    is right. qwen2/qwen3 files are written without the permutation.
#include <cmath>
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <climits>

#include <nlohmann/json.hpp>

#include "arch.h"
#include "gguf.h"
#include "kvboost/model.h"
#include "kvboost/model_files.h"

namespace kvboost {

using kernels::GgmlType;
using nlohmann::json;

namespace {

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

bool is_dir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// GGUF name -> Hugging Face name by the architecture's tensor table (src/model/arch/), and
// the role of a per-layer tensor; "" when the decoder has no use for the tensor.
std::string hf_name(const std::string& g, const arch::Arch& a, const arch::LayerTensor** entry) {
  *entry = nullptr;
  if (g == "token_embd.weight") return "model.embed_tokens.weight";
  if (g == "output_norm.weight") return "model.norm.weight";
  if (g == "output.weight") return "lm_head.weight";
  if (g.rfind("blk.", 0) != 0) return "";
  const size_t dot = g.find('.', 4);
  if (dot == std::string::npos) return "";
  const std::string layer = g.substr(4, dot - 4), rest = g.substr(dot + 1);
  if (layer.empty() || layer.find_first_not_of("0123456789") != std::string::npos) return "";
  for (const arch::LayerTensor& t : a.tensors)
    if (rest == t.gguf) {
      *entry = &t;
      return "model.layers." + layer + "." + t.hf;
    }
  return "";
}

// Rows [0, n_rows) of `src` (row_bytes each) reordered from llama.cpp's Q/K order back to
// HF order, per head of head_rows rows.
void unpermute_rows(const uint8_t* src, uint8_t* dst, int64_t n_rows, int64_t head_rows, size_t row_bytes,
                    const std::string& where) {
  if (head_rows % 2 != 0 || n_rows % head_rows != 0)
    fail(where, ": cannot undo the Q/K row permutation: ", n_rows, " rows are not whole heads of ", head_rows);
  const int64_t half = head_rows / 2;
  for (int64_t h = 0; h < n_rows / head_rows; ++h)
    for (int64_t i = 0; i < half; ++i)
      for (int64_t j = 0; j < 2; ++j)
        std::memcpy(dst + size_t(h * head_rows + j * half + i) * row_bytes,
                    src + size_t(h * head_rows + 2 * i + j) * row_bytes, row_bytes);
}

// Tokens that end a generation besides tokenizer.ggml.eos_token_id, as llama.cpp's vocabulary
// loader (llama-vocab.cpp, special_eog_ids) decides them: tokenizer.ggml.eot_token_id and
// eom_token_id when present, and tokens whose text is a known end of turn. Gemma 3's GGUF files
// carry only eos = 1 (<eos>) while a chat turn ends with <end_of_turn> (106); Hugging Face's
// checkpoints list both in generation_config.json (eos_token_id [1, 106]).
void add_end_of_generation_ids(const gguf::File& f, std::vector<int32_t>& ids) {
  auto add = [&](int64_t id) {
    if (id >= 0 && id <= INT32_MAX && std::find(ids.begin(), ids.end(), int32_t(id)) == ids.end()) ids.push_back(int32_t(id));
  };
  for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"})
    if (f.find(key)) add(f.get_int(key));
  const gguf::Value* tokens = f.find("tokenizer.ggml.tokens");
  if (!tokens) return;
  static const char* const kTurnEnds[] = {"<end_of_turn>", "<|eot_id|>", "<|eom_id|>", "<|im_end|>",
                                          "<|endoftext|>", "<|end_of_text|>"};
  for (size_t i = 0; i < tokens->strings.size(); ++i)
    for (const char* t : kTurnEnds)
      if (tokens->strings[i] == t) add(int64_t(i));
}

}  // namespace

std::string gguf_model_file(const std::string& path) {
  if (!is_dir(path)) return ends_with(path, ".gguf") ? path : "";
  if (file_exists(path_join(path, "config.json"))) return "";
  DIR* d = ::opendir(path.c_str());
  if (!d) return "";
  std::vector<std::string> found;
  while (dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (ends_with(n, ".gguf")) found.push_back(n);
  }
  ::closedir(d);
  if (found.size() > 1)
    fail(path, ": holds ", found.size(), " .gguf files (", found[0], ", ", found[1], ", ...): name the file to load");
  return found.empty() ? "" : path_join(path, found[0]);
}

ModelConfig ModelConfig::from_gguf(const std::string& gguf_path) {
  gguf::File f(gguf_path);
  const arch::Arch& ar = arch::find_gguf(f.get_string("general.architecture"), f.path());
  const std::string a = std::string(ar.gguf_arch) + ".";
  json j;
  j["model_type"] = ar.model_type;
  j["hidden_size"] = f.get_int(a + "embedding_length");
  j["intermediate_size"] = f.get_int(a + "feed_forward_length");
  j["num_hidden_layers"] = f.get_int(a + "block_count");
  j["num_attention_heads"] = f.get_int(a + "attention.head_count");
  j["num_key_value_heads"] = f.get_int(a + "attention.head_count_kv", f.get_int(a + "attention.head_count"));
  if (f.find(a + "attention.key_length")) {
    j["head_dim"] = f.get_int(a + "attention.key_length");
    if (f.get_int(a + "attention.value_length", j["head_dim"].get<int64_t>()) != j["head_dim"].get<int64_t>())
      fail(gguf_path, ": attention.key_length and attention.value_length differ (not supported)");
  }
  const gguf::Tensor* emb = f.tensor("token_embd.weight");
  if (!emb) fail(gguf_path, ": tensor \"token_embd.weight\" is missing");
  if (emb->ne.size() != 2) fail(gguf_path, ": tensor \"token_embd.weight\" must have 2 dimensions");
  j["vocab_size"] = f.get_int(a + "vocab_size", emb->ne[1]);
  j["max_position_embeddings"] = f.get_int(a + "context_length", 2048);
  j["rms_norm_eps"] = f.get_float(a + "attention.layer_norm_rms_epsilon", 1e-6);
  j["rope_theta"] = f.get_float(a + "rope.freq_base", 10000.0);
  // JSON has no NaN/Inf (they would become null, i.e. the default): refuse them here.
  for (const char* k : {"rms_norm_eps", "rope_theta"})
    if (!std::isfinite(j[k].get<double>()))
      fail(gguf_path, ": metadata for ", k, " (", a, k[1] == 'm' ? "attention.layer_norm_rms_epsilon" : "rope.freq_base",
           ") is not a finite number");
  j["tie_word_embeddings"] = f.tensor("output.weight") == nullptr;
  j["attention_bias"] = f.tensor("blk.0.attn_q.bias") != nullptr;
  const std::string rs = f.get_string(a + "rope.scaling.type", "none");
  if (rs == "linear") {
    j["rope_scaling"] = {{"type", "linear"}, {"factor", f.get_float(a + "rope.scaling.factor", 1.0)}};
  } else if (rs != "none") {
    fail(gguf_path, ": metadata \"", a, "rope.scaling.type\" = \"", rs, "\" is not supported (none, linear)");
  }
  if (f.tensor("rope_freqs.weight"))  // llama3-style scaling stored as per-frequency factors
    fail(gguf_path, ": tensor \"rope_freqs.weight\" (llama3 RoPE frequency factors) is not supported yet");
  if (ar.gguf_config) ar.gguf_config(f, j);  // the architecture's own keys
  if (f.find("tokenizer.ggml.bos_token_id")) j["bos_token_id"] = f.get_int("tokenizer.ggml.bos_token_id");
  if (f.find("tokenizer.ggml.eos_token_id")) j["eos_token_id"] = f.get_int("tokenizer.ggml.eos_token_id");
  ModelConfig c = from_json(j.dump(), "", gguf_path);
  if (ar.gguf_norms_offset_applied) c.norm_weight_offset = 0.0f;  // the converter stored 1 + w already
  add_end_of_generation_ids(f, c.eos_token_ids);
  return c;
}

WeightFiles WeightFiles::open_gguf(const std::string& path, bool keep_quantized) {
  gguf::File f(path);
  const arch::Arch& ar = arch::find_gguf(f.get_string("general.architecture"), f.path());
  const std::string arch = ar.gguf_arch;
  const bool permuted = ar.gguf_permuted_qk;
  const int64_t n_head = f.get_int(arch + ".attention.head_count");
  const int64_t n_head_kv = f.get_int(arch + ".attention.head_count_kv", n_head);
  WeightFiles w;
  for (const gguf::Tensor& t : f.tensors()) {
    const arch::LayerTensor* entry = nullptr;
    const std::string name = hf_name(t.name, ar, &entry);
    if (name.empty()) continue;
    const std::string where = path + ": tensor \"" + t.name + "\"";
    if (!kernels::ggml_type_supported(uint32_t(t.type)))
      fail(where, ": ggml type ", uint32_t(t.type), " is not supported (F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K)");
    TensorInfo ti;
    ti.name = name;
    ti.file = path;
    for (auto it = t.ne.rbegin(); it != t.ne.rend(); ++it) ti.shape.push_back(*it);
    const bool is_q = entry && (entry->role == arch::Role::Wq || entry->role == arch::Role::QBias);
    const bool is_k = entry && (entry->role == arch::Role::Wk || entry->role == arch::Role::KBias);
    const bool unpermute = permuted && (is_q || is_k);
    // Biases are 1-D: permute single elements. Weights: whole rows (whole blocks).
    const int64_t n_rows = t.ne.size() == 1 ? t.ne[0] : t.rows();
    const size_t row_bytes = t.nbytes / size_t(n_rows);
    const uint8_t* src = t.data;
    if (unpermute) {
      const int64_t n_heads = is_q ? n_head : n_head_kv;
      if (n_heads <= 0 || n_rows % n_heads != 0)
        fail(where, ": ", n_rows, " rows are not divisible into ", n_heads, " heads");
      auto buf = std::make_shared<std::vector<uint8_t>>(t.nbytes);
      unpermute_rows(t.data, buf->data(), n_rows, n_rows / n_heads, row_bytes, where);
      w.owned_.push_back(buf);
      src = buf->data();
    }
    const bool plain = t.type == GgmlType::F32 || t.type == GgmlType::F16 || t.type == GgmlType::BF16;
    const size_t esize = t.type == GgmlType::F32 ? 4 : 2;
    // Quantized matrices stay in their blocks (the matmul reads them; kernels.h WType has the
    // same names: "Q8_0", "Q4_K", ...). Blocks need no alignment.
    const bool keep_blocks = keep_quantized && !plain && t.ne.size() == 2;
    if ((plain && reinterpret_cast<uintptr_t>(src) % esize == 0) || keep_blocks) {
      ti.dtype = kernels::ggml_type_name(t.type);
      ti.data = src;
      ti.nbytes = t.nbytes;
    } else {
      // Misaligned, or a quantized vector: dequantize once into an owned f32 buffer.
      const int64_t n = t.n_elems(), row = t.ne[0];
      auto buf = std::make_shared<std::vector<uint8_t>>(size_t(n) * 4);
      float* dst = reinterpret_cast<float*>(buf->data());
      const size_t rb = size_t(kernels::ggml_row_bytes(t.type, row));
      const int64_t rows = n / row;
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < rows; ++r) kernels::dequantize_row(src + size_t(r) * rb, t.type, dst + r * row, row);
      w.owned_.push_back(buf);
      ti.dtype = "F32";
      ti.data = dst;
      ti.nbytes = size_t(n) * 4;
    }
    if (w.tensors_.count(name)) fail(where, ": maps to \"", name, "\", which another tensor already provides");
    w.tensors_[name] = std::move(ti);
  }
  w.files_.push_back(f.mapping());
  return w;
}

}  // namespace kvboost
