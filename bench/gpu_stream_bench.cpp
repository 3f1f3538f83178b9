// gpu_stream_bench: the GPU decoder with weights resident vs streamed layer by layer from pinned
// host memory (kvboost/gpu.h), per model:
//   - pinned host -> device copy bandwidth (the ceiling of streaming),
//   - resident prefill tok/s (a --prompt-token prompt) and decode tok/s,
//   - streamed (--slots, default a quarter of the layers) decode and prefill tok/s, layer bytes
//     copied per token, achieved H2D bandwidth and its fraction of the ceiling,
//   - overlap: the streamed step time against copy-only time (every layer copied, no compute) and
//     compute-only time (the resident step): overlap = (copy + compute - streamed) / min(copy,
//     compute), 1 = the shorter one hidden completely.
// Medians of --reps runs; everything in one process. Usage:
//   gpu_stream_bench --model DIR [--model DIR ...] [--slots S ...] [--prompt 512] [--context 128]
//                    [--decode 32] [--reps 3]
// --slots may repeat; 0 (the default) is a quarter of the model's layers.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kvboost/gpu.h"

using namespace kvboost;
using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<int32_t> tokens(int64_t n, int64_t vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  uint32_t s = 12345;
  for (auto& x : t) x = int32_t((s = s * 1664525u + 1013904223u) >> 8) % int32_t(vocab);
  return t;
}

struct Timing {
  double prefill_tps = 0, decode_tps = 0, decode_ms = 0;
  double bytes_per_token = 0;
};

// Prefill of `prompt` tokens from an empty cache; decode of `n_decode` tokens after `context`.
Timing measure(gpu::Decoder& d, int64_t vocab, int64_t prompt, int64_t context, int64_t n_decode, int reps) {
  Timing t;
  std::vector<float> logits(static_cast<size_t>(vocab));
  const auto p = tokens(std::max(prompt, context), vocab);
  // Warm-up: cuBLAS heuristics, kernel loading, first touches.
  d.reset();
  d.forward(p.data(), std::min<int64_t>(prompt, 64), logits.data());
  int32_t tok = 1;
  d.forward(&tok, 1, logits.data());
  std::vector<double> pf, dec, bpt;
  for (int r = 0; r < reps; ++r) {
    d.reset();
    auto t0 = Clock::now();
    d.forward(p.data(), prompt, logits.data());
    pf.push_back(double(prompt) / std::chrono::duration<double>(Clock::now() - t0).count());
    d.reset();
    d.forward(p.data(), context, logits.data());
    d.reset_stats();
    t0 = Clock::now();
    for (int64_t i = 0; i < n_decode; ++i) {
      tok = int32_t((i * 7919 + 13) % vocab);
      d.forward(&tok, 1, logits.data());
    }
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    dec.push_back(double(n_decode) / s);
    bpt.push_back(double(d.stats().bytes_h2d) / double(n_decode));
  }
  t.prefill_tps = median(pf);
  t.decode_tps = median(dec);
  t.decode_ms = 1e3 / t.decode_tps;
  t.bytes_per_token = median(bpt);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> models;
  std::vector<int64_t> slot_list;
  int64_t prompt = 512, context = 128, n_decode = 32;
  int reps = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "gpu_stream_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--model") models.push_back(next());
    else if (a == "--slots") slot_list.push_back(std::stoll(next()));
    else if (a == "--prompt") prompt = std::stoll(next());
    else if (a == "--context") context = std::stoll(next());
    else if (a == "--decode") n_decode = std::stoll(next());
    else if (a == "--reps") reps = std::stoi(next());
    else {
      std::fprintf(stderr, "usage: gpu_stream_bench --model DIR [--model DIR ...] [--slots S] [--prompt 512] "
                           "[--context 128] [--decode 32] [--reps 3]\n");
      return 2;
    }
  }
  if (slot_list.empty()) slot_list.push_back(0);
  if (models.empty()) {
    std::fprintf(stderr, "gpu_stream_bench: no --model given\n");
    return 2;
  }
  try {
    const gpu::DeviceInfo di = gpu::device_info(0);
    std::printf("device: %s (sm_%d%d, %d SMs, %.1f GiB)\n", di.name.c_str(), di.cc_major, di.cc_minor, di.sm_count,
                double(di.total_bytes) / (1u << 30));
    const double limit = gpu::pinned_h2d_gbps(size_t(256) << 20, 7);
    std::printf("pinned H2D copy bandwidth (4 x 256 MiB cudaMemcpyAsync back to back, median of 7): %.2f GB/s\n\n", limit);
    for (const std::string& dir : models) {
      LoadOptions lo;
      auto model = Model::load(dir, lo);
      const ModelConfig& c = model->config();
      gpu::DecoderOptions ro;
      ro.max_tokens = std::max(prompt, context + n_decode) + 64;
      ro.max_batch = prompt;
      std::printf("model %s: %s, hidden %lld, intermediate %lld, %lld layers, %lld/%lld heads, vocab %lld\n",
                  dir.c_str(), c.model_type.c_str(), (long long)c.hidden_size, (long long)c.intermediate_size,
                  (long long)c.n_layers, (long long)c.n_heads, (long long)c.n_kv_heads, (long long)c.vocab_size);
      Timing res;
      double layer_mb = 0, dev_res_gb = 0;
      {
        auto d = gpu::Decoder::create(*model, ro);
        layer_mb = double(d->layer_bytes()) / 1e6;
        dev_res_gb = double(d->device_weight_bytes()) / 1e9;
        res = measure(*d, c.vocab_size, prompt, context, n_decode, reps);
      }
      std::printf("  layer weights: %.1f MB per layer, %.3f GB in all; device weight bytes resident: %.3f GB\n",
                  layer_mb, layer_mb * double(c.n_layers) / 1e3, dev_res_gb);
      std::printf("  %-30s %10s %10s %10s %10s %9s %8s %9s %9s %8s\n", "", "prefill", "decode", "decode", "device",
                  "MB/token", "H2D", "of limit", "copy-only", "overlap");
      std::printf("  %-30s %10s %10s %10s %10s %9s %8s %9s %9s %8s\n", "", "tok/s", "tok/s", "ms/token", "weights GB",
                  "copied", "GB/s", "", "ms/token", "");
      std::printf("  %-30s %10.0f %10.1f %10.3f %10.3f\n", "resident", res.prefill_tps, res.decode_tps, res.decode_ms,
                  dev_res_gb);
      for (int64_t want : slot_list) {
        const int64_t S = want > 0 ? want : std::max<int64_t>(2, c.n_layers / 4);
        gpu::DecoderOptions so = ro;
        so.stream_slots = S;
        auto d = gpu::Decoder::create(*model, so);
        const double dev_gb = double(d->device_weight_bytes()) / 1e9;
        const Timing str = measure(*d, c.vocab_size, prompt, context, n_decode, reps);
        const double copy_ms = d->time_layer_copies(reps);
        const double achieved = str.bytes_per_token / (str.decode_ms * 1e6);
        const double compute_ms = res.decode_ms;
        // 1 = the shorter of copy and compute completely hidden behind the longer one.
        const double overlap = (copy_ms + compute_ms - str.decode_ms) / std::min(copy_ms, compute_ms);
        char label[64];
        std::snprintf(label, sizeof label, "streamed, %lld of %lld slots", (long long)S, (long long)c.n_layers);
        std::printf("  %-30s %10.0f %10.1f %10.3f %10.3f %9.1f %8.2f %8.0f%% %9.3f %7.0f%%\n", label, str.prefill_tps,
                    str.decode_tps, str.decode_ms, dev_gb, str.bytes_per_token / 1e6, achieved, 100 * achieved / limit,
                    copy_ms, 100 * overlap);
        std::fflush(stdout);
      }
      std::printf("\n");
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "gpu_stream_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
