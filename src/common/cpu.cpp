// CPU feature detection and the one place where the kernel ISA is chosen.
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

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
  if (!__get_cpuid(0, &a, &b, &c, &d)) return f;
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
  f.avxvnni = ymm_os && (a1 & (1u << 4));
  return f;
}

Isa hardware_isa(const CpuFeatures& f) {
  if (!(f.avx2 && f.fma && f.f16c)) return Isa::Scalar;
  if (!(f.avx512f && f.avx512bw && f.avx512vl)) return Isa::Avx2;
  if (!f.avx512bf16) return Isa::Avx512;
  // XCR0 bits 17/18 (checked in detect) say the OS supports the tile state; Linux also wants the
  // process to ask for it, and may refuse.
  if (!(f.amx_tile && f.amx_bf16) || !amx_request_permission()) return Isa::Avx512Bf16;
  return Isa::AmxBf16;
}

Isa initial_isa() {
  Isa hw = hardware_isa(cpu_features());
  const char* env = std::getenv("KVBOOST_ISA");
  if (!env || !*env) return hw;
  Isa want = hw;  // an unknown value leaves the best path on
  parse_isa(env, want);
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
    case Isa::Avx512Bf16: return "avx512bf16";
    case Isa::AmxBf16: return "amx";
  }
  return "?";
}

bool parse_isa(std::string_view s, Isa& out) {
  if (s == "scalar") out = Isa::Scalar;
  else if (s == "avx2" || s == "avxvnni" || s == "avx-vnni" || s == "avx_vnni") out = Isa::Avx2;
  else if (s == "avx512" || s == "avx512vnni" || s == "avx512-vnni" || s == "avx512_vnni") out = Isa::Avx512;
  else if (s == "avx512bf16" || s == "avx512-bf16" || s == "avx512_bf16") out = Isa::Avx512Bf16;
  else if (s == "amx" || s == "amx-bf16" || s == "amxbf16" || s == "amx_bf16" || s == "amxint8" ||
           s == "amx-int8" || s == "amx_int8")
    out = Isa::AmxBf16;
  else return false;
  return true;
}

bool amx_request_permission() {
  // Linux 5.16+: arch_prctl(ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18).
  thread_local int state = -1;  // -1 not asked yet on this thread, 0 refused, 1 granted
  if (state < 0) state = syscall(SYS_arch_prctl, 0x1023, 18) == 0 ? 1 : 0;
  return state == 1;
}

}  // namespace kvboost
