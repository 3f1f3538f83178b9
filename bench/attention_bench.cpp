// attention_bench: the paged FlashAttention-2 kernel (kernels::paged_attention) against naive
// attention, at contexts 512 .. 16K, for prefill of the whole context (n_q = n_kv = L) and for
// one decode step (n_q = 1 at position L - 1). Shape: Qwen2.5-0.5B (14 heads, 2 kv heads,
// head_dim 64), KV paged in blocks of 16 tokens through a shuffled block table.
//
// Kernels compared:
//   flash       kernels::paged_attention: key tiles through an online softmax, O(tile) memory.
//   contiguous  kernels::attention, the engine's existing kernel over contiguous K/V: one score
//               row of L floats per thread (scratch), i.e. O(threads × L) extra memory.
//   naive       the textbook O(L^2)-memory attention: for one head at a time, materialise the full
//               [n_q, L] score matrix (masked entries written as -inf), softmax it in place, then
//               multiply by V. Same FLOPs as the others (dot products only over the causal
//               triangle); what differs is the memory and its traffic. Row helpers are compiled for
//               Haswell (AVX2+FMA) and baseline, picked at load time, so the ISA is not the gap.
//
// Time: median over repetitions; a cell's first run is a warm-up when it is short, and the
// number of repetitions shrinks so that each cell costs a few seconds at most.
// Memory: "measured" is the growth of the peak resident set during the cell's first call:
// /proc/self/clear_refs ("5") resets VmHWM to the current RSS, then VmHWM - VmRSS(before).
// Memory touched before (thread stacks, earlier cells) does not show, so small per-thread
// buffers read ~0; "analytic" is the kernel's extra memory computed from its definition.
//
// At 16K the two slow prefill baselines take ~0.5-1.5 minutes each on two cores; to keep the
// whole run under ~2 minutes they are skipped when 4 x their 8K time (work is quadratic in L)
// exceeds 20 s, and that extrapolation is printed instead. --full runs them anyway.
//
// Usage: attention_bench [max_context] [--full]   (default 16384)
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kvboost/common.h"
#include "kvboost/kernels.h"

using namespace kvboost;

namespace {

constexpr int64_t kHeads = 14, kKvHeads = 2, kHeadDim = 64, kBlock = 16;

// ---- naive O(L^2)-memory attention ----

__attribute__((target_clones("arch=haswell", "default")))
void naive_scores_row(const float* qi, const float* k, int64_t kv_stride, int64_t n_vis,
                      int64_t n_keys, float scale, float* srow) {
  for (int64_t j = 0; j < n_vis; ++j) {
    const float* kj = k + j * kv_stride;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t d = 0; d < kHeadDim; ++d) s += qi[d] * kj[d];
    srow[j] = s * scale;
  }
  for (int64_t j = n_vis; j < n_keys; ++j) srow[j] = -std::numeric_limits<float>::infinity();
}

void naive_softmax_row(float* s, int64_t n) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) mx = std::max(mx, s[j]);
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) sum += (s[j] = std::exp(s[j] - mx));
  const float inv = 1.0f / sum;
  for (int64_t j = 0; j < n; ++j) s[j] *= inv;
}

__attribute__((target_clones("arch=haswell", "default")))
void naive_pv_row(const float* p, const float* v, int64_t kv_stride, int64_t n_vis, float* o) {
  float acc[kHeadDim] = {};
  for (int64_t j = 0; j < n_vis; ++j) {
    const float* vj = v + j * kv_stride;
    const float pj = p[j];
#pragma omp simd
    for (int64_t d = 0; d < kHeadDim; ++d) acc[d] += pj * vj[d];
  }
  std::memcpy(o, acc, sizeof acc);
}

// q: [n_q, kHeads, kHeadDim]; k, v: [L, kKvHeads, kHeadDim] contiguous; causal, no window.
void naive_attention(const float* q, const float* k, const float* v, float* out, int64_t n_q,
                     int64_t q_pos0, int64_t L, float scale) {
  float* S = static_cast<float*>(std::malloc(size_t(n_q) * size_t(L) * sizeof(float)));
  const int64_t group = kHeads / kKvHeads, kv_stride = kKvHeads * kHeadDim;
  for (int64_t h = 0; h < kHeads; ++h) {
    const float* kh = k + (h / group) * kHeadDim;
    const float* vh = v + (h / group) * kHeadDim;
#pragma omp parallel for schedule(dynamic, 16)
    for (int64_t i = 0; i < n_q; ++i)
      naive_scores_row(q + (i * kHeads + h) * kHeadDim, kh, kv_stride,
                       std::min(L, q_pos0 + i + 1), L, scale, S + i * L);
#pragma omp parallel for schedule(dynamic, 16)
    for (int64_t i = 0; i < n_q; ++i) naive_softmax_row(S + i * L, L);
#pragma omp parallel for schedule(dynamic, 16)
    for (int64_t i = 0; i < n_q; ++i)
      naive_pv_row(S + i * L, vh, kv_stride, std::min(L, q_pos0 + i + 1),
                   out + (i * kHeads + h) * kHeadDim);
  }
  std::free(S);
}

// ---- measurement helpers ----

long status_kb(const char* key) {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  long v = -1;
  const size_t n = std::strlen(key);
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, key, n) == 0 && line[n] == ':') v = std::atol(line + n + 1);
  std::fclose(f);
  return v;
}

bool reset_peak_rss() {
  FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (!f) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Result {
  double median_ms = 0;
  int reps = 0;
  long peak_kb = -1;  // measured growth of the peak RSS in the first call
};

// Runs fn once (measuring memory), then repeats it while the cell stays within budget_s.
Result measure(const std::function<void()>& fn, double budget_s, int max_reps) {
  Result r;
  const bool can_reset = reset_peak_rss();
  const long before = status_kb("VmRSS");
  double t = now_s();
  fn();
  const double first = now_s() - t;
  if (can_reset) r.peak_kb = std::max(0L, status_kb("VmHWM") - before);
  std::vector<double> times;
  if (first > 0.5) times.push_back(first);  // long enough to count; short ones were a warm-up
  const int more = first > 0 ? int(std::min<double>(max_reps, (budget_s - first) / first)) : max_reps;
  for (int i = 0; i < std::max(more, times.empty() ? 1 : 0); ++i) {
    t = now_s();
    fn();
    times.push_back(now_s() - t);
  }
  std::sort(times.begin(), times.end());
  r.median_ms = 1e3 * times[times.size() / 2];
  r.reps = int(times.size());
  return r;
}

std::string mem_str(double bytes) {
  char b[32];
  if (bytes < 0) return "n/a";
  if (bytes < 1024 * 1024) std::snprintf(b, sizeof b, "%.0f KiB", bytes / 1024);
  else if (bytes < 1024.0 * 1024 * 1024) std::snprintf(b, sizeof b, "%.1f MiB", bytes / (1024 * 1024));
  else std::snprintf(b, sizeof b, "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
  return b;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t max_ctx = 16384;
  bool full = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--full") == 0) full = true;
    else max_ctx = std::atoll(argv[i]);
  }
  const int threads = omp_get_max_threads();
  const float scale = 1.0f / std::sqrt(float(kHeadDim));
  std::printf("attention_bench: %d threads, ISA %s; %lld heads, %lld kv heads, head_dim %lld, "
              "block %lld (shuffled block table)\n",
              threads, isa_name(active_isa()), (long long)kHeads, (long long)kKvHeads,
              (long long)kHeadDim, (long long)kBlock);
  std::printf("time: median of reps; peak extra memory: measured = peak-RSS growth in the first "
              "call (VmHWM after clear_refs), analytic = from the algorithm\n\n");
  std::printf("%6s %-8s %-11s %4s %11s %8s %12s %12s %10s\n", "L", "phase", "kernel", "reps",
              "median ms", "x flash", "peak(meas)", "peak(anal)", "max|d|");

  // Extra memory per call by construction. flash: per thread a (32+1) x 64 score tile, an 8192-float
  // accumulator, m/l and 2 x 64 K/V pointers (flash_attention_impl.h), plus a 128 KiB split-K
  // workspace on the caller's stack when the call splits the context (decode).
  const double flash_thread_bytes = (33.0 * 64 + 8192 + 64) * 4 + 2 * 64 * 8;
  double contig16k_predicted = 0, naive16k_predicted = 0;  // seconds, 4 x the 8K prefill time
  const double skip_over_s = 20.0;

  for (int64_t L = 512; L <= max_ctx; L *= 2) {
    const int64_t row = kKvHeads * kHeadDim;
    std::mt19937_64 rng(static_cast<uint64_t>(L));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> k(size_t(L * row)), v(size_t(L * row)), q(size_t(L * kHeads * kHeadDim));
    for (auto* vec : {&k, &v, &q})
      for (auto& x : *vec) x = nd(rng);
    const int64_t n_blocks = (L + kBlock - 1) / kBlock;
    std::vector<int32_t> table(static_cast<size_t>(n_blocks));
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    std::vector<float> k_pool(size_t(n_blocks * kBlock * row)), v_pool(k_pool.size());
    for (int64_t t = 0; t < L; ++t) {
      const int64_t dst = (int64_t(table[t / kBlock]) * kBlock + t % kBlock) * row;
      std::copy_n(k.begin() + t * row, row, k_pool.begin() + dst);
      std::copy_n(v.begin() + t * row, row, v_pool.begin() + dst);
    }

    for (const bool prefill : {true, false}) {
      const int64_t n_q = prefill ? L : 1, pos0 = prefill ? 0 : L - 1;
      const float* qp = prefill ? q.data() : q.data() + (L - 1) * kHeads * kHeadDim;
      const size_t n_out = size_t(n_q * kHeads * kHeadDim);
      std::vector<float> o_flash(n_out), o_contig(n_out), o_naive(n_out);
      // Prefill cells get ~6 s each at most, decode cells are cheap.
      const double budget = prefill ? 6.0 : 1.0;
      const int max_reps = prefill ? 7 : 50;

      const Result rf = measure([&] {
        kernels::paged_attention(qp, k_pool.data(), v_pool.data(), table.data(), o_flash.data(),
                                 n_q, pos0, L, kBlock, kHeads, kKvHeads, kHeadDim, 0, scale);
      }, budget, max_reps);
      Result rc;
      const bool contig_skipped = prefill && L >= 16384 && !full && contig16k_predicted > skip_over_s;
      if (!contig_skipped) {
        rc = measure([&] {
          std::vector<float> scratch(size_t(threads) * size_t(L));
          kernels::attention(qp, k.data(), v.data(), o_contig.data(), n_q, pos0, L, kHeads, kKvHeads,
                             kHeadDim, 0, scale, scratch.data());
        }, budget, max_reps);
        if (prefill && L == 8192) contig16k_predicted = 4.0 * rc.median_ms / 1e3;
      }
      const double naive_bytes = double(n_q) * L * 4;
      Result rn;
      bool naive_skipped = false;
      if (prefill && L >= 16384 && !full && naive16k_predicted > skip_over_s) {
        naive_skipped = true;
      } else {
        rn = measure([&] { naive_attention(qp, k.data(), v.data(), o_naive.data(), n_q, pos0, L, scale); },
                     budget, max_reps);
        if (prefill && L == 8192) naive16k_predicted = 4.0 * rn.median_ms / 1e3;
      }

      const char* phase = prefill ? "prefill" : "decode";
      const double flash_anal = threads * flash_thread_bytes + (prefill ? 0 : 128.0 * 1024);
      std::printf("%6lld %-8s %-11s %4d %11.2f %8.2f %12s %12s %10s\n", (long long)L, phase,
                  "flash", rf.reps, rf.median_ms, 1.0, mem_str(rf.peak_kb * 1024.0).c_str(),
                  mem_str(flash_anal).c_str(), "-");
      char d[32];
      if (contig_skipped) {
        std::printf("%6lld %-8s %-11s %4s %11s %8s %12s %12s %10s  skipped (--full runs it): "
                    "extrapolated %.0f ms = 4 x 8K, x flash %.2f\n",
                    (long long)L, phase, "contiguous", "-", "-", "-", "-",
                    mem_str(double(threads) * L * 4).c_str(), "-", contig16k_predicted * 1e3,
                    contig16k_predicted * 1e3 / rf.median_ms);
      } else {
        std::snprintf(d, sizeof d, "%.1e", max_abs_diff(o_contig, o_flash));
        std::printf("%6lld %-8s %-11s %4d %11.2f %8.2f %12s %12s %10s\n", (long long)L, phase,
                    "contiguous", rc.reps, rc.median_ms, rc.median_ms / rf.median_ms,
                    mem_str(rc.peak_kb * 1024.0).c_str(), mem_str(double(threads) * L * 4).c_str(), d);
      }
      if (naive_skipped) {
        std::printf("%6lld %-8s %-11s %4s %11s %8s %12s %12s %10s  skipped (--full runs it): "
                    "extrapolated %.0f ms = 4 x 8K, x flash %.2f\n",
                    (long long)L, phase, "naive", "-", "-", "-", "-", mem_str(naive_bytes).c_str(),
                    "-", naive16k_predicted * 1e3, naive16k_predicted * 1e3 / rf.median_ms);
      } else {
        std::snprintf(d, sizeof d, "%.1e", max_abs_diff(o_naive, o_flash));
        std::printf("%6lld %-8s %-11s %4d %11.2f %8.2f %12s %12s %10s\n", (long long)L, phase,
                    "naive", rn.reps, rn.median_ms, rn.median_ms / rf.median_ms,
                    mem_str(rn.peak_kb * 1024.0).c_str(), mem_str(naive_bytes).c_str(), d);
      }
      std::fflush(stdout);
    }
  }
  std::printf("\nx flash: median time / flash median time. max|d|: largest |output - flash output|.\n");
  return 0;
}
