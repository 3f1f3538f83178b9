// kvboost/common.h — errors, mapped files, number formats, threads, CPU features.
// The bottom layer: every other module may use it; it uses nothing of ours.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

namespace kvboost {

// Library errors are exceptions of this type. The message names the file, field or value at
// fault; interfaces (CLI, server, Python) convert it at their boundary.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Concatenates its arguments (anything streamable) into an Error and throws it.
template <typename... Args>
[[noreturn]] void fail(const Args&... args);

// Reads a whole file; throws Error naming the path when it cannot.
std::string read_file(const std::string& path);
bool file_exists(const std::string& path);
std::string path_join(const std::string& dir, const std::string& name);

// A read-only memory map of a whole file. Move-only; unmaps on destruction.
class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const std::string& path);
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void reset();
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// bf16 / f16 <-> f32. bf16 is the top half of an f32; rounding to bf16 is round-to-nearest-even
// (as torch does), NaN stays NaN.
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);  // round-to-nearest-even, overflow to inf

// CPU features, detected once. KVBOOST_ISA (scalar|avx2|avx512|avx512bf16|amx) caps what is
// used, so tests can run every kernel path on one machine. Each level implies the ones below it:
//   Avx2       AVX2 + FMA + F16C
//   Avx512     + AVX512F/BW/VL (f32-FMA kernels; bf16 weights widened by a shift)
//   Avx512Bf16 + AVX512_BF16 (vdpbf16ps: bf16 activations x bf16 weights, f32 sums)
//   AmxBf16    + AMX-TILE + AMX-BF16, with the OS granting the tile state (arch_prctl)
// The bf16 levels round matmul activations to bf16 (kernels.h, pack_layout_for).
enum class Isa { Scalar = 0, Avx2 = 1, Avx512 = 2, Avx512Bf16 = 3, AmxBf16 = 4 };
struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512bf16 = false, avx512vnni = false;
  bool amx_tile = false, amx_bf16 = false, amx_int8 = false;
  bool avxvnni = false;  // AVX-VNNI (VEX vpdpbusd), CPUID.(7,1):EAX[4]
};
const CpuFeatures& cpu_features();
Isa active_isa();           // the best ISA allowed by the hardware and KVBOOST_ISA
void set_active_isa(Isa);   // tests: force a path (clamped to what the CPU supports)
const char* isa_name(Isa);   // the KVBOOST_ISA spelling: "scalar", ..., "avx512bf16", "amx"
// Parses a KVBOOST_ISA / --isa value (also "amx-bf16", "amxbf16", "avx512-bf16"); false if unknown.
bool parse_isa(std::string_view s, Isa& out);
// Asks Linux for the AMX tile-data state (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)),
// which must be granted before the first tile instruction or it faults. The grant is per process;
// the call is idempotent and cheap after the first (cached per thread), so AMX kernels make it
// on every thread that runs tiles. False where the kernel refuses (or is older than 5.16).
bool amx_request_permission();

// Threads: kernels parallelise over a persistent pool of num_threads() - 1 worker threads plus
// the calling thread (thread_pool.cpp). The default size is OpenMP's (OMP_NUM_THREADS, else the
// cores); set_num_threads resizes the pool and OpenMP's team (still used outside the kernels).
int num_threads();
void set_num_threads(int n);
// A pool of its own for some threads (tensor parallelism's ranks, each on a share of the cores):
// on a thread bound to a team (bind_thread_team), num_threads() is the team's size and
// parallel_run runs on the team's workers instead of the process's pool. A team of n holds n - 1
// workers; it must outlive every thread's binding to it.
class ThreadTeam {
 public:
  explicit ThreadTeam(int n);
  ~ThreadTeam();
  ThreadTeam(const ThreadTeam&) = delete;
  ThreadTeam& operator=(const ThreadTeam&) = delete;
  int size() const;
  void* pool() const { return pool_; }

 private:
  void* pool_ = nullptr;  // thread_pool.cpp's Pool
};
// This thread's kernels use `team` (nullptr: the process's pool again); returns the previous one.
ThreadTeam* bind_thread_team(ThreadTeam* team);

// Runs fn(ctx, tid, n) for tid = 0 .. n - 1 on n = clamp(n_threads, 1, num_threads()) threads
// (the caller runs tid 0) and returns when every one has returned. Workers spin briefly after a
// task (KVBOOST_SPIN_US, default 200 µs) so that back-to-back kernels do not pay a wake-up, then
// sleep on a futex. Nested calls (from inside a task) and calls made while another thread holds
// the pool run fn(ctx, 0, 1) inline, so fn must be correct for any n >= 1. fn must not throw.
void parallel_run(int n_threads, void (*fn)(void* ctx, int tid, int n), void* ctx);
template <typename F>
void parallel_run(int n_threads, F&& f) {  // f(int tid, int n)
  using Fn = std::remove_reference_t<F>;
  parallel_run(n_threads, [](void* c, int tid, int n) { (*static_cast<Fn*>(c))(tid, n); },
               const_cast<void*>(static_cast<const void*>(&f)));
}
// Splits [0, n) into one contiguous range per thread, boundaries multiples of `align` (so that
// threads never write the same cache line of an output: align = 16 floats), sizes as equal as
// that allows, and calls f(begin, end) on each (empty ranges are skipped). Serial when n is
// below `min_parallel`.
template <typename F>
void parallel_for(int64_t n, int64_t align, int64_t min_parallel, F&& f) {
  const int nt = n >= min_parallel ? num_threads() : 1;
  if (nt <= 1 || n <= align) {
    if (n > 0) f(int64_t(0), n);
    return;
  }
  parallel_run(nt, [&](int tid, int nth) {
    const int64_t units = (n + align - 1) / align;
    const int64_t b = units * tid / nth * align, e = std::min(n, units * (tid + 1) / nth * align);
    if (b < e) f(b, e);
  });
}

// Monotonic wall clock in milliseconds.
double now_ms();

// Calls f(i, tid) for every i in [0, n), handing out indices one at a time from a shared counter
// (for items of uneven cost); serial when !parallel. tid < num_threads() indexes per-thread
// scratch.
template <typename F>
void parallel_for_dynamic(int64_t n, bool parallel, F&& f) {
  if (!parallel || n <= 1 || num_threads() <= 1) {
    for (int64_t i = 0; i < n; ++i) f(i, 0);
    return;
  }
  alignas(64) std::atomic<int64_t> next{0};
  parallel_run(int(std::min<int64_t>(n, num_threads())), [&](int tid, int) {
    for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) f(i, tid);
  });
}

// ---- implementation of fail() ----
namespace detail {
void append_arg(std::string& s, std::string_view v);
void append_arg(std::string& s, const char* v);
void append_arg(std::string& s, const std::string& v);
void append_arg(std::string& s, char v);
void append_arg(std::string& s, bool v);
void append_arg(std::string& s, long long v);
void append_arg(std::string& s, unsigned long long v);
void append_arg(std::string& s, double v);
template <typename T>
void append_any(std::string& s, const T& v) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool> && !std::is_same_v<T, char>) {
    if constexpr (std::is_signed_v<T>) append_arg(s, static_cast<long long>(v));
    else append_arg(s, static_cast<unsigned long long>(v));
  } else if constexpr (std::is_floating_point_v<T>) {
    append_arg(s, static_cast<double>(v));
  } else {
    append_arg(s, v);
  }
}
}  // namespace detail

template <typename... Args>
[[noreturn]] void fail(const Args&... args) {
  std::string s;
  (detail::append_any(s, args), ...);
  throw Error(s);
}

}  // namespace kvboost
