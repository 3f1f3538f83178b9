// The GPU decoder (built only with -DKVBOOST_CUDA=ON): the Llama-family forward pass of
// the CPU decoder (src/model/forward.cpp, arch/) on the device, with layer weights resident or streamed from pinned host
// memory through S device slots.
//
// Layer streaming. Each layer's weights are packed into one contiguous block (matrices in their
// file dtype, norms and biases as f32, every piece 256-byte aligned), so a layer is one
// cudaMemcpyAsync. Layers are numbered globally across passes (g = pass * L + l) and layer g
// lives in slot g % S. Before the compute stream runs g, the host has issued on the copy stream
// the copies of g .. g + S - 1 (into the next passes too, so the first layers of the next token
// load while this one finishes); the copy of g' waits on the event "slot free" recorded after
// the compute of g' - S, and the compute of g waits on the event "slot filled" recorded after
// its copy. Enqueue order makes each wait see the right record of the reused events (see
// issue_through). Resident mode stores the same packed blocks, so both modes run the same kernels
// on the same bytes.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

#include "device_weights.h"

namespace kvboost::gpu {

// The weight layout and buffers (device_weights.h), shared with the engine's paged runner.
using namespace dev;

bool built_with_cuda() { return true; }

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver / no device" error
    return 0;
  }
  return n;
}

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

DeviceInfo device_info(int device) {
  require_device(device);
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties");
  DeviceInfo d;
  d.name = p.name;
  d.cc_major = p.major, d.cc_minor = p.minor, d.sm_count = p.multiProcessorCount;
  check(cudaMemGetInfo(&d.free_bytes, &d.total_bytes), "cudaMemGetInfo");
  return d;
}

double pinned_h2d_gbps(size_t bytes, int reps, int device) {
  require_device(device);
  HostBuf h(bytes);
  std::memset(h.p, 1, bytes);
  DevBuf d(bytes);
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "cudaEventCreate");
  check(cudaEventCreate(&b), "cudaEventCreate");
  // Four copies back to back per timing, as layer streaming queues them (a single copy's start-up
  // cost made the figure about 7% low on an H200).
  constexpr int kBatch = 4;
  std::vector<double> gbps;
  for (int r = 0; r <= std::max(1, reps); ++r) {
    check(cudaEventRecord(a, s), "cudaEventRecord");
    for (int i = 0; i < kBatch; ++i)
      check(cudaMemcpyAsync(d.p, h.p, bytes, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync");
    check(cudaEventRecord(b, s), "cudaEventRecord");
    check(cudaEventSynchronize(b), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
    if (r > 0) gbps.push_back(double(kBatch) * double(bytes) / (double(ms) * 1e6));
  }
  cudaEventDestroy(a), cudaEventDestroy(b), cudaStreamDestroy(s);
  return median(gbps);
}

struct Decoder::Impl {
  DecoderOptions opt;
  ModelConfig c;
  std::vector<float> inv_freq;
  int64_t L = 0, H = 0, I = 0, hd = 0, nq = 0, nkv = 0;
  std::vector<LayerLayout> layouts;
  size_t slot_bytes = 0;  // the largest layer block
  std::vector<size_t> host_off;  // streamed: layer l's block at host.as<uint8_t>() + host_off[l]

  // Weights.
  DevBuf resident;   // resident mode: all layer blocks, at dev_off[l]
  std::vector<size_t> dev_off;
  DevBuf slots;      // streamed mode: S blocks of slot_bytes
  HostBuf host;      // streamed mode: all layer blocks, pinned
  DevBuf embed_w, lm_head_w, final_norm;
  WType embed_wt = WType::F32, lm_head_wt = WType::F32;
  const void* lm_head_ptr = nullptr;
  int64_t S = 0;

  // Streams, events, cuBLAS.
  cudaStream_t compute = nullptr, copy = nullptr;
  std::vector<cudaEvent_t> filled, freed;
  cublasHandle_t blas = nullptr;
  DevBuf blas_ws;
  int64_t issued = 0, started = 0;  // global layer numbers: copies issued, computes enqueued

  // K/V cache and activations.
  DevBuf kcache, vcache;  // [L][max_tokens][nkv] f32
  int64_t n_past = 0;
  DevBuf x, h, q, k, v, att, gate, up, xh, cs, sn, tok, logits;
  DevBuf wq;  // AWQ prefill: one matrix dequantized to bf16 (cuda::matmul_q4), when a layer holds 4-bit weights
  HostBuf stage;  // tokens + cos + sin of one pass
  DecoderStats stats;

  ~Impl() {
    if (compute) cudaStreamSynchronize(compute);
    if (copy) cudaStreamSynchronize(copy);
    for (auto e : filled) cudaEventDestroy(e);
    for (auto e : freed) cudaEventDestroy(e);
    if (blas) cublasDestroy(blas);
    if (compute) cudaStreamDestroy(compute);
    if (copy) cudaStreamDestroy(copy);
  }

  LayerPtrs ptrs(const uint8_t* base, int64_t l) const {
    const LayerLayout& lay = layouts[size_t(l)];
    LayerPtrs p{};
    for (int i = 0; i < 7; ++i) p.m[i] = base + lay.piece[i].off;
    for (int i = 0; i < 8; ++i) p.v[i] = lay.piece[7 + i].present ? reinterpret_cast<const float*>(base + lay.piece[7 + i].off) : nullptr;
    return p;
  }

  void issue(int64_t g) {  // copy of global layer g into slot g % S
    const int64_t l = g % L, s = g % S;
    if (g >= S) check(cudaStreamWaitEvent(copy, freed[size_t(s)], 0), "cudaStreamWaitEvent(slot free)");
    check(cudaMemcpyAsync(slots.as<uint8_t>() + size_t(s) * slot_bytes, host.as<uint8_t>() + host_off[size_t(l)],
                          layouts[size_t(l)].bytes, cudaMemcpyHostToDevice, copy),
          "cudaMemcpyAsync(layer)");
    check(cudaEventRecord(filled[size_t(s)], copy), "cudaEventRecord(slot filled)");
    stats.bytes_h2d += layouts[size_t(l)].bytes;
    ++stats.layer_copies;
  }
  // Issues copies through global layer `last`. The copy of g' waits on freed[g' % S], whose
  // latest record must be the compute of g' - S: computes through started - 1 are enqueued and
  // g' <= started + S - 1 keeps g' - S <= started - 1, the latest of its slot.
  void issue_through(int64_t last) {
    while (issued <= last) issue(issued++);
  }

  void run_layer(int64_t l, const uint8_t* base, int64_t n) {
    const LayerPtrs w = ptrs(base, l);
    const LayerLayout& lay = layouts[size_t(l)];
    const float eps = float(c.rms_norm_eps), scale = 1.0f / std::sqrt(float(hd));
    cudaStream_t s = compute;
    auto mm = [&](const float* in, int id, const float* bias, float* out, int64_t N, int64_t K) {
      const WType wt = lay.piece[id].wt;
      if (wt == WType::Q4_Z || wt == WType::Q4_Z128) cuda::matmul_q4(blas, in, w.m[id], wt, bias, out, n, N, K, wq.p, xh.p, s);
      else cuda::matmul(blas, in, w.m[id], wt, bias, out, n, N, K, xh.p, s);
    };
    cuda::rms_norm(x.as<float>(), w.v[kAttnNorm - 7], h.as<float>(), n, H, eps, s);
    mm(h.as<float>(), kWq, w.v[kQBias - 7], q.as<float>(), nq, H);
    mm(h.as<float>(), kWk, w.v[kKBias - 7], k.as<float>(), nkv, H);
    mm(h.as<float>(), kWv, w.v[kVBias - 7], v.as<float>(), nkv, H);
    if (c.qk_norm) {
      cuda::rms_norm(q.as<float>(), w.v[kQNorm - 7], q.as<float>(), n * c.n_heads, hd, eps, s);
      cuda::rms_norm(k.as<float>(), w.v[kKNorm - 7], k.as<float>(), n * c.n_kv_heads, hd, eps, s);
    }
    cuda::rope_rotate_half(q.as<float>(), cs.as<float>(), sn.as<float>(), n, c.n_heads, hd, s);
    cuda::rope_rotate_half(k.as<float>(), cs.as<float>(), sn.as<float>(), n, c.n_kv_heads, hd, s);
    float* kc = kcache.as<float>() + size_t(l) * size_t(opt.max_tokens * nkv);
    float* vc = vcache.as<float>() + size_t(l) * size_t(opt.max_tokens * nkv);
    check(cudaMemcpyAsync(kc + n_past * nkv, k.p, size_t(n * nkv) * 4, cudaMemcpyDeviceToDevice, s), "copy K");
    check(cudaMemcpyAsync(vc + n_past * nkv, v.p, size_t(n * nkv) * 4, cudaMemcpyDeviceToDevice, s), "copy V");
    cuda::attention(q.as<float>(), kc, vc, att.as<float>(), n, n_past, n_past + n, c.n_heads, c.n_kv_heads, hd,
                    lay.window, scale, s);
    mm(att.as<float>(), kWo, w.v[kOBias - 7], h.as<float>(), H, nq);
    cuda::add_inplace(x.as<float>(), h.as<float>(), n * H, s);
    cuda::rms_norm(x.as<float>(), w.v[kMlpNorm - 7], h.as<float>(), n, H, eps, s);
    mm(h.as<float>(), kGate, nullptr, gate.as<float>(), I, H);
    mm(h.as<float>(), kUp, nullptr, up.as<float>(), I, H);
    cuda::silu_mul(gate.as<float>(), up.as<float>(), gate.as<float>(), n * I, s);
    mm(gate.as<float>(), kDown, nullptr, h.as<float>(), H, I);
    cuda::add_inplace(x.as<float>(), h.as<float>(), n * H, s);
  }

  // One pass of n <= max_batch tokens; logits of the last n_logits rows into out (or none).
  void pass(const int32_t* tokens, int64_t n, float* out, int64_t n_logits) {
    const int64_t half = hd / 2;
    int32_t* st = stage.as<int32_t>();
    std::memcpy(st, tokens, size_t(n) * 4);
    float* cs_h = reinterpret_cast<float*>(stage.as<uint8_t>() + align_up(size_t(opt.max_batch) * 4));
    float* sn_h = cs_h + opt.max_batch * half;
    // The CPU decoder's tables (src/model/forward.cpp rope_tables): float angle, cos/sin in double.
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < half; ++i) {
        const float ang = float(n_past + t) * inv_freq[size_t(i)];
        cs_h[t * half + i] = float(std::cos(double(ang)));
        sn_h[t * half + i] = float(std::sin(double(ang)));
      }
    cudaStream_t s = compute;
    check(cudaMemcpyAsync(tok.p, st, size_t(n) * 4, cudaMemcpyHostToDevice, s), "upload tokens");
    check(cudaMemcpyAsync(cs.p, cs_h, size_t(n * half) * 4, cudaMemcpyHostToDevice, s), "upload cos");
    check(cudaMemcpyAsync(sn.p, sn_h, size_t(n * half) * 4, cudaMemcpyHostToDevice, s), "upload sin");
    cuda::embed(tok.as<int32_t>(), embed_w.p, embed_wt, x.as<float>(), n, H, s);
    for (int64_t l = 0; l < L; ++l) {
      if (S == 0) {
        run_layer(l, resident.as<uint8_t>() + dev_off[size_t(l)], n);
        continue;
      }
      const int64_t g = started;
      issue_through(g + S - 1);
      const int64_t slot = g % S;
      check(cudaStreamWaitEvent(s, filled[size_t(slot)], 0), "cudaStreamWaitEvent(slot filled)");
      run_layer(l, slots.as<uint8_t>() + size_t(slot) * slot_bytes, n);
      check(cudaEventRecord(freed[size_t(slot)], s), "cudaEventRecord(slot free)");
      ++started;
    }
    if (S > 0) issue_through(started + S - 1);  // the next pass's first layers, behind lm_head
    if (n_logits > 0) {
      const float* last = x.as<float>() + (n - n_logits) * H;
      cuda::rms_norm(last, final_norm.as<float>(), h.as<float>(), n_logits, H, float(c.rms_norm_eps), s);
      if (logits.bytes < size_t(n_logits * c.vocab_size) * 4) logits = DevBuf(size_t(n_logits * c.vocab_size) * 4);
      cuda::matmul(blas, h.as<float>(), lm_head_ptr, lm_head_wt, nullptr, logits.as<float>(), n_logits,
                   c.vocab_size, H, xh.p, s);
      check(cudaMemcpyAsync(out, logits.p, size_t(n_logits * c.vocab_size) * 4, cudaMemcpyDeviceToHost, s),
            "download logits");
    }
    // The staging buffer is reused by the next pass; the logits must be on the host.
    check(cudaStreamSynchronize(s), "forward pass");
    n_past += n;
    ++stats.passes;
    stats.tokens += n;
  }
};


Decoder::Decoder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Decoder::~Decoder() = default;

std::unique_ptr<Decoder> Decoder::create(const Model& model, const DecoderOptions& opt) {
  // Gemma 3's extra norms, GELU gate, embedding scale and local RoPE base are CPU-only so far.
  if (model.config().model_type == "gemma3") fail("GPU decoder: model_type gemma3 is not supported yet (the CPU decoder runs it)");
  if (opt.stream_slots == 1 || opt.stream_slots < 0)
    fail("GPU decoder: stream_slots = ", opt.stream_slots, " (0 = resident, or at least 2 slots)");
  if (opt.max_tokens <= 0 || opt.max_batch <= 0)
    fail("GPU decoder: max_tokens = ", opt.max_tokens, ", max_batch = ", opt.max_batch, " (both must be > 0)");
  require_device(opt.device);
  auto m = std::make_unique<Impl>();
  m->opt = opt;
  m->c = model.config();
  m->inv_freq = model.rope_inv_freq();
  const ModelConfig& c = m->c;
  m->L = c.n_layers, m->H = c.hidden_size, m->I = c.intermediate_size, m->hd = c.head_dim;
  m->nq = c.n_heads * c.head_dim, m->nkv = c.n_kv_heads * c.head_dim;
  if (opt.max_tokens > cuda::attention_max_tokens(m->hd))
    fail("GPU decoder: max_tokens = ", opt.max_tokens, " exceeds the attention kernel's limit of ",
         cuda::attention_max_tokens(m->hd), " for head_dim ", m->hd);
  // The files again (memory-mapped, not copied): Model keeps its Weight views private.
  const std::string& dir = model.dir();
  const std::string g = gguf_model_file(dir);
  // GGUF quantized tensors dequantized to f32 at load (the CUDA kernels take F32/F16/BF16).
  const WeightFiles f = g.empty() ? WeightFiles::open_dir(dir) : WeightFiles::open_gguf(g, /*keep_quantized=*/false);

  for (int64_t l = 0; l < m->L; ++l) {
    m->layouts.push_back(layout_of(f, dir, c, l));
    m->slot_bytes = std::max(m->slot_bytes, m->layouts.back().bytes);
  }
  std::vector<size_t> offs;
  size_t total = 0;
  for (const auto& lay : m->layouts) offs.push_back(total), total += lay.bytes;

  const TensorInfo& emb = tensor(f, dir, "model.embed_tokens.weight", {c.vocab_size, m->H});
  m->embed_wt = wtype_of(emb);
  m->embed_w = upload(emb);
  if (c.tie_word_embeddings) {
    m->lm_head_ptr = m->embed_w.p, m->lm_head_wt = m->embed_wt;
  } else {
    const TensorInfo& lm = tensor(f, dir, "lm_head.weight", {c.vocab_size, m->H});
    m->lm_head_wt = wtype_of(lm);
    m->lm_head_w = upload(lm);
    m->lm_head_ptr = m->lm_head_w.p;
  }
  {
    const TensorInfo& fn = tensor(f, dir, "model.norm.weight", {m->H});
    std::vector<float> v(size_t(m->H));
    kernels::to_f32(fn.data, wtype_of(fn), v.data(), m->H);
    m->final_norm = DevBuf(v.size() * 4);
    check(cudaMemcpy(m->final_norm.p, v.data(), v.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy(norm)");
  }

  check(cudaStreamCreateWithFlags(&m->compute, cudaStreamNonBlocking), "cudaStreamCreate(compute)");
  m->S = opt.stream_slots;
  if (m->S == 0) {
    m->resident = DevBuf(total);
    m->dev_off = offs;
    std::vector<uint8_t> buf(m->slot_bytes);
    for (int64_t l = 0; l < m->L; ++l) {
      pack_layer(f, dir, c, l, m->layouts[size_t(l)], buf.data());
      check(cudaMemcpy(m->resident.as<uint8_t>() + offs[size_t(l)], buf.data(), m->layouts[size_t(l)].bytes,
                       cudaMemcpyHostToDevice),
            "cudaMemcpy(layer)");
    }
  } else {
    m->host = HostBuf(total);
    m->host_off = offs;
    for (int64_t l = 0; l < m->L; ++l) pack_layer(f, dir, c, l, m->layouts[size_t(l)], m->host.as<uint8_t>() + offs[size_t(l)]);
    m->slots = DevBuf(size_t(m->S) * m->slot_bytes);
    check(cudaStreamCreateWithFlags(&m->copy, cudaStreamNonBlocking), "cudaStreamCreate(copy)");
    for (int64_t s = 0; s < m->S; ++s) {
      cudaEvent_t a, b;
      check(cudaEventCreateWithFlags(&a, cudaEventDisableTiming), "cudaEventCreate");
      check(cudaEventCreateWithFlags(&b, cudaEventDisableTiming), "cudaEventCreate");
      m->filled.push_back(a), m->freed.push_back(b);
    }
  }

  // cuBLAS on the compute stream with a fixed workspace (run-to-run identical results).
  check(cublasCreate(&m->blas), "cublasCreate");
  check(cublasSetStream(m->blas, m->compute), "cublasSetStream");
  check(cublasSetMathMode(m->blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");  // no TF32
  m->blas_ws = DevBuf(size_t(32) << 20);
  check(cublasSetWorkspace(m->blas, m->blas_ws.p, m->blas_ws.bytes), "cublasSetWorkspace");

  const int64_t B = opt.max_batch, T = opt.max_tokens;
  const size_t kv_bytes = size_t(m->L * T * m->nkv) * 4;
  m->kcache = DevBuf(kv_bytes), m->vcache = DevBuf(kv_bytes);
  m->x = DevBuf(size_t(B * m->H) * 4), m->h = DevBuf(size_t(B * m->H) * 4);
  m->q = DevBuf(size_t(B * m->nq) * 4), m->att = DevBuf(size_t(B * m->nq) * 4);
  m->k = DevBuf(size_t(B * m->nkv) * 4), m->v = DevBuf(size_t(B * m->nkv) * 4);
  m->gate = DevBuf(size_t(B * m->I) * 4), m->up = DevBuf(size_t(B * m->I) * 4);
  m->xh = DevBuf(size_t(B * std::max({m->H, m->I, m->nq})) * 2);
  m->cs = DevBuf(size_t(B * m->hd / 2) * 4), m->sn = DevBuf(size_t(B * m->hd / 2) * 4);
  m->tok = DevBuf(size_t(B) * 4);
  bool q4 = false;
  for (const auto& lay : m->layouts)
    for (const Piece& pc : lay.piece) q4 = q4 || (pc.present && (pc.wt == WType::Q4_Z || pc.wt == WType::Q4_Z128));
  if (q4 && B > cuda::kGemvMaxM) m->wq = DevBuf(size_t(std::max({m->nq * m->H, m->nkv * m->H, m->I * m->H})) * 2);
  m->stage = HostBuf(align_up(size_t(B) * 4) + size_t(B * m->hd) * 4);
  return std::unique_ptr<Decoder>(new Decoder(std::move(m)));
}

void Decoder::forward(const int32_t* tokens, int64_t n, float* logits, bool all_logits) {
  Impl& m = *impl_;
  if (n <= 0) fail("GPU forward: no tokens");
  for (int64_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= m.c.vocab_size)
      fail("token id ", tokens[i], " is outside the vocabulary [0, ", m.c.vocab_size, ")");
  if (m.n_past + n > m.opt.max_tokens)
    fail("GPU forward: ", m.n_past + n, " tokens exceed the K/V capacity of ", m.opt.max_tokens, " (max_tokens)");
  const int64_t V = m.c.vocab_size;
  for (int64_t done = 0; done < n;) {
    const int64_t chunk = std::min(m.opt.max_batch, n - done);
    const bool last = done + chunk == n;
    int64_t n_logits = 0;
    float* out = nullptr;
    if (all_logits) n_logits = chunk, out = logits + done * V;
    else if (last) n_logits = 1, out = logits;
    if (!logits) n_logits = 0;
    m.pass(tokens + done, chunk, out, n_logits);
    done += chunk;
  }
}

int64_t Decoder::size() const { return impl_->n_past; }
void Decoder::reset() { impl_->n_past = 0; }
const DecoderOptions& Decoder::options() const { return impl_->opt; }
bool Decoder::streamed() const { return impl_->S > 0; }
int64_t Decoder::n_layers() const { return impl_->L; }
size_t Decoder::layer_bytes() const { return impl_->slot_bytes; }
size_t Decoder::device_weight_bytes() const {
  const Impl& m = *impl_;
  return m.resident.bytes + m.slots.bytes + m.embed_w.bytes + m.lm_head_w.bytes + m.final_norm.bytes;
}
const DecoderStats& Decoder::stats() const { return impl_->stats; }
void Decoder::reset_stats() { impl_->stats = DecoderStats{}; }

double Decoder::time_layer_copies(int reps) {
  Impl& m = *impl_;
  if (m.S == 0) fail("time_layer_copies: the decoder is resident (stream_slots = 0)");
  check(cudaStreamSynchronize(m.compute), "sync");
  check(cudaStreamSynchronize(m.copy), "sync");
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "cudaEventCreate");
  check(cudaEventCreate(&b), "cudaEventCreate");
  std::vector<double> ms;
  for (int r = 0; r <= std::max(1, reps); ++r) {
    check(cudaEventRecord(a, m.copy), "cudaEventRecord");
    for (int64_t l = 0; l < m.L; ++l)
      check(cudaMemcpyAsync(m.slots.as<uint8_t>() + size_t(l % m.S) * m.slot_bytes, m.host.as<uint8_t>() + m.host_off[size_t(l)],
                            m.layouts[size_t(l)].bytes, cudaMemcpyHostToDevice, m.copy),
            "cudaMemcpyAsync(layer)");
    check(cudaEventRecord(b, m.copy), "cudaEventRecord");
    check(cudaEventSynchronize(b), "cudaEventSynchronize");
    float t = 0;
    check(cudaEventElapsedTime(&t, a, b), "cudaEventElapsedTime");
    if (r > 0) ms.push_back(t);
  }
  cudaEventDestroy(a), cudaEventDestroy(b);
  // The slots now hold whatever was copied last: drop the prefetched layers (every event has
  // completed, so the next pass re-issues them and its waits are satisfied).
  m.issued = m.started;
  return median(ms);
}

}  // namespace kvboost::gpu
