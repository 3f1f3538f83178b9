// A minimal GGUF writer for hand-made test files (metadata of every type, tensors with a
// chosen alignment), shared by the GGUF test files.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "kvboost/common.h"
#include "kvboost/kernels.h"

namespace kvboost::test {

using kernels::GgmlType;

class Builder {
 public:
  explicit Builder(uint32_t version = 3) { u32(0x46554747u), u32(version); }
  void kv_u32(const std::string& k, uint32_t v) { key(k, 4), u32(v), ++n_kv_; }
  void kv_i8(const std::string& k, int8_t v) { key(k, 1), raw(&v, 1), ++n_kv_; }
  void kv_u64(const std::string& k, uint64_t v) { key(k, 10), u64(v), ++n_kv_; }
  void kv_i64(const std::string& k, int64_t v) { key(k, 11), raw(&v, 8), ++n_kv_; }
  void kv_f32(const std::string& k, float v) { key(k, 6), raw(&v, 4), ++n_kv_; }
  void kv_f64(const std::string& k, double v) { key(k, 12), raw(&v, 8), ++n_kv_; }
  void kv_bool(const std::string& k, bool v) { key(k, 7), u8(v), ++n_kv_; }
  void kv_str(const std::string& k, const std::string& v) { key(k, 8), str(v), ++n_kv_; }
  void kv_strs(const std::string& k, const std::vector<std::string>& v) {
    key(k, 9), u32(8), u64(v.size());
    for (const auto& s : v) str(s);
    ++n_kv_;
  }
  void kv_i32s(const std::string& k, const std::vector<int32_t>& v) {
    key(k, 9), u32(5), u64(v.size()), raw(v.data(), v.size() * 4), ++n_kv_;
  }
  void kv_f32s(const std::string& k, const std::vector<float>& v) {
    key(k, 9), u32(6), u64(v.size()), raw(v.data(), v.size() * 4), ++n_kv_;
  }
  // ne: ggml order (ne[0] = row length).
  void tensor(const std::string& name, GgmlType t, std::vector<int64_t> ne, const void* data, size_t nbytes) {
    tensors_.push_back({name, t, std::move(ne), std::vector<uint8_t>((const uint8_t*)data, (const uint8_t*)data + nbytes)});
  }
  std::vector<uint8_t> finish(uint64_t alignment = 32) {
    std::vector<uint8_t> out;
    auto put = [&](const void* p, size_t n) { out.insert(out.end(), (const uint8_t*)p, (const uint8_t*)p + n); };
    put(head_.data(), 8);
    const uint64_t nt = tensors_.size();
    put(&nt, 8);
    put(&n_kv_, 8);
    put(head_.data() + 8, head_.size() - 8);
    uint64_t off = 0;
    for (const auto& t : tensors_) {
      const uint64_t len = t.name.size();
      put(&len, 8), put(t.name.data(), len);
      const uint32_t nd = uint32_t(t.ne.size());
      put(&nd, 4);
      for (int64_t e : t.ne) put(&e, 8);
      const uint32_t ty = uint32_t(t.type);
      put(&ty, 4), put(&off, 8);
      off += (t.data.size() + alignment - 1) / alignment * alignment;
    }
    while (out.size() % alignment) out.push_back(0);
    for (size_t i = 0; i < tensors_.size(); ++i) {  // no padding after the last one
      put(tensors_[i].data.data(), tensors_[i].data.size());
      while (i + 1 < tensors_.size() && out.size() % alignment) out.push_back(0);
    }
    return out;
  }

 private:
  struct T { std::string name; GgmlType type; std::vector<int64_t> ne; std::vector<uint8_t> data; };
  void raw(const void* p, size_t n) { head_.insert(head_.end(), (const uint8_t*)p, (const uint8_t*)p + n); }
  void u8(uint8_t v) { raw(&v, 1); }
  void u32(uint32_t v) { raw(&v, 4); }
  void u64(uint64_t v) { raw(&v, 8); }
  void str(const std::string& s) { u64(s.size()), raw(s.data(), s.size()); }
  void key(const std::string& k, uint32_t type) { str(k), u32(type); }
  std::vector<uint8_t> head_;  // magic, version, then the key/values (counts inserted at finish)
  uint64_t n_kv_ = 0;
  std::vector<T> tensors_;
};

inline std::string write(const std::string& dir, const std::string& name, const std::vector<uint8_t>& bytes) {
  const std::string p = path_join(dir, name);
  std::ofstream(p, std::ios::binary).write((const char*)bytes.data(), std::streamsize(bytes.size()));
  return p;
}

// Shape of a random llama GGUF for engine tests.
struct LlamaShape {
  int64_t H, I, V, L, nh, nkv, hd;
};

// Uniform values in [-scale/2, scale/2) from a linear congruential generator (advances seed).
inline std::vector<float> lcg_values(uint32_t& seed, int64_t n, float scale) {
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) seed = seed * 1664525u + 1013904223u, x = scale * (float(seed >> 8) / float(1 << 24) - 0.5f);
  return v;
}

// Metadata and f32 tensors of a random llama model: token_embd, output_norm, then
// after_norm(seed) (e.g. writes an output tensor from the same value stream), then every layer.
template <class F>
void add_random_llama(Builder& b, const LlamaShape& s, uint32_t seed, F&& after_norm) {
  b.kv_str("general.architecture", "llama");
  b.kv_u32("llama.block_count", uint32_t(s.L));
  b.kv_u32("llama.embedding_length", uint32_t(s.H));
  b.kv_u32("llama.feed_forward_length", uint32_t(s.I));
  b.kv_u32("llama.attention.head_count", uint32_t(s.nh));
  b.kv_u32("llama.attention.head_count_kv", uint32_t(s.nkv));
  b.kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  auto add = [&](const std::string& name, std::vector<int64_t> ne, float scale) {
    int64_t n = 1;
    for (int64_t e : ne) n *= e;
    const auto v = lcg_values(seed, n, scale);
    b.tensor(name, GgmlType::F32, ne, v.data(), v.size() * 4);
  };
  add("token_embd.weight", {s.H, s.V}, 1.0f);
  add("output_norm.weight", {s.H}, 2.0f);
  after_norm(seed);
  for (int64_t l = 0; l < s.L; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add(p + "attn_norm.weight", {s.H}, 2.0f);
    add(p + "ffn_norm.weight", {s.H}, 2.0f);
    add(p + "attn_q.weight", {s.H, s.nh * s.hd}, 0.3f);
    add(p + "attn_k.weight", {s.H, s.nkv * s.hd}, 0.3f);
    add(p + "attn_v.weight", {s.H, s.nkv * s.hd}, 0.3f);
    add(p + "attn_output.weight", {s.nh * s.hd, s.H}, 0.3f);
    add(p + "ffn_gate.weight", {s.H, s.I}, 0.3f);
    add(p + "ffn_up.weight", {s.H, s.I}, 0.3f);
    add(p + "ffn_down.weight", {s.I, s.H}, 0.3f);
  }
}

}  // namespace kvboost::test
