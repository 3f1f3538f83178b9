// The AVX-512, AVX512-BF16 and AMX-BF16 packed-weight GEMMs (src/kernels/cpu/
// matmul_packed_avx512_impl.h) built on SIMDe's portable AVX-512 and the scalar AMX emulator
// (amx_emu.h) by matmul_packed_isa_emu.cpp, with matmul_packed's contract. Their code needs
// AVX2+FMA+F16C (SIMDe's 256-bit halves run natively): call them only where cpu_features() has them.
#pragma once
#include <cstdint>

#include "kvboost/kernels.h"

namespace kvboost::kernel_test {

// (a) Panel16 weights (F32, F16, BF16), f32 FMA.
void matmul_packed_avx512_emu(const float* x, const kernels::PackedWeight& w, const float* bias,
                              float* y, int64_t M);
// (b) Bf16Pairs weights, vdpbf16ps, bf16 activations.
void matmul_packed_avx512bf16_emu(const float* x, const kernels::PackedWeight& w,
                                  const float* bias, float* y, int64_t M);
// (c) Bf16Pairs weights, AMX tiles, bf16 activations.
void matmul_packed_amx_emu(const float* x, const kernels::PackedWeight& w, const float* bias,
                           float* y, int64_t M);

// (c) with a deliberately wrong tile configuration, to show that the tests catch one:
enum class AmxBreak {
  BRows8,    // B tiles (tmm6, tmm7) of 8 rows: TDPBF16PS's shape check fails (#UD)
  ARowsC8,   // A and C tiles of 8 rows: consistent shapes, half of each 16-token tile computed
  Palette2,  // palette_id 2: LDTILECFG #GP
};
void matmul_packed_amx_emu_broken(const float* x, const kernels::PackedWeight& w,
                                  const float* bias, float* y, int64_t M, AmxBreak how);

}  // namespace kvboost::kernel_test
