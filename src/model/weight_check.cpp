// NaN / Inf scan of stored weights (weight_check.h). The plain-type loops are written so that the
// compiler vectorizes them (an OR over 4096-element chunks of "exponent all ones", no branch
// inside a chunk); only a chunk that has one is searched element by element.
#include "weight_check.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace kvboost::weight_check {

using kernels::WType;

namespace {

template <class T>
inline T load(const uint8_t* p) {  // unaligned-safe (a GGUF tensor need not be aligned to T)
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <class T>
int64_t scan_plain(const uint8_t* p, int64_t n, T exp_mask) {
  constexpr int64_t kChunk = 4096;
  for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
    const int64_t m = std::min(n - i0, kChunk);
    const uint8_t* q = p + size_t(i0) * sizeof(T);
    T bad = 0;  // vectorized: per lane, (x & mask) == mask as all ones, ORed
    for (int64_t i = 0; i < m; ++i) bad |= T(-T((load<T>(q + i * sizeof(T)) & exp_mask) == exp_mask));
    if (bad)
      for (int64_t i = 0; i < m; ++i)
        if ((load<T>(q + i * sizeof(T)) & exp_mask) == exp_mask) return i0 + i;
  }
  return -1;
}

bool f16_nonfinite(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return (h & 0x7c00u) == 0x7c00u;
}

// Byte offsets of a block's f16 scales (d, and dmin for Q4_K / Q5_K), -1 for none.
struct Scales { int d, dmin; };
Scales scales_of(WType wt) {
  switch (wt) {
    case WType::Q8_0: case WType::Q4_0: case WType::Q5_0: case WType::Q4_Z: case WType::Q4_Z128:
      return {0, -1};
    case WType::Q4_K: case WType::Q5_K: return {0, 2};
    case WType::Q6_K: return {208, -1};  // ql[128] qh[64] scales[16] d
    default: return {-1, -1};
  }
}

}  // namespace

int64_t find_nonfinite(const void* data, WType wt, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  switch (wt) {
    case WType::F32: return scan_plain<uint32_t>(p, n, 0x7f800000u);
    case WType::F16: return scan_plain<uint16_t>(p, n, uint16_t(0x7c00));
    case WType::BF16: return scan_plain<uint16_t>(p, n, uint16_t(0x7f80));
    default: break;
  }
  const Scales s = scales_of(wt);
  const int64_t be = kernels::wtype_block_elems(wt), bb = kernels::wtype_block_bytes(wt);
  for (int64_t b = 0; b < n / be; ++b) {
    const uint8_t* blk = p + size_t(b * bb);
    if (f16_nonfinite(blk + s.d) || (s.dmin >= 0 && f16_nonfinite(blk + s.dmin))) return b * be;
  }
  return -1;
}

int64_t find_nonfinite_ref(const void* data, WType wt, int64_t n) {
  const int64_t be = kernels::wtype_block_elems(wt);
  const int64_t bb = kernels::wtype_block_bytes(wt);
  const int64_t per = std::max<int64_t>(be, 4096 / be * be);  // elements converted at a time
  std::vector<float> buf(static_cast<size_t>(per));
  for (int64_t i0 = 0; i0 < n; i0 += per) {
    const int64_t m = std::min(per, n - i0);
    kernels::to_f32(static_cast<const uint8_t*>(data) + size_t(i0 / be * bb), wt, buf.data(), m);
    for (int64_t i = 0; i < m; ++i)
      if (!std::isfinite(buf[size_t(i)])) return (i0 + i) / be * be;
  }
  return -1;
}

}  // namespace kvboost::weight_check
