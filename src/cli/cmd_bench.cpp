// kvboost bench: performance measurements against this machine's roofline.
//
//   kvboost bench roofline              read bandwidth (1 thread, all threads), FMA peak, and the
//                                       peak GEMM GFLOP/s of each kernel path (scalar, avx2, ...)
//   kvboost bench logits --model DIR    logit error of each kernel path vs the scalar reference
//   kvboost bench model --model DIR     prefill tok/s at 128/512/2048-token prompts, decode tok/s
//                                       at context 128 and 2048, and prefill of 50 new tokens
//                                       after 1,550 cached ones, each as a fraction of the
//                                       roofline measured first in the same process
//
// Fractions: decode = bytes of weights read per token / time / read bandwidth (all threads);
// prefill = FLOPs / time / the active path's peak GEMM GFLOP/s. Times are medians over --runs.
// KVBOOST_ISA=scalar|avx2|avx512|avx512bf16|amx (or --isa) selects the kernel path, --threads the pool size.
//
// More bench subcommands hang off the command add_bench returns (see cli_util.h).
#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cli_util.h"
#include "kvboost/kernels.h"
#include "kvboost/runtime.h"

namespace kvboost::cli {

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// ---- roofline ----

// Sums floats [b, e) with 4 independent AVX2 accumulators: bound by the memory, not the adds.
__attribute__((target("avx2"))) float read_sum_avx2(const float* p, size_t b, size_t e) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = b;
  for (; i + 32 <= e; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
  }
  alignas(32) float t[8];
  _mm256_store_ps(t, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  float s = 0;
  for (float v : t) s += v;
  for (; i < e; ++i) s += p[i];
  return s;
}
float read_sum_scalar(const float* p, size_t b, size_t e) {
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  size_t i = b;
  for (; i + 4 <= e; i += 4) {
    s0 += p[i];
    s1 += p[i + 1];
    s2 += p[i + 2];
    s3 += p[i + 3];
  }
  for (; i < e; ++i) s0 += p[i];
  return s0 + s1 + s2 + s3;
}

// Sequential read bandwidth in GB/s (1e9 bytes/s) with n_threads threads, each reading an
// equal contiguous part of a buffer much larger than the last-level cache. Median of `reps`.
double read_bandwidth_gbs(int n_threads, size_t bytes, int reps) {
  const size_t n = bytes / sizeof(float);
  void* mem = std::aligned_alloc(2 << 20, bytes);
  if (!mem) fail("bench: cannot allocate ", bytes, " bytes");
  std::unique_ptr<void, decltype(&std::free)> hold(mem, &std::free);
  float* p = static_cast<float*>(mem);
  parallel_for(int64_t(n), 1 << 16, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) p[i] = 1.0f;
  });
  const bool avx2 = cpu_features().avx2;
  std::vector<double> gbs;
  for (int r = 0; r < reps + 1; ++r) {
    std::vector<float> sink(64 * 16);
    const double t0 = now_ms();
    parallel_run(n_threads, [&](int tid, int nt) {
      const size_t b = n * size_t(tid) / size_t(nt) / 8 * 8, e = n * size_t(tid + 1) / size_t(nt) / 8 * 8;
      sink[size_t(tid) * 16] = avx2 ? read_sum_avx2(p, b, e) : read_sum_scalar(p, b, e);
    });
    const double ms = now_ms() - t0;
    if (r > 0) gbs.push_back(double(bytes) / (ms * 1e6));  // first pass: warm-up
    if (sink[0] == 12345.0f) std::fprintf(stderr, " ");
  }
  return median(gbs);
}

// Peak FMA throughput (GFLOP/s) of all threads: 12 independent FMA chains per thread in
// registers, no memory. The hardware ceiling that the GEMM fractions could be set against.
__attribute__((target("avx2,fma"))) double fma_loop_avx2(int64_t iters) {
  __m256 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm256_set1_ps(float(i) * 1e-3f);
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < 12; ++i) a[i] = _mm256_fmadd_ps(a[i], m, c);
  __m256 s = a[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, a[i]);
  alignas(32) float t[8];
  _mm256_store_ps(t, s);
  return t[0];
}
double fma_peak_gflops(int reps) {
  if (!cpu_features().avx2 || !cpu_features().fma) return 0;
  const int64_t iters = 20'000'000;
  std::vector<double> g;
  for (int r = 0; r < reps + 1; ++r) {
    std::vector<double> sink(64);
    const double t0 = now_ms();
    int used = 1;
    parallel_run(num_threads(), [&](int tid, int nt) {
      sink[size_t(tid) * 8] = fma_loop_avx2(iters);
      if (tid == 0) used = nt;
    });
    const double ms = now_ms() - t0;
    if (r > 0) g.push_back(double(used) * double(iters) * 12 * 16 / (ms * 1e6));
  }
  return median(g);
}

// GEMM GFLOP/s of the active path at a prefill shape (M tokens x [N, K] bf16 weights), through
// matmul (the nn.Linear layout) and matmul_packed. Median of `reps` after a warm-up.
struct GemmPeak {
  double raw = 0, packed = 0;
  double best() const { return std::max(raw, packed); }
};
GemmPeak gemm_peak(int reps) {
  const bool scalar = active_isa() == Isa::Scalar;
  // The scalar reference is ~50x slower: a smaller problem keeps it to a second or so.
  const int64_t M = scalar ? 64 : 512, N = scalar ? 512 : 2048, K = scalar ? 512 : 896;
  std::mt19937 rng(1);
  std::normal_distribution<float> d(0.0f, 0.05f);
  std::vector<uint16_t> w(size_t(N * K));
  for (auto& v : w) v = f32_to_bf16(d(rng));
  std::vector<float> x(size_t(M * K)), y(size_t(M * N));
  for (auto& v : x) v = d(rng);
  const kernels::PackedWeight pw = kernels::pack_weight(w.data(), kernels::WType::BF16, N, K);
  const double flops = 2.0 * double(M) * double(N) * double(K);
  GemmPeak p;
  for (int kind = 0; kind < 2; ++kind) {
    std::vector<double> g;
    for (int r = 0; r < reps + 1; ++r) {
      const double t0 = now_ms();
      if (kind == 0) kernels::matmul(x.data(), w.data(), kernels::WType::BF16, nullptr, y.data(), M, N, K);
      else kernels::matmul_packed(x.data(), pw, nullptr, y.data(), M);
      const double ms = now_ms() - t0;
      if (r > 0) g.push_back(flops / (ms * 1e6));
    }
    (kind == 0 ? p.raw : p.packed) = median(g);
  }
  return p;
}

struct Roofline {
  double bw1 = 0, bw_all = 0;  // GB/s
  int threads = 1;
  double fma_peak = 0;         // GFLOP/s, all threads
  double gemm_peak = 0;        // GFLOP/s of the active path (best kernel)
};

std::vector<Isa> runnable_isas() {
  const Isa saved = active_isa();
  set_active_isa(Isa::AmxBf16);
  const Isa hw = active_isa();
  set_active_isa(saved);
  std::vector<Isa> out;
  for (Isa i : {Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Avx512Bf16, Isa::AmxBf16})
    if (i <= hw) out.push_back(i);
  return out;
}

Roofline measure_roofline(bool all_isas, bool print) {
  Roofline r;
  r.threads = num_threads();
  const size_t bytes = size_t(1) << 30;
  r.bw1 = read_bandwidth_gbs(1, bytes, 5);
  r.bw_all = read_bandwidth_gbs(r.threads, bytes, 5);
  r.fma_peak = fma_peak_gflops(3);
  if (print) {
    const CpuFeatures& f = cpu_features();
    std::printf("## Roofline (%s CPU, %d threads)\n\n",
                f.amx_tile && f.amx_bf16 ? "AMX-BF16" : f.avx512bf16 ? "AVX512-BF16"
                : f.avx512f ? "AVX-512" : "AVX2", r.threads);
    std::printf("| what | value |\n|---|---|\n");
    std::printf("| read bandwidth, 1 thread | %.1f GB/s |\n", r.bw1);
    std::printf("| read bandwidth, %d threads | %.1f GB/s |\n", r.threads, r.bw_all);
    if (r.fma_peak > 0) std::printf("| AVX2 FMA peak (registers only), %d threads | %.0f GFLOP/s |\n", r.threads, r.fma_peak);
    std::fflush(stdout);
  }
  const Isa saved = active_isa();
  for (Isa isa : all_isas ? runnable_isas() : std::vector<Isa>{saved}) {
    set_active_isa(isa);
    const GemmPeak g = gemm_peak(isa == Isa::Scalar ? 1 : 5);
    if (isa == saved) r.gemm_peak = g.best();
    if (print) {
      std::printf("| GEMM peak, %s path, bf16 weights: matmul / matmul_packed | %.1f / %.1f GFLOP/s |\n",
                  isa_name(isa), g.raw, g.packed);
      std::fflush(stdout);
    }
  }
  set_active_isa(saved);
  if (print) std::printf("\n");
  return r;
}

// ---- model ----

struct ModelArgs {
  std::string model;
  int runs = 3;
  int decode_tokens = 32;
  std::vector<int> prefill_lengths{128, 512, 2048};
  std::vector<int> decode_contexts{128, 2048};
  bool no_reuse = false;
  std::string weight_budget = "0";
  std::string vram_budget = "0";
  std::string head_quant = "auto";
  std::string device = "cpu";
  int tp = 1;
  bool no_pack = false;
  std::string spec = "off";  // decode as llama-bench's tg does: one token per forward pass
};

// Matmul parameter counts of one forward token (weights read by decode).
struct ModelCounts {
  double layer_params = 0;   // all linear layers of all decoder layers
  double head_params = 0;    // lm_head
  double decode_bytes = 0;   // bytes of the matrices one decoded token reads (stored types)
};

ModelCounts model_counts(const Model& m) {
  const ModelConfig& c = m.config();
  const double h = double(c.hidden_size), hd = double(c.head_dim);
  const double attn = h * hd * (2.0 * double(c.n_heads) + 2.0 * double(c.n_kv_heads));  // q,o + k,v
  const double mlp = 3.0 * h * double(c.intermediate_size);
  ModelCounts mc;
  mc.layer_params = double(c.n_layers) * (attn + mlp);
  mc.head_params = double(c.vocab_size) * h;
  // In the types the matrices are stored in (bf16, f32, or quantized blocks of a GGUF / AWQ
  // checkpoint, which may mix types per tensor).
  mc.decode_bytes = double(m.decode_weight_bytes());
  return mc;
}

// FLOPs of a prefill of n new tokens after `past` cached ones (logits of the last token only).
double prefill_flops(const ModelConfig& c, const ModelCounts& mc, int64_t n, int64_t past) {
  // Attention: q·k and p·v, 2 FLOPs per multiply-add each, over the causal keys of every token.
  double keys = 0;
  for (int64_t i = 0; i < n; ++i) keys += double(past + i + 1);
  const double attn = 4.0 * double(c.n_layers) * double(c.n_heads) * double(c.head_dim) * keys;
  return 2.0 * mc.layer_params * double(n) + attn + 2.0 * mc.head_params;
}

std::vector<int32_t> random_ids(const Model& m, int64_t n, uint64_t seed) {
  // Ordinary tokens: clear of the low ids (bytes, often specials) and of the special tokens at
  // the top of the vocabulary.
  const int64_t v = m.config().vocab_size;
  const int64_t lo = std::min<int64_t>(1000, v / 4), hi = std::max<int64_t>(lo + 1, std::min<int64_t>(v - 1000, 100000));
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> d(lo, hi - 1);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& t : ids) t = int32_t(d(rng));
  return ids;
}

GenerateOptions bench_options(int new_tokens, bool prefix_cache) {
  GenerateOptions o;
  o.max_new_tokens = new_tokens;
  o.sampling.temperature = 0.0f;
  o.add_special = false;
  o.ignore_eos = true;
  o.prefix_cache = prefix_cache;
  return o;
}

void run_model(const ModelArgs& a) {
  const kernels::Device device = parse_device_flag(a.device);
  const uint64_t vram_budget = parse_vram_budget(a.vram_budget, device);
  const SpecMode spec = parse_spec_mode(a.spec);
  const std::string dir = resolve_model_dir(a.model, true);
  const Roofline rl = measure_roofline(false, true);
  EngineOptions eo;
  eo.load.weight_budget = parse_weight_budget(a.weight_budget);
  eo.load.head_quant = parse_head_quant(a.head_quant, "--head-quant");
  eo.load.pack_weights = !a.no_pack;
  eo.load.device = device;
  eo.load.vram_budget = vram_budget;
  eo.tp = a.tp;
  // The engine speculates greedy decodes by default (prompt lookup); a benchmark's repetitive
  // output from random ids (or random weights) is then accepted in long runs, so tg would count
  // several tokens per pass. Off unless --spec asks for it.
  eo.spec.mode = spec;
  auto engine = load_engine(dir, false, eo);
  const Model& m = engine->model();
  const ModelConfig& c = m.config();
  const ModelCounts mc = model_counts(m);
  const double decode_bytes = mc.decode_bytes;
  const int64_t ctx = engine->context_length();
  std::printf("## %s (%s, %lld layers, hidden %lld, %s head, %.0f MB of weights read per decoded token)\n\n",
              dir.c_str(), c.model_type.c_str(), (long long)c.n_layers, (long long)c.hidden_size,
              kernels::wtype_name(m.lm_head().type), decode_bytes / 1e6);
  std::printf("path %s (quantized GEMM %s), %d threads, weights %s; roofline: read bandwidth %.1f GB/s, GEMM peak "
              "%.1f GFLOP/s; medians of %d runs\n\n",
              isa_name(active_isa()), kernels::quant_gemm_name(kernels::quant_gemm_path()), num_threads(), m.n_packed() ? "packed at load" : "as stored", rl.bw_all,
              rl.gemm_peak, a.runs);
  std::printf("| what | tokens/s | time | fraction of roofline |\n|---|---|---|---|\n");
  std::fflush(stdout);
  uint64_t seed = 100;

  for (int L : a.prefill_lengths) {
    if (L + 1 > ctx) continue;
    std::vector<double> ms;
    for (int r = 0; r < a.runs; ++r) {
      // A fresh random prompt every run, prefix cache off: every token is computed.
      const GenerateResult g = engine->generate_ids(random_ids(m, L, seed++), bench_options(1, false));
      ms.push_back(g.prefill_ms);
    }
    const double t = median(ms);
    const double gflops = prefill_flops(c, mc, L, 0) / (t * 1e6);
    std::printf("| prefill %d tokens (pp%d) | %.1f | %.0f ms | %.0f%% (%.1f GFLOP/s) |\n", L, L, L * 1000.0 / t, t,
                100.0 * gflops / rl.gemm_peak, gflops);
    std::fflush(stdout);
  }

  for (int L : a.decode_contexts) {
    if (L + a.decode_tokens + 1 > ctx) continue;
    const std::vector<int32_t> prompt = random_ids(m, L, seed++);
    // First run computes and caches the prompt; the measured runs find it cached (only the last
    // token is recomputed) and decode decode_tokens tokens at context L .. L + decode_tokens.
    engine->generate_ids(prompt, bench_options(1, true));
    std::vector<double> tps;
    std::string spec_line;
    for (int r = 0; r < a.runs; ++r) {
      const GenerateResult g = engine->generate_ids(prompt, bench_options(a.decode_tokens + 1, true));
      tps.push_back(g.decode_tok_per_s());
      if (g.decode_passes > 0) spec_line = spec_summary(g);
    }
    if (eo.spec.mode != SpecMode::kOff && !spec_line.empty()) std::printf("(speculative, last run: %s)\n", spec_line.c_str());
    const double t = median(tps);
    const double gbs = decode_bytes * t / 1e9;
    std::printf("| decode at context %d (tg%d) | %.2f | %.1f ms/token | %.0f%% (%.1f GB/s of weights) |\n",
                L, a.decode_tokens, t, 1000.0 / t, 100.0 * gbs / rl.bw_all, gbs);
    std::fflush(stdout);
  }

  if (!a.no_reuse && 1601 <= ctx) {
    // The prefix-hit case: a 1,600-token prompt, then prompts sharing its first 1,550 tokens
    // with a new 50-token tail. Only full KV blocks are cached, so the tokens computed are
    // 1,600 - n_cached (reported).
    const std::vector<int32_t> base = random_ids(m, 1600, seed++);
    engine->generate_ids(base, bench_options(1, true));
    std::vector<double> ttft, pre;
    int64_t cached = 0;
    for (int r = 0; r < a.runs; ++r) {
      std::vector<int32_t> p(base.begin(), base.begin() + 1550);
      const std::vector<int32_t> tail = random_ids(m, 50, seed++);
      p.insert(p.end(), tail.begin(), tail.end());
      const GenerateResult g = engine->generate_ids(p, bench_options(1, true));
      ttft.push_back(g.ttft_ms);
      pre.push_back(g.prefill_ms);
      cached = g.n_cached;
    }
    const double t = median(pre);
    const int64_t n_new = 1600 - cached;
    const double gflops = prefill_flops(c, mc, n_new, cached) / (t * 1e6);
    std::printf("| 50 new tokens after 1,550 cached (%lld cached, %lld computed) | %.1f | %.0f ms prefill, %.0f ms TTFT | %.0f%% (%.1f GFLOP/s) |\n",
                (long long)cached, (long long)n_new, n_new * 1000.0 / t, t, median(ttft),
                100.0 * gflops / rl.gemm_peak, gflops);
  }
  std::printf("\n");
}

// ---- logit error of each kernel path against the scalar reference ----

struct LogitArgs {
  std::string model;
  int tokens = 64;
  int greedy = 4;
};

// Logits of `tokens` random prompt tokens (all positions, one batched pass: the prefill
// kernels) and of `greedy` decode steps (the GEMV kernels) under the active path.
std::vector<float> path_logits(const Model& m, const std::vector<int32_t>& ids, int greedy,
                               const std::vector<int32_t>& forced) {
  const ModelConfig& c = m.config();
  const int64_t n = int64_t(ids.size()), V = c.vocab_size;
  KvCache kv(c, n + greedy + 1);
  std::vector<float> all(size_t((n + greedy) * V));
  m.forward(ids.data(), n, kv, all.data(), /*all_logits=*/true);
  for (int i = 0; i < greedy; ++i)  // the reference path's tokens, so the inputs stay equal
    m.forward(&forced[size_t(i)], 1, kv, all.data() + (n + i) * V);
  return all;
}

void run_logit_error(const LogitArgs& a) {
  const std::string dir = resolve_model_dir(a.model, true);
  const Isa saved = active_isa();
  // Weights packed at load take the layout of the path active then (kernels.h pack_layout_for:
  // bf16 pairs from avx512bf16 up), which a lower path refuses: each path loads its own copy.
  set_active_isa(Isa::Scalar);
  auto model = Model::load(dir);
  const Model& m = *model;
  const int64_t V = m.config().vocab_size;
  const std::vector<int32_t> ids = random_ids(m, a.tokens, 7);
  // Greedy tokens of the reference: the decode steps of every path consume the same ids.
  std::vector<int32_t> forced;
  {
    const ModelConfig& c = m.config();
    KvCache kv(c, int64_t(ids.size()) + a.greedy + 1);
    std::vector<float> last(static_cast<size_t>(V));
    m.forward(ids.data(), int64_t(ids.size()), kv, last.data());
    for (int i = 0; i < a.greedy; ++i) {
      forced.push_back(int32_t(kernels::argmax(last.data(), V)));
      m.forward(&forced.back(), 1, kv, last.data());
    }
  }
  const double t0 = now_ms();
  const std::vector<float> ref = path_logits(m, ids, a.greedy, forced);
  const double ref_ms = now_ms() - t0;
  std::printf("## Logit error vs the scalar path (%s, %d prompt tokens + %d decode steps)\n\n",
              dir.c_str(), a.tokens, a.greedy);
  std::printf("reference: KVBOOST_ISA=scalar, f32 activations, double-accumulated matmul (%.0f ms)\n\n", ref_ms);
  std::printf("| path | max abs error | max error / logit std | mean KL(ref, path) | top-1 agreement |\n|---|---|---|---|---|\n");
  for (Isa isa : runnable_isas()) {
    if (isa == Isa::Scalar) continue;
    set_active_isa(isa);
    const auto path_model = Model::load(dir);
    const std::vector<float> got = path_logits(*path_model, ids, a.greedy, forced);
    const int64_t rows = int64_t(ref.size()) / V;
    double max_abs = 0, max_rel = 0, kl_sum = 0;
    int64_t agree = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const float* p = ref.data() + r * V;
      const float* q = got.data() + r * V;
      double mean = 0, var = 0;
      for (int64_t i = 0; i < V; ++i) mean += p[i];
      mean /= double(V);
      for (int64_t i = 0; i < V; ++i) var += (p[i] - mean) * (p[i] - mean);
      const double sd = std::sqrt(var / double(V));
      double row_max = 0;
      for (int64_t i = 0; i < V; ++i) row_max = std::max(row_max, double(std::fabs(p[i] - q[i])));
      max_abs = std::max(max_abs, row_max);
      if (sd > 0) max_rel = std::max(max_rel, row_max / sd);
      const LogitAgreement g = compare_logits(p, q, V);  // KL(softmax(p) || softmax(q)) in double
      kl_sum += g.kl;
      agree += g.top1;
    }
    std::printf("| %s | %.3g | %.3g | %.3g | %lld/%lld |\n", isa_name(isa), max_abs, max_rel,
                kl_sum / double(rows), (long long)agree, (long long)rows);
    std::fflush(stdout);
  }
  set_active_isa(saved);
  std::printf("\n");
}

void apply_common(int threads, const std::string& isa) {
  if (threads > 0) set_num_threads(threads);
  if (!isa.empty()) {
    Isa want;
    kernels::QuantGemm quant;
    if (!kernels::parse_kernel_path(isa, want, quant))
      fail("--isa: unknown path '", isa, "' (", kernels::kernel_path_names(), ")");
    kernels::set_kernel_path(isa);  // float level and quantized GEMM, clamped to what the CPU and OS support
  }
}

}  // namespace

CLI::App* add_bench(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Measure the kernels and models against this machine's roofline");
  bench->require_subcommand(1);

  struct Common {
    int threads = 0;
    std::string isa;
  };
  auto common = std::make_shared<Common>();
  auto add_common = [common](CLI::App* c) {
    c->add_option("--threads", common->threads, "Threads (default: all cores)");
    c->add_option("--isa", common->isa, "Kernel path: scalar, avx2, avxvnni, avx512 (= avx512vnni), avx512bf16, amx (= amxbf16), amxint8 (default: KVBOOST_ISA or the best the CPU has; clamped to it)");
  };

  CLI::App* roof = bench->add_subcommand("roofline", "Read bandwidth (1 and all threads) and peak GEMM GFLOP/s of each kernel path");
  add_common(roof);
  roof->callback([common] {
    apply_common(common->threads, common->isa);
    measure_roofline(true, true);
  });

  auto ma = std::make_shared<ModelArgs>();
  CLI::App* model = bench->add_subcommand("model", "Prefill and decode tokens/s of a model as fractions of the roofline");
  add_common(model);
  model->add_option("-m,--model", ma->model, "Model directory, .gguf file or Hugging Face id ORG/NAME[@REV] (default: the demo model)");
  model->add_option("--runs", ma->runs, "Runs per measurement (median)")->check(CLI::Range(1, 100));
  model->add_option("--decode-tokens", ma->decode_tokens, "Tokens per decode measurement")->check(CLI::Range(2, 4096));
  model->add_option("--prefill", ma->prefill_lengths, "Prompt lengths for prefill")->delimiter(',');
  model->add_option("--decode-context", ma->decode_contexts, "Contexts for decode")->delimiter(',');
  model->add_flag("--no-reuse", ma->no_reuse, "Skip the 50-after-1,550-cached prefill");
  model->add_option("--weight-budget", ma->weight_budget, kWeightBudgetHelp);
  model->add_option("--head-quant", ma->head_quant, kHeadQuantHelp)->capture_default_str();
  model->add_option("--device", ma->device, kDeviceHelp)->capture_default_str();
  model->add_option("--vram-budget", ma->vram_budget, kVramBudgetHelp);
  model->add_option("--tp", ma->tp, kTpHelp)->capture_default_str();
  model->add_flag("--no-pack", ma->no_pack, "Keep the matrices in the stored layout (LoadOptions::pack_weights off)");
  model->add_option("--spec", ma->spec,
                    "Speculative decoding in the decode rows: off (one token per pass, as llama-bench's tg), lookup, draft")
      ->capture_default_str();
  model->callback([common, ma] {
    apply_common(common->threads, common->isa);
    run_model(*ma);
  });
  auto la = std::make_shared<LogitArgs>();
  CLI::App* logits = bench->add_subcommand("logits", "Logit error of each kernel path against the scalar reference");
  add_common(logits);
  logits->add_option("-m,--model", la->model, "Model directory, .gguf file or Hugging Face id ORG/NAME[@REV] (default: the demo model)");
  logits->add_option("--tokens", la->tokens, "Prompt tokens (random ids)")->check(CLI::Range(1, 100000));
  logits->add_option("--greedy", la->greedy, "Decode steps after the prompt")->check(CLI::Range(0, 1000));
  logits->callback([common, la] {
    apply_common(common->threads, common->isa);
    run_logit_error(*la);
  });
  return bench;
}

}  // namespace kvboost::cli
