// CPU feature detection and the one place where the kernel ISA is chosen.
#include <cpuid.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include "kvboost/common.h"

namespace kvboost {

namespace {

uint64_t xgetbv0() {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  bool osxsave = c & (1u << 27);
  bool fma = c & (1u << 12);
  bool f16c = c & (1u << 29);
  if (!osxsave) return f;
  uint64_t xcr0 = xgetbv0();
  bool ymm_os = (xcr0 & 0x6) == 0x6;
  bool zmm_os = (xcr0 & 0xe6) == 0xe6;
  bool amx_os = (xcr0 & (3ull << 17)) == (3ull << 17);
  __cpuid_count(7, 0, a, b, c, d);
  f.avx2 = ymm_os && (b & (1u << 5));
  f.fma = ymm_os && fma;
  f.f16c = ymm_os && f16c;
  f.avx512f = zmm_os && (b & (1u << 16));
  f.avx512bw = zmm_os && (b & (1u << 30));
  f.avx512vl = zmm_os && (b & (1u << 31));
  f.avx512vnni = zmm_os && (c & (1u << 11));
  f.amx_bf16 = amx_os && (d & (1u << 22));
  f.amx_tile = amx_os && (d & (1u << 24));
  f.amx_int8 = amx_os && (d & (1u << 25));
  unsigned a1, b1, c1, d1;
  __cpuid_count(7, 1, a1, b1, c1, d1);
  f.avx512bf16 = zmm_os && (a1 & (1u << 5));
  return f;
}

Isa hardware_isa(const CpuFeatures& f) {
  if (f.avx512f && f.avx512bw && f.avx512vl && f.fma && f.f16c) return Isa::Avx512;
  if (f.avx2 && f.fma && f.f16c) return Isa::Avx2;
  return Isa::Scalar;
}

Isa initial_isa() {
  Isa hw = hardware_isa(cpu_features());
  const char* env = std::getenv("KVBOOST_ISA");
  if (!env || !*env) return hw;
  std::string s(env);
  Isa want = hw;
  if (s == "scalar") want = Isa::Scalar;
  else if (s == "avx2") want = Isa::Avx2;
  else if (s == "avx512") want = Isa::Avx512;
  return want < hw ? want : hw;
}

std::atomic<int> g_isa{-1};

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

Isa active_isa() {
  int v = g_isa.load(std::memory_order_relaxed);
  if (v < 0) {
    v = int(initial_isa());
    g_isa.store(v, std::memory_order_relaxed);
  }
  return Isa(v);
}

void set_active_isa(Isa isa) {
  Isa hw = hardware_isa(cpu_features());
  g_isa.store(int(isa < hw ? isa : hw), std::memory_order_relaxed);
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
  }
  return "?";
}

}  // namespace kvboost
