// Weight packing for the matmul micro-kernels, and the scalar reference over the packed layout.
// Layout contract (kernels.h, PackedWeight): panels of 16 output features, [K][16] per panel.
#include <cstdlib>
#include <cstring>

#include "cpu/cpu_kernels.h"
#include "cpu/matmul_packed_isa.h"
#include "kvboost/common.h"

namespace kvboost::kernels {
using cpu::kPackedPanel;

void PackedWeight::Free::operator()(void* p) const { std::free(p); }

namespace cpu {
int packed_feature(WType wt, int pos) {
  // bf16: the 32-bit word i holds features i (low half) and 8 + i (high half).
  if (wt == WType::BF16) return (pos & 1) ? 8 + pos / 2 : pos / 2;
  return pos;
}
}  // namespace cpu

PackedWeight pack_weight(const void* w, WType wt, int64_t N, int64_t K) {
  return pack_weight(w, wt, N, K, pack_layout_for(active_isa(), wt));
}

PackedWeight pack_weight(const void* w, WType wt, int64_t N, int64_t K, PackLayout layout) {
  if (N <= 0 || K <= 0) fail("pack_weight: empty weight [", N, ", ", K, "]");
  if (wtype_is_quantized(wt))
    fail("pack_weight: ", wtype_name(wt), " weights are not packed (matmul reads the blocks as they are)");
  PackedWeight pw;
  // 64-byte aligned storage of `bytes` for a [N, K] weight in `layout` (the lambda shares this
  // friend function's access to PackedWeight).
  auto allocate = [&](size_t bytes) {
    void* mem = std::aligned_alloc(64, bytes);
    if (!mem) fail("pack_weight: cannot allocate ", bytes, " bytes for a [", N, ", ", K, "] weight");
    pw.data_.reset(static_cast<uint8_t*>(mem));
    pw.bytes_ = bytes;
    pw.wt_ = wt;
    pw.layout_ = layout;
    pw.n_ = N;
    pw.k_ = K;
    return mem;
  };
  if (layout == PackLayout::Bf16Pairs) {  // matmul_packed_pairs.cpp
    if (wt != WType::BF16)
      fail("pack_weight: the Bf16Pairs layout takes BF16 weights, not ", wtype_name(wt));
    void* mem = allocate(cpu::pairs_packed_bytes(N, K));
    cpu::pack_pairs(static_cast<const uint16_t*>(w), N, K, static_cast<uint8_t*>(mem));
    return pw;
  }
  const int es = wtype_size(wt);
  const int64_t n_panels = (N + kPackedPanel - 1) / kPackedPanel;
  const size_t panel_bytes = size_t(K) * kPackedPanel * es;
  size_t bytes = size_t(n_panels) * panel_bytes;
  bytes = (bytes + 63) / 64 * 64;
  void* mem = allocate(bytes);
  const uint8_t* src = static_cast<const uint8_t*>(w);
  uint8_t* dst = static_cast<uint8_t*>(mem);
  int feat[kPackedPanel];
  for (int p = 0; p < kPackedPanel; ++p) feat[p] = cpu::packed_feature(wt, p);
  // Per panel: read 16 source rows (sequential streams), write one linear panel. Typed element
  // copies: a memcpy of run-time size per element made packing q05 at load (LoadOptions::
  // pack_weights) cost ~20 s; `kvboost generate` went 34 -> 20 s end to end (load ~10).
  auto pack_panels = [&](auto elem) {
    using T = decltype(elem);
    const T* s = reinterpret_cast<const T*>(src);
    parallel_for_dynamic(n_panels, n_panels > 1 && N * K >= (1 << 16), [&](int64_t pi, int) {
      T* out = reinterpret_cast<T*>(dst + size_t(pi) * panel_bytes);
      const T* rows[kPackedPanel];
      for (int pos = 0; pos < kPackedPanel; ++pos) {
        const int64_t n = pi * kPackedPanel + feat[pos];
        rows[pos] = n < N ? s + size_t(n) * K : nullptr;
      }
      for (int64_t k = 0; k < K; ++k)
        for (int pos = 0; pos < kPackedPanel; ++pos) out[size_t(k) * kPackedPanel + pos] = rows[pos] ? rows[pos][k] : T(0);
    });
  };
  if (es == 4) pack_panels(uint32_t{});
  else pack_panels(uint16_t{});
  if (bytes > size_t(n_panels) * panel_bytes)
    std::memset(dst + size_t(n_panels) * panel_bytes, 0, bytes - size_t(n_panels) * panel_bytes);
  return pw;
}

void matmul_packed_ref(const float* x, const PackedWeight& w, const float* bias, float* y,
                       int64_t M) {
  if (w.layout() == PackLayout::Bf16Pairs) return cpu::matmul_packed_ref_pairs(x, w, bias, y, M);
  const int64_t N = w.n(), K = w.k();
  const int es = wtype_size(w.wt());
  const uint8_t* base = static_cast<const uint8_t*>(w.data());
  int pos_of[kPackedPanel];
  for (int p = 0; p < kPackedPanel; ++p) pos_of[cpu::packed_feature(w.wt(), p)] = p;
  for (int64_t n = 0; n < N; ++n) {
    const uint8_t* panel = base + size_t(n / kPackedPanel) * K * kPackedPanel * es;
    const int pos = pos_of[n % kPackedPanel];
    for (int64_t m = 0; m < M; ++m) {
      double acc = bias ? bias[n] : 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const uint8_t* e = panel + (size_t(k) * kPackedPanel + pos) * es;
        float v;
        if (w.wt() == WType::F32) std::memcpy(&v, e, 4);
        else {
          uint16_t h;
          std::memcpy(&h, e, 2);
          v = w.wt() == WType::F16 ? f16_to_f32(h) : bf16_to_f32(h);
        }
        acc += double(x[m * K + k]) * v;
      }
      y[m * N + n] = float(acc);
    }
  }
}

void packed_row(const PackedWeight& w, int64_t n, float* out) {
  const int64_t K = w.k();
  if (n < 0 || n >= w.n()) fail("packed_row: row ", n, " is outside [0, ", w.n(), ")");
  if (w.layout() == PackLayout::Bf16Pairs) {
    const uint8_t* base = static_cast<const uint8_t*>(w.data());
    for (int64_t k = 0; k < K; ++k) out[k] = bf16_to_f32(cpu::pairs_at(base, K, n, k));
    return;
  }
  const int es = wtype_size(w.wt());
  int pos = 0;
  while (cpu::packed_feature(w.wt(), pos) != n % kPackedPanel) ++pos;
  const uint8_t* e = static_cast<const uint8_t*>(w.data()) + size_t(n / kPackedPanel) * K * kPackedPanel * es +
                     size_t(pos) * es;
  const size_t stride = size_t(kPackedPanel) * es;
  if (w.wt() == WType::F32) {
    for (int64_t k = 0; k < K; ++k, e += stride) std::memcpy(out + k, e, 4);
    return;
  }
  for (int64_t k = 0; k < K; ++k, e += stride) {
    uint16_t h;
    std::memcpy(&h, e, 2);
    out[k] = w.wt() == WType::F16 ? f16_to_f32(h) : bf16_to_f32(h);
  }
}

}  // namespace kvboost::kernels
