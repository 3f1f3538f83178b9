// AWQ 4-bit vs a baseline checkpoint of the same shape, in one process: decode tokens/s (one
// token at a time after a prompt) and prefill tokens/s of the baseline, the AWQ model with its
// head as stored (float) and the AWQ model with the head quantized at load (one column per
// --head-quant type), measured round-robin (base, awq, awq+q8_0, base, ...) so that load changes
// on a shared machine hit all alike; medians of --runs and their ratios to the baseline. The
// load average (/proc/loadavg) before and after is printed with the table.
//
//   kvboost-fixture --preset qwen2.5-0.5b --dtype bf16 --out /tmp/q05
//   kvboost-fixture --preset qwen2.5-0.5b --dtype bf16 --quant awq --group-size 128 --out /tmp/q05-awq
//   awq_bench --awq /tmp/q05-awq --base /tmp/q05 [--runs 5] [--decode-tokens 16]
//             [--context 128] [--prefill 128,512] [--head-quant q8_0,q4_0] [--threads N]
//   awq_bench --gemv [--runs 5]     # kernels alone at the Qwen2.5-0.5B decode shapes (below)
//
// --gemv: the read bandwidth (a 512 MiB sum over all threads) and the decode GEMV (one token)
// of each matrix shape of a Qwen2.5-0.5B layer in Q4_Z128 / Q4_Z (AWQ) and BF16, and of its head in BF16,
// Q8_0 and Q4_0, each call on another copy of the matrix (>= 256 MiB of copies) so that every
// call reads from DRAM; GB/s = matrix bytes / time, medians of --runs, and a whole decode
// token's matrices (24 layers + head) as time and fraction of the read bandwidth.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <tuple>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kvboost/common.h"
#include "kvboost/kernels.h"
#include "kvboost/model.h"

using namespace kvboost;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<int32_t> random_ids(int64_t vocab, int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> d(std::min<int64_t>(1000, vocab / 4), std::max<int64_t>(vocab / 2, 2) - 1);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& t : ids) t = int32_t(d(rng));
  return ids;
}

// Decode tokens/s: prompt of `context` tokens, then n_tokens single-token forwards (greedy).
double decode_tps(const Model& m, int context, int n_tokens, uint64_t seed) {
  const ModelConfig& c = m.config();
  KvCache kv(c, context + n_tokens + 1);
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  const std::vector<int32_t> prompt = random_ids(c.vocab_size, context, seed);
  m.forward(prompt.data(), context, kv, logits.data());
  const double t0 = now_ms();
  for (int i = 0; i < n_tokens; ++i) {
    const int32_t t = int32_t(kernels::argmax(logits.data(), c.vocab_size));
    m.forward(&t, 1, kv, logits.data());
  }
  return n_tokens * 1000.0 / (now_ms() - t0);
}

double prefill_tps(const Model& m, int n, uint64_t seed) {
  const ModelConfig& c = m.config();
  KvCache kv(c, n);
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  const std::vector<int32_t> prompt = random_ids(c.vocab_size, n, seed);
  const double t0 = now_ms();
  m.forward(prompt.data(), n, kv, logits.data());
  return n * 1000.0 / (now_ms() - t0);
}

std::string loadavg() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

// ---- --gemv ----

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// GB/s of a 512 MiB read, split over all threads (what decode's weight stream can reach).
double read_gbs(int runs) {
  const size_t n = (size_t(512) << 20) / sizeof(uint64_t);
  std::vector<uint64_t> buf(n, 1);
  std::vector<double> r;
  for (int i = 0; i < runs + 1; ++i) {
    std::vector<uint64_t> part(size_t(num_threads()) * 8);
    const double t0 = now_ms();
    parallel_run(num_threads(), [&](int tid, int nth) {
      const size_t b = n * size_t(tid) / size_t(nth), e = n * size_t(tid + 1) / size_t(nth);
      uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (size_t k = b; k + 4 <= e; k += 4) s0 += buf[k], s1 += buf[k + 1], s2 += buf[k + 2], s3 += buf[k + 3];
      part[size_t(tid) * 8] = s0 + s1 + s2 + s3;
    });
    const double ms = now_ms() - t0;
    if (part[0] == 42) std::printf(" ");
    if (i > 0) r.push_back(double(n * sizeof(uint64_t)) / (ms * 1e6));
  }
  return median(r);
}

// Median ms of one decode GEMV of a random [N, K] matrix of type wt.
double gemv_ms(kernels::WType wt, int64_t N, int64_t K, int runs) {
  using kernels::WType;
  const size_t one = size_t(N) * size_t(kernels::wtype_row_bytes(wt, K));
  const int copies = int(std::max<size_t>(2, (size_t(256) << 20) / one + 1));
  std::vector<uint8_t> w(one * size_t(copies));
  {
    uint64_t seed = 7;
    std::vector<float> f(size_t(N * K));
    for (float& x : f) x = (float(splitmix(seed) >> 40) * (1.0f / 8388608.0f) - 1.0f) * 0.05f;
    if (wt == WType::Q4_Z128) {  // no quantize_row for it: random nibbles, valid headers
      for (size_t i = 0; i < one; ++i) w[i] = uint8_t(splitmix(seed));
      for (size_t b = 0; b < one; b += 68) {
        const uint16_t h = f32_to_f16(0.001f + float(splitmix(seed) >> 40) * (0.01f / 16777216.0f));
        std::memcpy(w.data() + b, &h, 2);
        w[b + 2] &= 0x0F, w[b + 3] = 0;
      }
    } else if (kernels::wtype_is_quantized(wt)) {
      kernels::quantize_row(f.data(), wt, w.data(), N * K);
    } else {
      for (size_t i = 0; i < f.size(); ++i) {
        const uint16_t h = f32_to_bf16(f[i]);
        std::memcpy(w.data() + 2 * i, &h, 2);
      }
    }
    for (int c = 1; c < copies; ++c) std::memcpy(w.data() + one * size_t(c), w.data(), one);
  }
  std::vector<float> x(static_cast<size_t>(K)), y(static_cast<size_t>(N));
  uint64_t seed = 9;
  for (float& v : x) v = float(splitmix(seed) >> 40) * (1.0f / 8388608.0f) - 1.0f;
  // Enough calls per run for ~30 ms; the first pass over the copies is a warm-up.
  const int calls = std::max(copies, int(30.0 * 1e6 / double(one)));
  for (int c = 0; c < copies; ++c) kernels::matmul(x.data(), w.data() + one * size_t(c), wt, nullptr, y.data(), 1, N, K);
  std::vector<double> t;
  int c = 0;
  for (int r = 0; r < runs; ++r) {
    const double t0 = now_ms();
    for (int i = 0; i < calls; ++i, c = (c + 1) % copies)
      kernels::matmul(x.data(), w.data() + one * size_t(c), wt, nullptr, y.data(), 1, N, K);
    t.push_back((now_ms() - t0) / calls);
  }
  return median(t);
}

void run_gemv(int runs) {
  using kernels::WType;
  struct Shape {
    const char* name;
    int64_t N, K, per_token;  // per_token: how many such matrices one decoded token reads
  };
  // Qwen2.5-0.5B: 24 layers of q/o [896, 896], k/v [128, 896], gate/up [4864, 896],
  // down [896, 4864]; the tied head [151936, 896].
  const Shape layer[] = {{"q_proj, o_proj", 896, 896, 48}, {"k_proj, v_proj", 128, 896, 48},
                         {"gate_proj, up_proj", 4864, 896, 48}, {"down_proj", 896, 4864, 24}};
  const Shape head{"lm_head", 151936, 896, 1};
  std::printf("# awq_bench --gemv: path %s, %d threads, load average %s\n", isa_name(active_isa()), num_threads(),
              loadavg().c_str());
  const double bw = read_gbs(runs);
  std::printf("# read bandwidth (512 MiB sum, all threads): %.1f GB/s\n\n", bw);
  std::printf("| matrix [N, K] | type | MB | us per GEMV | GB/s | of read bandwidth |\n|---|---|---|---|---|---|\n");
  auto row = [&](const Shape& s, WType wt) {
    const double ms = gemv_ms(wt, s.N, s.K, runs);
    const double mb = double(s.N) * double(kernels::wtype_row_bytes(wt, s.K)) / 1e6;
    std::printf("| %s [%lld, %lld] | %s | %.2f | %.0f | %.1f | %.0f%% |\n", s.name, (long long)s.N, (long long)s.K,
                kernels::wtype_name(wt), mb, ms * 1e3, mb / ms, 100.0 * (mb / ms) / bw);
    std::fflush(stdout);
    return std::pair<double, double>(ms * double(s.per_token), mb * double(s.per_token));
  };
  // Layers: Q4_Z128 (AWQ groups of 128, as loaded), Q4_Z (other group sizes), BF16.
  double tl[3] = {0, 0, 0}, bl[3] = {0, 0, 0};
  const WType lt[3] = {WType::Q4_Z128, WType::Q4_Z, WType::BF16};
  for (int i = 0; i < 3; ++i)
    for (const Shape& s : layer) {
      const auto [ms, mb] = row(s, lt[i]);
      tl[i] += ms, bl[i] += mb;
    }
  double th[3], bh[3];
  const WType ht[3] = {WType::BF16, WType::Q8_0, WType::Q4_0};
  for (int i = 0; i < 3; ++i) std::tie(th[i], bh[i]) = row(head, ht[i]);
  std::printf("\n| one decode token's matrices | MB | ms | GB/s | of read bandwidth | tok/s bound by these GEMVs |\n"
              "|---|---|---|---|---|---|\n");
  auto total = [&](const char* what, double ms, double mb) {
    std::printf("| %s | %.0f | %.1f | %.1f | %.0f%% | %.1f |\n", what, mb, ms, mb / ms, 100.0 * mb / ms / bw, 1e3 / ms);
  };
  total("bf16 layers + bf16 head", tl[2] + th[0], bl[2] + bh[0]);
  total("Q4_Z layers (4 bits)", tl[1], bl[1]);
  total("Q4_Z128 layers (4 bits)", tl[0], bl[0]);
  const char* lname[2] = {"Q4_Z128", "Q4_Z"};
  const char* hname[3] = {"bf16", "Q8_0", "Q4_0"};
  for (int i = 0; i < 2; ++i)
    for (int h = 0; h < 3; ++h) {
      const std::string what = std::string(lname[i]) + " layers + " + hname[h] + " head";
      total(what.c_str(), tl[i] + th[h], bl[i] + bh[h]);
    }
  std::printf("\n# load average after: %s\n", loadavg().c_str());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"AWQ (float and quantized head) vs baseline decode and prefill tokens/s, measured round-robin in one process"};
  std::string awq_dir, base_dir;
  int runs = 5, decode_tokens = 16, context = 128, threads = 0;
  std::vector<int> prefill{128, 512};
  std::vector<std::string> head_quant{"q8_0"};
  bool gemv = false;
  app.add_option("--awq", awq_dir, "AWQ model directory");
  app.add_option("--base", base_dir, "Baseline model directory of the same shape (e.g. bf16)");
  app.add_flag("--gemv", gemv, "Only the decode GEMV kernels at the Qwen2.5-0.5B shapes against the read bandwidth");
  app.add_option("--runs", runs, "Runs per measurement (median)")->capture_default_str();
  app.add_option("--decode-tokens", decode_tokens, "Tokens per decode run")->capture_default_str();
  app.add_option("--context", context, "Prompt length before decode")->capture_default_str();
  app.add_option("--prefill", prefill, "Prompt lengths for prefill (0: none)")->delimiter(',');
  app.add_option("--head-quant", head_quant, "AWQ columns with the head quantized at load (q8_0, q6_k, q4_0; none: only the float head)")
      ->delimiter(',');
  app.add_option("--threads", threads, "Threads (default: all)");
  CLI11_PARSE(app, argc, argv);
  try {
    if (threads > 0) set_num_threads(threads);
    if (gemv) {
      run_gemv(runs);
      return 0;
    }
    if (awq_dir.empty() || base_dir.empty()) fail("--awq and --base are required (or --gemv)");
    struct Entry {
      std::string name;
      std::unique_ptr<Model> m;
    };
    std::vector<Entry> ms;
    LoadOptions none;
    none.head_quant = HeadQuant::None;
    ms.push_back({"base", Model::load(base_dir, none)});
    ms.push_back({"awq", Model::load(awq_dir, none)});
    for (const std::string& h : head_quant) {
      LoadOptions o;
      o.head_quant = parse_head_quant(h, "--head-quant");
      if (o.head_quant == HeadQuant::None || o.head_quant == HeadQuant::Auto) continue;
      auto m = Model::load(awq_dir, o);
      ms.push_back({std::string("awq+") + kernels::wtype_name(m->lm_head().type) + " head", std::move(m)});
    }
    const std::string load0 = loadavg();
    std::printf("# awq_bench: %s vs %s, path %s, %d threads, medians of %d round-robin runs\n", awq_dir.c_str(),
                base_dir.c_str(), isa_name(active_isa()), num_threads(), runs);
    std::printf("# weights read per decoded token:");
    for (const Entry& e : ms)
      std::printf(" %s %.0f MB (%s head);", e.name.c_str(), double(e.m->decode_weight_bytes()) / 1e6,
                  kernels::wtype_name(e.m->lm_head().type));
    std::printf("\n# bytes ratio base / x:");
    for (const Entry& e : ms)
      std::printf(" %s %.2fx;", e.name.c_str(), double(ms[0].m->decode_weight_bytes()) / double(e.m->decode_weight_bytes()));
    std::printf("\n# load average before: %s\n\n", load0.c_str());
    std::printf("| what |");
    for (const Entry& e : ms) std::printf(" %s tok/s |", e.name.c_str());
    for (size_t i = 1; i < ms.size(); ++i) std::printf(" %s / base |", ms[i].name.c_str());
    std::printf("\n|---|");
    for (size_t i = 0; i < 2 * ms.size() - 1; ++i) std::printf("---|");
    std::printf("\n");
    auto row = [&](const std::string& what, const std::vector<std::vector<double>>& v, const char* fmt) {
      std::printf("| %s |", what.c_str());
      for (const auto& x : v) std::printf(fmt, median(x));
      for (size_t i = 1; i < v.size(); ++i) std::printf(" %.2fx |", median(v[i]) / median(v[0]));
      std::printf("\n");
      std::fflush(stdout);
    };
    // warm-up: one short decode each (page faults, thread pool)
    for (const Entry& e : ms) decode_tps(*e.m, 8, 2, 1);
    std::vector<std::vector<double>> d(ms.size());
    for (int r = 0; r < runs; ++r)
      for (size_t i = 0; i < ms.size(); ++i) d[i].push_back(decode_tps(*ms[i].m, context, decode_tokens, 100 + r));
    row("decode at context " + std::to_string(context) + " (" + std::to_string(decode_tokens) + " tokens)", d, " %.2f |");
    for (int L : prefill) {
      if (L <= 0) continue;
      std::vector<std::vector<double>> p(ms.size());
      for (int r = 0; r < runs; ++r)
        for (size_t i = 0; i < ms.size(); ++i) p[i].push_back(prefill_tps(*ms[i].m, L, 200 + r));
      row("prefill " + std::to_string(L) + " tokens", p, " %.1f |");
    }
    std::printf("\n# load average after: %s\n", loadavg().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "awq_bench: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
