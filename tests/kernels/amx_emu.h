// A scalar emulator of the AMX intrinsics the AMX-BF16 GEMM uses (src/kernels/cpu/
// matmul_packed_avx512_impl.h), so that the same kernel source runs on CPUs without AMX:
// _tile_loadconfig, _tile_release, _tile_zero, _tile_loadd, _tile_stored, _tile_dpbf16ps, and
// _tile_dpbusd / _tile_dpbsud for the AMX-INT8 quantized GEMM (matmul_qgemm_avx512_impl.h).
// Semantics from the Intel SDM (LDTILECFG, TILELOADD, TILESTORED, TILEZERO, TDPBF16PS), per
// thread as the tile state is:
//   - LDTILECFG reads 64 bytes: palette_id (byte 0), start_row (1), bytes 2..15 reserved (0),
//     colsb[16] u16 (bytes 16..47), rows[16] u8 (48..63). Palette 0 releases the tiles;
//     palette 1 has 8 tiles of at most 16 rows x 64 bytes, and tiles 8..15 must be 0. A bad
//     palette, non-zero reserved bytes or an oversize tile is #GP.
//   - Any tile instruction while no palette-1 configuration is loaded is #UD.
//   - TILELOADD loads rows[t] rows of colsb[t] bytes, row r at base + r * stride; the rest of the
//     tile's 16 x 64 bytes reads as zero. TILESTORED writes exactly rows[t] x colsb[t] bytes.
//   - TDPBF16PS dst, a, b: #UD unless a.colsb / 4 == b.rows, dst.colsb == b.colsb,
//     dst.rows == a.rows (and colsb multiples of 4). Then for m < dst.rows, k < a.colsb / 4,
//     n < dst.colsb / 4: dst[m][n] += a[m].bf16[2k] * b[k].bf16[2n], then += a[m].bf16[2k+1] *
//     b[k].bf16[2n+1], each in f32 (round to nearest even; the products of two bf16 are exact),
//     bf16 denormal inputs read as zero (DAZ), f32 results flushed to zero (FTZ). The hardware's
//     order of the additions may differ: results agree to f32 rounding, not bit for bit.
//   - TDPBUSD dst, a, b: the same shape checks; then for m, k < a.colsb / 4, n < dst.colsb / 4:
//     dst[m][n] (int32, wrapping) += sum over i < 4 of a[m].u8[4k + i] * b[k].s8[4n + i].
// A fault prints "AMX emulator: #UD ..." or "#GP ..." and aborts (the hardware raises SIGILL /
// SIGSEGV), so death tests can check that a broken kernel is caught.
//
// keep_config_bytes models GCC 12's _tile_loadconfig, whose asm tells the compiler that only
// the first 8 bytes of the configuration are read, so stores to the rest may be dropped: with
// keep_config_bytes = 8 the emulator sees zeros past byte 8 (what such a build hands LDTILECFG).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace kvboost::amx_emu {

inline int keep_config_bytes = 64;  // tests: < 64 simulates dropped configuration stores

struct TileState {
  bool configured = false;
  uint16_t colsb[8] = {};
  uint8_t rows[8] = {};
  alignas(64) uint8_t data[8][16][64] = {};
};
inline thread_local TileState g_tiles;

[[noreturn]] inline void fault(const char* kind, const char* what, int t) {
  std::fprintf(stderr, "AMX emulator: %s %s (tile %d)\n", kind, what, t);
  std::fflush(stderr);
  std::abort();
}

inline void loadconfig(const void* mem) {
  uint8_t c[64] = {};
  std::memcpy(c, mem, size_t(keep_config_bytes));
  TileState& s = g_tiles;
  if (c[0] == 0) {  // palette 0: INIT, tiles unconfigured
    s = TileState{};
    return;
  }
  if (c[0] != 1) fault("#GP", "LDTILECFG: unsupported palette", c[0]);
  for (int i = 2; i < 16; ++i)
    if (c[i]) fault("#GP", "LDTILECFG: reserved byte not zero", i);
  for (int t = 0; t < 16; ++t) {
    uint16_t colsb;
    std::memcpy(&colsb, c + 16 + 2 * t, 2);
    const uint8_t rows = c[48 + t];
    if (t >= 8) {
      if (colsb || rows) fault("#GP", "LDTILECFG: palette 1 has 8 tiles, a higher one is set", t);
      continue;
    }
    if (colsb > 64 || rows > 16) fault("#GP", "LDTILECFG: tile larger than 16 rows x 64 bytes", t);
    s.colsb[t] = colsb;
    s.rows[t] = rows;
  }
  s.configured = true;
  std::memset(s.data, 0, sizeof s.data);
}

inline void release() { g_tiles = TileState{}; }

inline TileState& use(int t, const char* insn) {
  TileState& s = g_tiles;
  if (!s.configured) fault("#UD", insn, t);
  if (t < 0 || t >= 8) fault("#UD", insn, t);
  return s;
}

inline void zero(int t) { std::memset(use(t, "TILEZERO: tiles not configured").data[t], 0, 16 * 64); }

inline void loadd(int t, const void* base, long stride) {
  TileState& s = use(t, "TILELOADD: tiles not configured");
  std::memset(s.data[t], 0, 16 * 64);
  const uint8_t* b = static_cast<const uint8_t*>(base);
  for (int r = 0; r < s.rows[t]; ++r) std::memcpy(s.data[t][r], b + r * stride, s.colsb[t]);
}

inline void stored(int t, void* base, long stride) {
  TileState& s = use(t, "TILESTORED: tiles not configured");
  uint8_t* b = static_cast<uint8_t*>(base);
  for (int r = 0; r < s.rows[t]; ++r) std::memcpy(b + r * stride, s.data[t][r], s.colsb[t]);
}

inline float bf16_daz(uint16_t h) {
  if ((h & 0x7f80) == 0) h &= 0x8000;  // denormal (or zero) -> signed zero
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float ftz(float f) { return std::fpclassify(f) == FP_SUBNORMAL ? std::copysign(0.0f, f) : f; }

inline void dpbf16ps(int dst, int a, int b) {
  TileState& s = use(dst, "TDPBF16PS: tiles not configured");
  use(a, "TDPBF16PS: tiles not configured");
  use(b, "TDPBF16PS: tiles not configured");
  if (s.colsb[a] % 4 || s.colsb[b] % 4 || s.colsb[dst] % 4)
    fault("#UD", "TDPBF16PS: colsb not a multiple of 4", dst);
  if (s.colsb[a] / 4 != s.rows[b]) fault("#UD", "TDPBF16PS: a.colsb / 4 != b.rows", a);
  if (s.colsb[dst] != s.colsb[b]) fault("#UD", "TDPBF16PS: dst.colsb != b.colsb", dst);
  if (s.rows[dst] != s.rows[a]) fault("#UD", "TDPBF16PS: dst.rows != a.rows", dst);
  for (int m = 0; m < s.rows[dst]; ++m) {
    float c[16];
    std::memcpy(c, s.data[dst][m], 64);
    for (int k = 0; k < s.colsb[a] / 4; ++k) {
      uint16_t av[2];
      std::memcpy(av, s.data[a][m] + 4 * k, 4);
      for (int n = 0; n < s.colsb[dst] / 4; ++n) {
        uint16_t bv[2];
        std::memcpy(bv, s.data[b][k] + 4 * n, 4);
        c[n] = ftz(c[n] + bf16_daz(av[0]) * bf16_daz(bv[0]));
        c[n] = ftz(c[n] + bf16_daz(av[1]) * bf16_daz(bv[1]));
      }
    }
    std::memcpy(s.data[dst][m], c, 64);
  }
}

// TDPBUSD (a unsigned, b signed) and TDPBSUD (a signed, b unsigned).
template <bool A_SIGNED>
inline void dpb_int8(int dst, int a, int b, const char* what) {
  TileState& s = use(dst, what);
  use(a, what);
  use(b, what);
  const std::string op = A_SIGNED ? "TDPBSUD" : "TDPBUSD";
  if (s.colsb[a] % 4 || s.colsb[b] % 4 || s.colsb[dst] % 4) fault("#UD", (op + ": colsb not a multiple of 4").c_str(), dst);
  if (s.colsb[a] / 4 != s.rows[b]) fault("#UD", (op + ": a.colsb / 4 != b.rows").c_str(), a);
  if (s.colsb[dst] != s.colsb[b]) fault("#UD", (op + ": dst.colsb != b.colsb").c_str(), dst);
  if (s.rows[dst] != s.rows[a]) fault("#UD", (op + ": dst.rows != a.rows").c_str(), dst);
  for (int m = 0; m < s.rows[dst]; ++m) {
    int32_t c[16];
    std::memcpy(c, s.data[dst][m], 64);
    for (int k = 0; k < s.colsb[a] / 4; ++k)
      for (int n = 0; n < s.colsb[dst] / 4; ++n) {
        int32_t sum = 0;
        for (int i = 0; i < 4; ++i) {
          const uint8_t av = s.data[a][m][4 * k + i], bv = s.data[b][k][4 * n + i];
          sum += A_SIGNED ? int32_t(int8_t(av)) * int32_t(bv) : int32_t(av) * int32_t(int8_t(bv));
        }
        c[n] = int32_t(uint32_t(c[n]) + uint32_t(sum));
      }
    std::memcpy(s.data[dst][m], c, 64);
  }
}
inline void dpbusd(int dst, int a, int b) { dpb_int8<false>(dst, a, b, "TDPBUSD: tiles not configured"); }
inline void dpbsud(int dst, int a, int b) { dpb_int8<true>(dst, a, b, "TDPBSUD: tiles not configured"); }

}  // namespace kvboost::amx_emu

// The intrinsics' names, as <immintrin.h> spells them (tile numbers are plain ints here). GCC's
// <immintrin.h> (which SIMDe includes) defines some as macros and the others as functions: the
// macros below replace both.
#undef _tile_loadconfig
#undef _tile_release
#undef _tile_zero
#undef _tile_loadd
#undef _tile_stored
#undef _tile_dpbf16ps
#undef _tile_dpbusd
#undef _tile_dpbsud
#define _tile_loadconfig(mem) ::kvboost::amx_emu::loadconfig(mem)
#define _tile_release() ::kvboost::amx_emu::release()
#define _tile_zero(t) ::kvboost::amx_emu::zero(t)
#define _tile_loadd(t, base, stride) ::kvboost::amx_emu::loadd((t), (base), long(stride))
#define _tile_stored(t, base, stride) ::kvboost::amx_emu::stored((t), (base), long(stride))
#define _tile_dpbf16ps(dst, a, b) ::kvboost::amx_emu::dpbf16ps((dst), (a), (b))
#define _tile_dpbusd(dst, a, b) ::kvboost::amx_emu::dpbusd((dst), (a), (b))
#define _tile_dpbsud(dst, a, b) ::kvboost::amx_emu::dpbsud((dst), (a), (b))
