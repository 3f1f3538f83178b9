// The remote chunk tier (--chunk-remote) against the recompute it replaces, on one model:
//   1. per-chunk fetch from Redis (one 128-token entry per round trip, f32 / int8 / int4; fetch +
//      verify + promotion to RAM) vs the prefill of the same 128 tokens;
//   2. TTFT on "server B" (an engine that never saw the prompt) for a RAG prompt warmed by "server
//      A" (another engine, same Redis): with the remote tier, without it, and through a proxy that
//      adds --delay-ms each way (the cost model must keep TTFT at or below the no-tier TTFT).
// Medians of --reps. Needs a running Redis/Valkey: --remote redis://127.0.0.1:PORT.
//
//   remote_bench --model DIR --remote redis://127.0.0.1:6390 [--reps 5] [--doc-tokens 128]
//                [--docs 4] [--delay-ms 10]
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "delay_proxy.h"
#include "kvboost/runtime.h"

using namespace kvboost;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng{seed};
  std::uniform_int_distribution<int32_t> d(10, int32_t(std::min<int64_t>(vocab, 30000)) - 1);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = d(rng);
  return t;
}

int port_of(const std::string& url) { return std::stoi(url.substr(url.rfind(':') + 1)); }

}  // namespace

int main(int argc, char** argv) {
  std::string model, remote;
  int reps = 5, delay_ms = 10;
  int64_t doc_tokens = 128, n_docs = 4;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--model") model = next();
    else if (a == "--remote") remote = next();
    else if (a == "--reps") reps = std::stoi(next());
    else if (a == "--delay-ms") delay_ms = std::stoi(next());
    else if (a == "--doc-tokens") doc_tokens = std::stoll(next());
    else if (a == "--docs") n_docs = std::stoll(next());
    else {
      std::fprintf(stderr, "usage: remote_bench --model DIR --remote redis://127.0.0.1:PORT [--reps N] [--delay-ms D] "
                           "[--doc-tokens T] [--docs N]\n");
      return 2;
    }
  }
  if (model.empty() || remote.empty()) {
    std::fprintf(stderr, "remote_bench: --model and --remote are required\n");
    return 2;
  }
  try {
    auto plain = Engine::load(model, EngineOptions{});
    const ModelConfig& c = plain->model().config();
    const kv::ChunkShape shape{c.n_layers, c.n_kv_heads, c.head_dim};
    std::printf("model %s: %lld layers, %lld kv heads x %lld, vocab %lld\n", model.c_str(), (long long)c.n_layers,
                (long long)c.n_kv_heads, (long long)c.head_dim, (long long)c.vocab_size);

    // ---- 1. per-chunk fetch vs recompute ----------------------------------------------------
    std::vector<double> rec;
    for (int r = 0; r < reps + 1; ++r) {
      GenerateOptions o;
      o.max_new_tokens = 1;
      o.prefix_cache = false;
      o.sampling.temperature = 0;
      const GenerateResult g = plain->generate_ids(random_tokens(128, c.vocab_size, 1000 + r), o);
      if (r > 0) rec.push_back(g.prefill_ms);  // first: warm-up
    }
    const double rec_ms = median(rec);
    std::printf("\n128-token chunk: recompute (prefill of 128 tokens) %.2f ms median of %d\n", rec_ms, reps);
    std::printf("%-6s %10s %12s %12s %10s\n", "quant", "bytes", "fetch ms", "MB/s", "vs recompute");
    for (kv::KvQuant q : {kv::KvQuant::kF32, kv::KvQuant::kInt8, kv::KvQuant::kInt4}) {
      kv::ChunkStoreOptions so;
      so.model_id = "remote-bench/" + std::string(kv::kv_quant_name(q));
      so.quant = q;
      so.remote_url = remote + "?prefix=kvboost-bench";
      std::vector<std::shared_ptr<kv::Chunk>> chunks;
      {
        kv::ChunkStore a(shape, so);
        std::mt19937 rng{7};
        std::normal_distribution<float> d;
        std::vector<float> k(size_t(128 * shape.row())), v(k.size());
        for (int r = 0; r < reps + 1; ++r) {
          auto ch = std::make_shared<kv::Chunk>();
          ch->tokens = random_tokens(128, c.vocab_size, 5000 + r);
          const uint64_t root = kv::chunk_root(so.model_id, "bench" + std::to_string((long long)now_ms()));
          ch->keys = kv::chunk_keys(kv::chunk_first_keys(root), root, ch->tokens);
          kv::chunk_init(*ch, shape, q, 128);
          for (int64_t l = 0; l < shape.n_layers; ++l) {
            for (auto& x : k) x = d(rng);
            for (auto& x : v) x = d(rng);
            kv::chunk_put_layer(*ch, shape, l, k.data(), v.data());
          }
          chunks.push_back(ch);
          a.put(ch, false, "bench");
        }
        a.flush();
      }
      std::vector<double> ms;
      int64_t bytes = 0;
      for (int r = 0; r < reps + 1; ++r) {
        kv::ChunkStore b(shape, so);  // fresh: nothing local; unknown prefill rate: always fetches
        const kv::ChunkQuery qq[] = {{chunks[size_t(r)]->keys, chunks[size_t(r)]->tokens}};
        const double t0 = now_ms();
        const int64_t got = b.fetch_remote("bench", qq, false);
        const double t = now_ms() - t0;
        if (got != 1) throw Error("remote_bench: the fetch missed (is " + remote + " reachable?)");
        bytes = b.stats().remote.bytes;
        if (r > 0) ms.push_back(t);
      }
      const double m = median(ms);
      std::printf("%-6s %10lld %12.3f %12.0f %9.1fx\n", kv::kv_quant_name(q), (long long)bytes, m,
                  double(bytes) / (m * 1e3), rec_ms / m);
    }

    // ---- 2. TTFT on B for a RAG prompt ------------------------------------------------------
    test::DelayProxy slow(port_of(remote), delay_ms);
    auto make = [&](const std::string& url) {
      EngineOptions eo;
      eo.chunk_store.remote_url = url;
      return Engine::load(model, eo);
    };
    auto a = make(remote), b = make(remote), b_slow = make(slow.url());
    auto none = make("");
    std::vector<int64_t> starts;
    std::vector<int32_t> docs;
    for (int64_t d = 0; d < n_docs; ++d) {
      if (d) starts.push_back(int64_t(docs.size()));
      const std::vector<int32_t> t = random_tokens(doc_tokens, c.vocab_size, 9000 + uint32_t(d));
      docs.insert(docs.end(), t.begin(), t.end());
    }
    starts.push_back(int64_t(docs.size()));
    auto request = [&](Engine& e, const std::vector<int32_t>& ids, const std::string& ns, bool store = false) {
      GenerateOptions o;
      o.max_new_tokens = 1;
      o.sampling.temperature = 0;
      o.segment_starts = starts;
      o.cache_namespace = ns;
      o.reuse.store = store;  // B's own chunks would otherwise reach Redis and help the next engine
      return e.generate_ids(ids, o);
    };
    // Namespaces unique to this run: entries left in Redis by an earlier run must not be hits.
    const std::string run = std::to_string((long long)now_ms());
    // Each engine measures its prefill rate once first (the cost model's input), on its own namespace.
    for (Engine* e : {b.get(), b_slow.get(), none.get()}) request(*e, random_tokens(int64_t(docs.size()) + 16, c.vocab_size, 77), "warmup-" + run, false);
    std::vector<double> t_none, t_remote, t_slow;
    std::vector<int64_t> cached_remote, cached_slow;
    std::vector<int32_t> first_none, first_remote;
    for (int r = 0; r < reps; ++r) {
      std::vector<int32_t> ids = docs;
      const std::vector<int32_t> question = random_tokens(24, c.vocab_size, 300 + uint32_t(r));
      ids.insert(ids.end(), question.begin(), question.end());
      const std::string ns = "rag-" + run + "-" + std::to_string(r);  // fresh for every engine each round
      a->warm(docs, std::vector<int64_t>(starts.begin(), starts.end() - 1), ns);  // the documents, on A
      const GenerateResult n = request(*none, ids, ns);
      const GenerateResult x = request(*b, ids, ns);
      const GenerateResult s = request(*b_slow, ids, ns);
      t_none.push_back(n.ttft_ms), t_remote.push_back(x.ttft_ms), t_slow.push_back(s.ttft_ms);
      cached_remote.push_back(x.n_cached), cached_slow.push_back(s.n_cached);
      first_none.push_back(n.output_ids.at(0)), first_remote.push_back(x.output_ids.at(0));
    }
    const kv::RemoteStats rs = b->chunk_store()->stats().remote, ss = b_slow->chunk_store()->stats().remote;
    std::printf("\nRAG prompt: %lld documents x %lld tokens + 24 question tokens, warmed on engine A; TTFT on B, median of %d\n",
                (long long)n_docs, (long long)doc_tokens, reps);
    std::printf("  no remote tier:                 %9.1f ms\n", median(t_none));
    std::printf("  remote tier (loopback):         %9.1f ms  (%.1fx lower; cached tokens %lld; remote hits %lld, skipped %lld; "
                "same first token: %s)\n",
                median(t_remote), median(t_none) / median(t_remote), (long long)cached_remote.back(), (long long)rs.hits,
                (long long)rs.skipped, first_none == first_remote ? "yes" : "NO");
    std::printf("  remote tier, +%d ms RTT proxy:  %9.1f ms  (%.2fx the no-tier TTFT; cached tokens %lld; remote hits %lld, "
                "skipped %lld; rtt estimate %.1f ms)\n",
                2 * delay_ms, median(t_slow), median(t_slow) / median(t_none), (long long)cached_slow.back(),
                (long long)ss.hits, (long long)ss.skipped, ss.rtt_ms);
    std::printf("  cost model inputs on B: prefill %.0f tok/s, bandwidth %.0f MB/s, rtt %.2f ms\n", rs.prefill_tok_per_s,
                rs.mb_per_s, rs.rtt_ms);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "remote_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
