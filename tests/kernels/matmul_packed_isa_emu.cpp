// Test-only build of the packed-weight GEMMs above AVX2 (src/kernels/cpu/
// matmul_packed_avx512_impl.h, the very source the native matmul_packed_avx512*.cpp and
// matmul_packed_amx.cpp compile) on SIMDe's portable AVX-512 (libsimde-dev, native aliases; an
// AVX2+FMA+F16C build emulates each 512-bit operation, vdpbf16ps included) and on amx_emu.h for
// the tile instructions, in its own namespace (mm512_emu) so that the linker never merges it
// with a native build.
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

#include "amx_emu.h"

#define KVB_MM512_NS mm512_emu
#define KVB_MM_BF16 1
#define KVB_MM_AMX 1
#define KVB_AMX_THREAD_INIT() (void)0
#include "cpu/matmul_packed_avx512_impl.h"
#include "matmul_packed_isa_emu.h"

namespace kvboost::kernel_test {

namespace emu = kernels::cpu::mm512_emu;

void matmul_packed_avx512_emu(const float* x, const kernels::PackedWeight& w, const float* bias,
                              float* y, int64_t M) {
  emu::run_panel16(x, w, bias, y, M);
}

void matmul_packed_avx512bf16_emu(const float* x, const kernels::PackedWeight& w,
                                  const float* bias, float* y, int64_t M) {
  emu::run_bf16(x, w, bias, y, M);
}

void matmul_packed_amx_emu(const float* x, const kernels::PackedWeight& w, const float* bias,
                           float* y, int64_t M) {
  emu::run_amx(x, w, bias, y, M);
}

void matmul_packed_amx_emu_broken(const float* x, const kernels::PackedWeight& w,
                                  const float* bias, float* y, int64_t M, AmxBreak how) {
  emu::TileConfig c = emu::gemm_tile_config();
  switch (how) {
    case AmxBreak::BRows8: c.rows[6] = c.rows[7] = 8; break;
    case AmxBreak::ARowsC8:
      for (int t : {0, 1, 2, 3, 4, 5}) c.rows[t] = 8;
      break;
    case AmxBreak::Palette2: c.palette_id = 2; break;
  }
  emu::run_amx_cfg(x, w, bias, y, M, c);
}

}  // namespace kvboost::kernel_test
