// Quantized prefill on AMX-BF16 (QuantGemm::AmxBf16), the one source of the native build
// (matmul_qbf16_amx.cpp) and the emulated one (tests/kernels/matmul_qbf16_emu.cpp: SIMDe and the
// scalar AMX emulator). Each work item's pair of 16-row panels is dequantized (dequantize_wrow:
// the decode path's exact f32 values) and rounded to bf16 into the Bf16Pairs layout of the packed
// bf16 GEMM, then that GEMM's AMX-BF16 tiles (matmul_packed_avx512_impl.h, amx_item) run over it
// with the whole K sum kept in the tiles.
//
// Why not the int8 tiles: a quantized block of 32 weights has its own f32 scale, so tdpbusd's
// int32 sums must leave the tiles and be scaled every 32 k (matmul_qgemm_avx512_impl.h); that
// AVX-512 epilogue costs several times the tile instructions and held AMX-INT8 to the
// AVX512-VNNI speed (docs/kernels-vnni.md). Folding the scales into bf16 weights keeps the sums in
// the tiles; the per-call dequantization is a small part of the tile work at hundreds of tokens.
// Accuracy: weights are the dequantized values rounded to bf16 (relative 2^-9) and activations
// bf16 (relative 2^-9, per element), against the int8 paths' per-block activation quantization
// (max |x| / 254 per element).
//
// The same scheme without AMX (QuantGemm::Avx512Bf16, matmul_qbf16_avx512bf16.cpp): the panels as
// above, then the vdpbf16ps tiles of the packed bf16 GEMM (bf16_item, 12 tokens x 32 rows).
//
// Before including: matmul_packed_avx512_impl.h with KVB_MM_AMX or KVB_MM_BF16 (its namespace KVB_MM512_NS),
// and KVB_QBF16_PORTABLE where the bf16 rounding and the transpose must avoid vcvtneps2bf16 and
// gathers (SIMDe 0.7.4 builds). Defines KVB_MM512_NS::matmul_qbf16.
// (no include guard: each including file includes it once)

namespace kvboost::kernels::cpu::KVB_MM512_NS {

// Rows [n0, n0 + 16) of w (rows past N zero) as one Bf16Pairs panel: word (kp, f) at
// panel + 64 kp + 4 f holds bf16 w[n0 + f][2 kp] (low half) and w[n0 + f][2 kp + 1] (high half);
// K is zero-padded to Kp. rows: a [16][Kp] scratch of f32; bf: a [16][Kp] scratch of bf16.
inline void pack_pairs_panel(const uint8_t* w, WType wt, int64_t N, int64_t K, int64_t Kp, int64_t n0, float* rows,
                             uint16_t* bf, uint8_t* panel) {
  const size_t rb = size_t(wtype_row_bytes(wt, K));
  for (int f = 0; f < 16; ++f) {
    uint16_t* o = bf + f * Kp;
    if (n0 + f >= N) {
      std::memset(o, 0, size_t(Kp) * 2);
      continue;
    }
    float* r = rows + f * Kp;
    dequantize_wrow(w + size_t(n0 + f) * rb, wt, r, K);
    for (int64_t k = K; k < Kp; ++k) r[k] = 0.0f;
#ifdef KVB_QBF16_PORTABLE
    for (int64_t k = 0; k < Kp; ++k) o[k] = f32_to_bf16(r[k]);
#else
    for (int64_t k = 0; k < Kp; k += 16) {
      const __m256bh h = _mm512_cvtneps_pbh(_mm512_loadu_ps(r + k));
      std::memcpy(o + k, &h, 32);
    }
#endif
  }
  // The transpose: word kp of row f is the u32 at bf + f * Kp + 2 kp.
#ifdef KVB_QBF16_PORTABLE
  for (int64_t kp = 0; kp < Kp / 2; ++kp)
    for (int f = 0; f < 16; ++f) std::memcpy(panel + 64 * kp + 4 * f, bf + f * Kp + 2 * kp, 4);
#else
  const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                         _mm512_set1_epi32(int32_t(Kp / 2)));
  const int* base = reinterpret_cast<const int*>(bf);
  for (int64_t kp = 0; kp < Kp / 2; ++kp)
    _mm512_store_si512(panel + 64 * kp, _mm512_i32gather_epi32(idx, base + kp, 4));
#endif
}

// y[M, N] = x[M, K] . w^T (+ bias) for quantized w (any M; tokens are padded to 32 rows).
// Work items: (pair of panels, token block); a thread dequantizes only when its item is of
// another pair than its last one in this call.
inline void matmul_qbf16(const float* x, const void* wv, WType wt, const float* bias, float* y, int64_t M,
                         int64_t N, int64_t K) {
  const uint8_t* w = static_cast<const uint8_t*>(wv);
  const ActBf16 a = act_to_bf16(x, M, K);
  const int64_t Kp = a.Kp;
  const int64_t n_panels = (N + 15) / 16;
  const int64_t panel_bytes = pairs_panel_bytes(K);
#ifdef KVB_MM_AMX
  const Split s = split_work(M, n_panels, 32);
#else
  const Split s = split_work(M, n_panels, kMR);
#endif
  const bool parallel = s.n_pairs * s.n_mb > 1 && M * N * K >= (int64_t(1) << 17);
  static std::atomic<uint64_t> next_call{1};
  const uint64_t call = next_call.fetch_add(1, std::memory_order_relaxed);
  parallel_for_dynamic(s.n_pairs * s.n_mb, parallel, [&](int64_t item, int) {
    // Per thread: the pair buffer (2 panels, 64-byte aligned) and the dequantization scratch.
    thread_local std::vector<uint8_t> store;
    thread_local std::vector<float> rows;
    thread_local std::vector<uint16_t> bf;
    thread_local uint64_t packed_call = 0;
    thread_local int64_t packed_pair = -1;
    const size_t need = size_t(2 * panel_bytes) + 64;
    if (store.size() < need) store.resize(need);
    if (int64_t(rows.size()) < 16 * Kp) rows.resize(size_t(16 * Kp));
    if (int64_t(bf.size()) < 16 * Kp) bf.resize(size_t(16 * Kp));
    uint8_t* buf = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(store.data()) + 63) & ~uintptr_t(63));
    const int64_t pp = item / s.n_mb, b = item % s.n_mb;
    const int64_t n0 = pp * 32;
    if (packed_call != call || packed_pair != pp) {
      pack_pairs_panel(w, wt, N, K, Kp, n0, rows.data(), bf.data(), buf);
      pack_pairs_panel(w, wt, N, K, Kp, n0 + 16, rows.data(), bf.data(), buf + panel_bytes);
      packed_call = call;
      packed_pair = pp;
    }
    const int64_t m0 = b * s.mb, m1 = std::min(M, m0 + s.mb);
    const int64_t nv0 = std::min<int64_t>(16, N - n0), nv1 = std::min<int64_t>(16, N - n0 - 16);
    const float* bb = bias ? bias + n0 : nullptr;
#ifdef KVB_MM_AMX
    KVB_AMX_THREAD_INIT();
    load_tile_config(gemm_tile_config());
    amx_item(a, m0, m1, M, buf, buf + panel_bytes, y + n0, N, bb, nv0, nv1);
    _tile_release();
#else
    bf16_item(a, m0, m1, (K + 1) / 2, buf, buf + panel_bytes, y + n0, N, bb, nv0, nv1);
#endif
  });
}

}  // namespace kvboost::kernels::cpu::KVB_MM512_NS
