// kvboost bench stream: layer streaming under --weight-budget (issue 6). Measures this disk's
// sequential read bandwidth three ways with the page cache out of the picture (O_DIRECT pread,
// as the streamer reads; buffered pread and mmap + MADV_WILLNEED, each after
// posix_fadvise(DONTNEED) of the file and dropping pages behind the read), then runs prefill
// and greedy decode of a model with the budget and reports tokens/s, bytes read per token,
// achieved read bandwidth and decode's fraction of the disk limit (the bandwidth of the
// streamer's read method, measured before and after each run's decode / bytes read per token;
// KVBOOST_STREAM_IO=buffered switches both from O_DIRECT to buffered pread). --weight-budget 0 runs the same model fully resident for comparison. Run it
// under /usr/bin/time -v for the peak RSS (also printed from getrusage).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>

#include "cli_util.h"

namespace kvboost::cli {

namespace {

struct StreamArgs {
  std::string model, budget = "768M", head_quant = "auto";
  int64_t prompt = 64, decode = 8;
  int runs = 3;
  int threads = 0;
  bool no_disk = false;
  double disk_gb = 0;  // bytes of the files read per disk method (0: all, at most 4 GB)
  double limit_gb = 1.0;  // bytes read for the decode limit before and after each run
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double peak_rss_mib() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_maxrss) / 1024.0;  // KiB on Linux
}

std::vector<std::string> weight_files(const std::string& dir) {
  std::vector<std::string> out;
  if (const std::string g = gguf_model_file(dir); !g.empty()) return {g};
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  if (out.empty()) fail(dir, ": no weight files");
  return out;
}

// Sequential read of `files` in chunks of `chunk` bytes, at most `limit` bytes in all.
// method: 0 = O_DIRECT pread, 1 = buffered pread (+ fadvise DONTNEED behind),
// 2 = mmap with MADV_WILLNEED `ahead` chunks ahead, pages touched, MADV_DONTNEED +
// fadvise DONTNEED behind. Returns GB/s (1e9 bytes).
// `skip`: bytes of the first file not read (the embeddings, which stay resident: what the
// streamer reads is the layer region after them).
double read_bandwidth(const std::vector<std::string>& files, int method, size_t chunk, uint64_t limit, int ahead,
                      uint64_t skip) {
  chunk = (chunk + 4095) / 4096 * 4096;
  void* buf = nullptr;
  if (method != 2 && posix_memalign(&buf, 4096, chunk) != 0) fail("bench stream: cannot allocate ", chunk, " bytes");
  std::unique_ptr<void, void (*)(void*)> hold(buf, std::free);
  uint64_t total = 0;
  const double t0 = now_ms();
  volatile uint8_t sink = 0;
  for (const std::string& path : files) {
    if (total >= limit) break;
    const int fd = ::open(path.c_str(), O_RDONLY | (method == 0 ? O_DIRECT : 0));
    if (fd < 0) fail(path, ": cannot open", method == 0 ? " with O_DIRECT: " : ": ", std::strerror(errno));
    struct stat st {};
    ::fstat(fd, &st);
    const uint64_t size = uint64_t(st.st_size);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);  // nothing of it cached when we start
    const uint64_t first = &path == &files[0] ? std::min(skip, size) / 4096 * 4096 : 0;
    if (method < 2) {
      for (uint64_t off = first; off < size && total < limit;) {
        const ssize_t r = ::pread(fd, buf, chunk, off_t(off));
        if (r <= 0) break;
        if (method == 1) ::posix_fadvise(fd, off_t(off), r, POSIX_FADV_DONTNEED);
        off += uint64_t(r), total += uint64_t(r);
      }
    } else {
      const uint8_t* p = static_cast<const uint8_t*>(::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0));
      if (p == MAP_FAILED) fail(path, ": mmap failed");
      const uint64_t n_chunks = (size - first + chunk - 1) / chunk;
      auto range = [&](uint64_t c, uint64_t* len) {
        *len = std::min<uint64_t>(chunk, size - first - c * chunk);
        return const_cast<uint8_t*>(p + first + c * chunk);
      };
      uint64_t len = 0;
      for (uint64_t c = 0; c < n_chunks && c < uint64_t(ahead); ++c) ::madvise(range(c, &len), len, MADV_WILLNEED);
      for (uint64_t c = 0; c < n_chunks && total < limit; ++c) {
        if (c + uint64_t(ahead) < n_chunks) {
          uint8_t* q = range(c + uint64_t(ahead), &len);
          ::madvise(q, len, MADV_WILLNEED);
        }
        uint8_t* q = range(c, &len);
        for (uint64_t i = 0; i < len; i += 4096) sink = sink + q[i];
        ::madvise(q, len, MADV_DONTNEED);
        ::posix_fadvise(fd, off_t(first + c * chunk), off_t(len), POSIX_FADV_DONTNEED);
        total += len;
      }
      ::munmap(const_cast<uint8_t*>(p), size);
    }
    ::close(fd);
  }
  (void)sink;
  const double s = (now_ms() - t0) / 1000.0;
  return s > 0 ? double(total) / 1e9 / s : 0;
}

int32_t argmax(const std::vector<float>& v) {
  return int32_t(std::max_element(v.begin(), v.end()) - v.begin());
}

void run_stream(const StreamArgs& a) {
  if (a.threads > 0) set_num_threads(a.threads);
  const std::string dir = resolve_model_dir(a.model, true);
  const uint64_t budget = a.budget == "0" ? 0 : parse_bytes(a.budget, "--weight-budget");
  const std::vector<std::string> files = weight_files(dir);
  const ModelConfig cfg = gguf_model_file(dir).empty() ? ModelConfig::from_dir(dir) : ModelConfig::from_gguf(gguf_model_file(dir));
  uint64_t file_bytes = 0;
  for (const auto& f : files) file_bytes += uint64_t(std::filesystem::file_size(f));
  // The layer region: the files after the embeddings (safetensors order tensors by name, so
  // model.embed_tokens comes before model.layers.*; lm_head, when separate, is read too).
  const uint64_t embed_bytes = uint64_t(cfg.vocab_size * cfg.hidden_size) * 2;
  const uint64_t skip = files.size() == 1 ? embed_bytes : 0;
  const uint64_t layer_guess = (file_bytes - skip) / uint64_t(std::max<int64_t>(1, cfg.n_layers));
  std::printf("## kvboost bench stream: %s (%s, %lld layers, %.2f GB of weight files)\n\n", dir.c_str(),
              cfg.model_type.c_str(), (long long)cfg.n_layers, double(file_bytes) / 1e9);
  std::printf("%d compute threads; --weight-budget %s (%llu bytes); prompt %lld tokens, %lld decode steps, "
              "medians of %d runs\n\n",
              num_threads(), a.budget.c_str(), (unsigned long long)budget, (long long)a.prompt, (long long)a.decode,
              a.runs);

  double disk_direct = 0;
  if (!a.no_disk) {
    const uint64_t limit = a.disk_gb > 0 ? uint64_t(a.disk_gb * 1e9) : std::min<uint64_t>(file_bytes, uint64_t(4e9));
    std::printf("### Disk (sequential over the layer region, %.2f GB per method, chunks of %.0f MB = one layer, "
                "page cache bypassed)\n\n",
                double(std::min(limit, file_bytes - skip)) / 1e9, double(layer_guess) / 1e6);
    std::printf("| method | GB/s |\n|---|---|\n");
    const char* names[3] = {"pread O_DIRECT (the streamer's method; the limit)",
                            "pread buffered, fadvise DONTNEED before and behind",
                            "mmap, MADV_WILLNEED 2 layers ahead, MADV_DONTNEED + fadvise behind"};
    // Round robin, so that the methods share the disk's (and a VM host cache's) moods.
    std::vector<double> bw[3];
    for (int r = 0; r < std::max(1, a.runs); ++r)
      for (int m = 0; m < 3; ++m) bw[m].push_back(read_bandwidth(files, m, size_t(layer_guess), limit, 2, skip));
    for (int m = 0; m < 3; ++m) {
      std::string all;
      for (double x : bw[m]) all += (all.empty() ? "" : ", ") + std::to_string(x).substr(0, 4);
      std::printf("| %s | %.2f (%s) |\n", names[m], median(bw[m]), all.c_str());
    }
    disk_direct = median(bw[0]);
    std::printf("\n");
    std::fflush(stdout);
  }

  LoadOptions lo;
  lo.weight_budget = budget;
  lo.head_quant = parse_head_quant(a.head_quant, "--head-quant");
  const double tl = now_ms();
  auto model = Model::load(dir, lo);
  const double load_ms = now_ms() - tl;
  const Model& m = *model;
  const Model::StreamInfo si0 = m.stream_info();
  if (si0.streaming)
    std::printf("streaming: %lld slots of %.1f MB (%s), %.1f MB read per pass, %.1f MB resident outside the budget; "
                "load %.0f ms\n\n",
                (long long)si0.n_slots, double(si0.slot_bytes) / 1e6, si0.direct ? "O_DIRECT" : "buffered + fadvise",
                double(si0.pass_bytes) / 1e6, double(si0.resident_bytes) / 1e6, load_ms);
  else
    std::printf("resident: every weight memory-mapped and prefaulted; load %.0f ms\n\n", load_ms);

  const ModelConfig& c = m.config();
  std::mt19937 rng(7);
  std::vector<int32_t> prompt(size_t(a.prompt));
  for (auto& t : prompt) t = int32_t(1000 + rng() % uint32_t(std::max<int64_t>(1, std::min<int64_t>(c.vocab_size - 2000, 100000))));
  std::vector<float> logits(size_t(c.vocab_size));
  std::vector<double> pre_ms, dec_ms, lim_bw;
  uint64_t pre_bytes = 0, dec_bytes = 0, dec_steps = 0;
  double pre_read_ms = 0, dec_read_ms = 0, pre_wait = 0, dec_wait = 0, dec_wall = 0;
  for (int r = 0; r < a.runs; ++r) {
    KvCache kv(c, a.prompt + a.decode + 1);
    Model::StreamInfo s0 = m.stream_info();
    double t0 = now_ms();
    m.forward(prompt.data(), a.prompt, kv, logits.data());
    const double tp = now_ms() - t0;
    Model::StreamInfo s1 = m.stream_info();
    pre_ms.push_back(tp);
    pre_bytes += s1.bytes_read - s0.bytes_read, pre_read_ms += s1.read_ms - s0.read_ms, pre_wait += s1.wait_ms - s0.wait_ms;
    int32_t next = argmax(logits);
    // The decode limit's disk bandwidth, measured around each run's decode steps (same method:
    // O_DIRECT pread of layer-sized chunks).
    const uint64_t lim_bytes = uint64_t(a.limit_gb * 1e9);
    if (si0.streaming && lim_bytes) lim_bw.push_back(read_bandwidth(files, si0.direct ? 0 : 1, size_t(si0.slot_bytes), lim_bytes, 2, skip));
    const double td = now_ms();
    for (int64_t i = 0; i < a.decode; ++i) {
      t0 = now_ms();
      m.forward(&next, 1, kv, logits.data());
      dec_ms.push_back(now_ms() - t0);
      next = argmax(logits);
    }
    const double dwall = now_ms() - td;
    dec_wall += dwall;
    if (si0.streaming && lim_bytes) lim_bw.push_back(read_bandwidth(files, si0.direct ? 0 : 1, size_t(si0.slot_bytes), lim_bytes, 2, skip));
    Model::StreamInfo s2 = m.stream_info();
    dec_bytes += s2.bytes_read - s1.bytes_read, dec_read_ms += s2.read_ms - s1.read_ms, dec_wait += s2.wait_ms - s1.wait_ms;
    dec_steps += uint64_t(a.decode);
  }
  const double pm = median(pre_ms), dm = median(dec_ms);
  std::printf("### %s\n\n", si0.streaming ? "Streamed" : "Resident");
  std::printf("| phase | tokens/s | ms | bytes read per token | achieved read GB/s | reader busy GB/s | waiting for reads |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  const double pre_total_ms = [&] { double s = 0; for (double x : pre_ms) s += x; return s; }();
  auto gbs = [](uint64_t bytes, double ms) { return ms > 0 ? double(bytes) / 1e6 / ms : 0.0; };
  std::printf("| prefill %lld | %.2f | %.0f | %.1f MB | %.2f | %.2f | %.0f%% |\n", (long long)a.prompt,
              double(a.prompt) * 1000.0 / pm, pm, double(pre_bytes) / double(std::max(1, a.runs)) / double(a.prompt) / 1e6,
              gbs(pre_bytes, pre_total_ms), gbs(pre_bytes, pre_read_ms), pre_total_ms > 0 ? 100.0 * pre_wait / pre_total_ms : 0);
  const double bpt = dec_steps ? double(dec_bytes) / double(dec_steps) : 0;
  std::printf("| decode | %.3f | %.0f | %.1f MB | %.2f | %.2f | %.0f%% |\n\n", 1000.0 / dm, dm, bpt / 1e6,
              gbs(dec_bytes, dec_wall), gbs(dec_bytes, dec_read_ms), dec_wall > 0 ? 100.0 * dec_wait / dec_wall : 0);
  if (si0.streaming && bpt > 0 && (!lim_bw.empty() || disk_direct > 0)) {
    const double disk = lim_bw.empty() ? disk_direct : median(lim_bw);
    std::string all;
    for (double x : lim_bw) all += (all.empty() ? "" : ", ") + std::to_string(x).substr(0, 4);
    const double limit = disk * 1e9 / bpt;
    std::printf("decode limit = disk %.2f GB/s (%s, median of the reads before and after each run's "
                "decode: %s) / %.1f MB per token = %.3f tokens/s; decode achieves %.0f%% of it\n\n",
                disk, si0.direct ? "O_DIRECT pread" : "buffered pread + fadvise DONTNEED", all.c_str(), bpt / 1e6,
                limit, 100.0 * (1000.0 / dm) / limit);
  }
  std::printf("peak RSS %.0f MiB (getrusage)\n", peak_rss_mib());
}

}  // namespace

void add_bench_stream(CLI::App* bench) {
  auto a = std::make_shared<StreamArgs>();
  CLI::App* c = bench->add_subcommand("stream", "Layer streaming under --weight-budget: disk limit, prefill/decode tokens/s, bytes per token");
  c->add_option("-m,--model", a->model, "Model directory, .gguf file or Hugging Face id ORG/NAME[@REV] (default: the demo model)");
  c->add_option("--weight-budget", a->budget, "Bytes of layer matrices in memory, e.g. 768M; 0 = fully resident")->capture_default_str();
  c->add_option("--head-quant", a->head_quant, kHeadQuantHelp)->capture_default_str();
  c->add_option("--prompt", a->prompt, "Prompt tokens (random ids)")->capture_default_str()->check(CLI::Range(1, 100000));
  c->add_option("--decode", a->decode, "Greedy decode steps per run")->capture_default_str()->check(CLI::Range(1, 100000));
  c->add_option("--runs", a->runs, "Runs (medians)")->capture_default_str()->check(CLI::Range(1, 100));
  c->add_option("--threads", a->threads, "Compute threads (default: all cores)");
  c->add_flag("--no-disk", a->no_disk, "Skip the disk bandwidth measurement");
  c->add_option("--disk-gb", a->disk_gb, "GB read per disk method (default: the weight files, at most 4)");
  c->add_option("--limit-gb", a->limit_gb, "GB read (O_DIRECT) before and after each run's decode for the decode limit; 0: use the disk table")
      ->capture_default_str();
  c->callback([a] { run_stream(*a); });
}

}  // namespace kvboost::cli
