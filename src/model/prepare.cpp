// Weight preparation after binding (load.cpp): the output projection quantized into blocks
// (LoadOptions::head_quant), matrices repacked into kernel panels (pack_weights), the layer
// streamer planned under a weight budget, prefaulting, and giving back memory that nothing reads
// any more. RoPE tables are computed here too.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numbers>

#include "layer_stream.h"
#include "model_impl.h"

namespace kvboost {

using kernels::WType;

HeadQuant parse_head_quant(const std::string& s, const std::string& what) {
  std::string v = s;
  for (char& ch : v) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  for (HeadQuant q : {HeadQuant::Auto, HeadQuant::None, HeadQuant::Q8_0, HeadQuant::Q6_K, HeadQuant::Q4_0})
    if (v == head_quant_name(q)) return q;
  fail(what, ": \"", s, "\" is not a head quantization (auto, none, q8_0, q6_k, q4_0)");
}

const char* head_quant_name(HeadQuant q) {
  switch (q) {
    case HeadQuant::Auto: return "auto";
    case HeadQuant::None: return "none";
    case HeadQuant::Q8_0: return "q8_0";
    case HeadQuant::Q6_K: return "q6_k";
    case HeadQuant::Q4_0: return "q4_0";
  }
  return "?";
}

namespace detail {

// Hugging Face's inv_freq, in float32 as torch computes it, with llama3 / linear scaling.
std::vector<float> compute_inv_freq(const ModelConfig& c, double theta) {
  const int64_t half = c.head_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv[size_t(i)] = 1.0f / std::pow(float(theta), float(2 * i) / float(c.head_dim));
  const RopeScaling& rs = c.rope_scaling;
  if (rs.type == "linear") {
    for (auto& f : inv) f = float(f / rs.factor);
  } else if (rs.type == "llama3") {
    const double old_ctx = double(rs.original_max_position_embeddings);
    const double low_wavelen = old_ctx / rs.low_freq_factor;
    const double high_wavelen = old_ctx / rs.high_freq_factor;
    for (auto& f : inv) {
      const double wavelen = 2 * std::numbers::pi / f;
      if (wavelen > low_wavelen) {
        f = float(f / rs.factor);
      } else if (wavelen >= high_wavelen) {
        const double smooth = (old_ctx / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
        f = float((1 - smooth) * f / rs.factor + smooth * f);
      }
    }
  }
  return inv;
}

// LoadOptions::head_quant: the [vocab, hidden] head converted row by row (f32 -> blocks) into
// an owned buffer; m.embed keeps pointing at the stored table.
void quantize_head(ModelImpl& m, const LoadOptions& opt, bool awq) {
  HeadQuant q = opt.head_quant;
  if (q == HeadQuant::Auto) q = awq ? HeadQuant::Q8_0 : HeadQuant::None;
  if (q == HeadQuant::None || kernels::wtype_is_quantized(m.lm_head.type)) return;  // GGUF blocks stay
  const int64_t V = m.lm_head.rows, H = m.lm_head.cols;
  WType wt = q == HeadQuant::Q8_0 ? WType::Q8_0 : q == HeadQuant::Q6_K ? WType::Q6_K : WType::Q4_0;
  if (wt == WType::Q6_K && H % kernels::wtype_block_elems(wt) != 0) {
    std::fprintf(stderr, "kvboost: %s: head_quant q6_k needs rows of whole 256-element blocks, hidden_size is %lld: "
                 "using q8_0 for the output projection\n", m.dir.c_str(), (long long)H);
    wt = WType::Q8_0;
  }
  if (H % kernels::wtype_block_elems(wt) != 0) {
    if (opt.head_quant == HeadQuant::Auto) return;
    fail(m.dir, ": head_quant ", head_quant_name(q), ": hidden_size ", H, " is not a multiple of the ",
         kernels::wtype_name(wt), " block of ", kernels::wtype_block_elems(wt));
  }
  const size_t src_rb = size_t(kernels::wtype_row_bytes(m.lm_head.type, H));
  const size_t rb = size_t(kernels::wtype_row_bytes(wt, H));
  std::vector<uint8_t> store(size_t(V) * rb);
  const uint8_t* src = static_cast<const uint8_t*>(m.lm_head.data);
  const WType st = m.lm_head.type;
  parallel_for(V, 1, 64, [&](int64_t b, int64_t e) {
    std::vector<float> row(static_cast<size_t>(H));
    for (int64_t r = b; r < e; ++r) {
      kernels::to_f32(src + size_t(r) * src_rb, st, row.data(), H);
      kernels::quantize_row(row.data(), wt, store.data() + size_t(r) * rb, H);
    }
  });
  m.lm_head_store = std::move(store);
  m.lm_head = Weight{m.lm_head_store.data(), wt, V, H};
}

// LoadOptions::pack_weights: each plain matrix into PackedWeight panels, the stored copy
// dropped right after (mapped pages MADV_DONTNEED, owned buffers freed). The head goes first:
// peak memory is then about the packed total plus one layer matrix (the largest, the head,
// is packed while nothing else is resident yet), not plus the head. A tied table is packed
// once and serves both the head and the embedding lookup (kernels::packed_row).
size_t pack_weights(ModelImpl& m, const LoadOptions& opt) {
  if (!opt.pack_weights) return 0;
  if (const char* e = std::getenv("KVBOOST_PACK_WEIGHTS"); e && std::string(e) == "0") return 0;
  const bool tied = m.lm_head.data == m.embed.data;
  std::vector<Weight*> todo = {&m.lm_head};
  for (LayerWeights& L : m.layers)
    for (Weight* w : layer_mats(L)) todo.push_back(w);
  size_t total = 0, done = 0;
  for (const Weight* w : todo)
    if (w->data && !kernels::wtype_is_quantized(w->type)) total += matrix_bytes(*w);
  for (Weight* w : todo) {
    if (!w->data || kernels::wtype_is_quantized(w->type)) continue;
    const void* raw = w->data;
    const size_t nb = matrix_bytes(*w);
    auto pw = std::make_unique<kernels::PackedWeight>(kernels::pack_weight(raw, w->type, w->rows, w->cols));
    w->data = pw->data();
    w->packed = pw.get();
    m.packed.push_back(std::move(pw));
    if (w == &m.lm_head && tied) m.embed = m.lm_head;
    if (m.files.locate(raw, nb, nullptr, nullptr)) {
      // Whole pages inside the tensor only (the edge pages may hold a neighbour's bytes).
      const uintptr_t b = (uintptr_t(raw) + 4095) & ~uintptr_t(4095), e = (uintptr_t(raw) + nb) & ~uintptr_t(4095);
      if (e > b) ::madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED);
    } else {
      m.files.release_owned(raw);
    }
    done += nb;
    if (opt.progress) opt.progress("packing", done, total);
  }
  return done;
}


void prefault(const ModelImpl& m, const LoadOptions& opt, size_t packed_bytes) {
  if (opt.prefault && !m.stream && packed_bytes == 0) {
    m.files.prefault([&](size_t done, size_t total) {
      if (opt.progress) opt.progress("weights", done, total);
    });
  } else if (opt.prefault) {
    // Streaming: only what stays resident is paged in (the layer matrices are never touched
    // through the mapping, so they cost no memory there). Packed: the packed copies are
    // resident already; what is still read in the stored layout (an embedding table beside a
    // packed or quantized head, quantized matrices) is paged in.
    std::vector<const Weight*> res = {&m.embed};
    if (m.lm_head.data != m.embed.data) res.push_back(&m.lm_head);
    if (!m.stream)
      for (const LayerWeights& L : m.layers)
        for (const Weight* w : layer_mats(L)) res.push_back(w);
    size_t total = 0;
    for (const Weight* r : res)
      if (r->data && !r->packed) total += matrix_bytes(*r);
    size_t done = 0;
    volatile uint8_t sink = 0;
    for (const Weight* r : res) {
      if (!r || !r->data || r->packed) continue;
      const uint8_t* p = static_cast<const uint8_t*>(r->data);
      const size_t nb = matrix_bytes(*r);
      for (size_t i = 0; i < nb; i += 4096) sink = sink + p[i];
      done += nb;
      if (opt.progress) opt.progress("weights", std::min(done, total), total);
    }
    if (opt.progress) opt.progress("weights", total, total);
    (void)sink;
  }
}

void drop_float_head(ModelImpl& m, const ModelConfig& c, const void* float_head) {
  // An untied float head that was quantized is never read again: give its memory back (pages
  // of the mapping drop out of this process, an owned buffer is freed).
  if (!m.lm_head_store.empty() && !c.tie_word_embeddings && float_head) {
    const size_t nb = size_t(c.vocab_size) * size_t(kernels::wtype_row_bytes(wtype_of(*m.files.find("lm_head.weight")), c.hidden_size));
    if (m.files.locate(float_head, nb, nullptr, nullptr)) {
      const uintptr_t b = (uintptr_t(float_head) + 4095) & ~uintptr_t(4095), e = (uintptr_t(float_head) + nb) & ~uintptr_t(4095);
      if (e > b) ::madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED);
    } else {
      m.files.release_owned(float_head);
    }
  }
}

// Plans what each layer streams and from where. Matrices inside a mapped weight file are read
// from that file; matrices that live in owned buffers (re-laid-out at load: GGUF Q/K rows
// un-permuted, dequantized or repacked tensors) have no file offset, so they are written once
// into a scratch file in $TMPDIR (unlinked as soon as it is open: deleted at exit, even after
// a crash) and their buffers are freed, so that they stream like the rest.
void setup_streaming(ModelImpl& m, const ModelConfig& c, const LoadOptions& opt) {
  std::vector<std::string> paths;
  std::vector<std::vector<stream::TensorRef>> refs(size_t(c.n_layers));
  struct Copy {
    const void* src;
    uint64_t n, off;
  };
  std::vector<Copy> copies;
  int scratch = -1;
  uint64_t scratch_end = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    for (int i = 0; i < kLayerMats; ++i) {
      const std::string name = "model.layers." + std::to_string(l) + "." + arch::tensor(*m.arch, kLayerMatRoles[i])->hf;
      const TensorInfo* t = m.files.find(name);
      if (!t || !t->data) fail(m.dir, ": layer streaming: tensor \"", name, "\" has no data");
      std::string path;
      uint64_t off = 0;
      if (m.files.locate(t->data, t->nbytes, &path, &off)) {
        auto it = std::find(paths.begin(), paths.end(), path);
        const int idx = int(it - paths.begin());
        if (it == paths.end()) paths.push_back(path);
        refs[size_t(l)].push_back({idx, off, t->nbytes});
      } else {
        if (scratch < 0) scratch = int(paths.size()), paths.push_back("");
        off = (scratch_end + stream::LayerStreamer::kAlign - 1) / stream::LayerStreamer::kAlign *
              stream::LayerStreamer::kAlign;
        copies.push_back({t->data, t->nbytes, off});
        scratch_end = off + t->nbytes;
        refs[size_t(l)].push_back({scratch, off, t->nbytes});
      }
    }
  }
  const uint64_t slot = stream::LayerStreamer::slot_bytes_for(refs);
  if (opt.weight_budget >= slot * uint64_t(c.n_layers)) return;  // every layer fits: resident
  stream::LayerStreamer::check_budget(refs, opt.weight_budget);

  std::string scratch_path;
  int wfd = -1;
  if (!copies.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    scratch_path = std::string(tmp && *tmp ? tmp : "/tmp") + "/kvboost-stream-XXXXXX";
    wfd = ::mkstemp(scratch_path.data());
    if (wfd < 0) fail(scratch_path, ": cannot create the layer streaming scratch file: ", std::strerror(errno));
    for (const Copy& cp : copies) {
      for (uint64_t done = 0; done < cp.n;) {
        const ssize_t r = ::pwrite(wfd, static_cast<const uint8_t*>(cp.src) + done, size_t(cp.n - done), off_t(cp.off + done));
        if (r <= 0) {
          const int err = errno;
          ::close(wfd), ::unlink(scratch_path.c_str());
          fail(scratch_path, ": writing the layer streaming scratch file failed: ", std::strerror(err));
        }
        done += uint64_t(r);
      }
    }
    ::fdatasync(wfd);
    ::posix_fadvise(wfd, 0, 0, POSIX_FADV_DONTNEED);  // its pages are read back by the streamer
    paths[size_t(scratch)] = scratch_path;
  }
  try {
    // KVBOOST_STREAM_IO=buffered: pread through the page cache (dropping each extent after it
    // is read) instead of O_DIRECT, for file systems or disks where that reads faster.
    const char* io = std::getenv("KVBOOST_STREAM_IO");
    const bool direct = !(io && std::string(io) == "buffered");
    m.stream = std::make_unique<stream::LayerStreamer>(paths, refs, opt.weight_budget, direct);
  } catch (...) {
    if (wfd >= 0) ::close(wfd), ::unlink(scratch_path.c_str());
    throw;
  }
  if (wfd >= 0) ::close(wfd), ::unlink(scratch_path.c_str());
  for (const Copy& cp : copies) m.files.release_owned(cp.src);
  // Streamed matrices are bound per pass to their slot. Those whose owned buffer was just freed
  // would dangle: null; the others keep pointing into the mapping, which is never touched.
  for (LayerWeights& L : m.layers)
    for (Weight* w : layer_mats(L))
      if (!m.files.locate(w->data, 1, nullptr, nullptr)) w->data = nullptr;
  m.resident_bytes = matrix_bytes(m.embed) + (m.lm_head.data == m.embed.data ? 0 : matrix_bytes(m.lm_head));
}

}  // namespace detail

Model::StreamInfo Model::stream_info() const {
  StreamInfo si;
  if (!impl_->stream) return si;
  const stream::StreamStats st = impl_->stream->stats();
  si.streaming = true;
  si.direct = st.direct;
  si.n_slots = impl_->stream->n_slots();
  si.slot_bytes = impl_->stream->slot_bytes();
  si.pass_bytes = impl_->stream->pass_bytes();
  si.resident_bytes = impl_->resident_bytes;
  si.bytes_read = st.bytes_read, si.layers_read = st.layers_read, si.passes = st.passes;
  si.read_ms = st.read_ms, si.wait_ms = st.wait_ms;
  return si;
}

}  // namespace kvboost
