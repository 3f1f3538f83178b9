// The device-side weight layout (device_weights.h), moved out of gpu_decoder.cpp so the engine's
// paged runner binds and packs layers exactly as the decoder does.
#include "device_weights.h"

#include <algorithm>
#include <cstring>

#include "../model/awq.h"

namespace kvboost::gpu::dev {

void require_device(int device) {
  const int n = device_count();
  if (n == 0) fail("GPU: no CUDA device is visible (cudaGetDeviceCount found none)");
  if (device < 0 || device >= n) fail("GPU: device ", device, " does not exist (", n, " visible)");
  check(cudaSetDevice(device), "cudaSetDevice");
}

WType wtype_of(const TensorInfo& t) {
  if (t.dtype == "F32") return WType::F32;
  if (t.dtype == "F16") return WType::F16;
  if (t.dtype == "BF16") return WType::BF16;
  fail(t.file, ": tensor \"", t.name, "\" has dtype ", t.dtype, " (the GPU decoder takes F32, F16, BF16)");
}

const TensorInfo& tensor(const WeightFiles& f, const std::string& dir, const std::string& name,
                         const std::vector<int64_t>& shape) {
  const TensorInfo* t = f.find(name);
  if (!t) fail(dir, ": weight \"", name, "\" is missing");
  if (t->shape != shape) fail(t->file, ": tensor \"", name, "\" does not have the shape the config implies");
  wtype_of(*t);
  return *t;
}

std::optional<AwqTensors> awq_of(const WeightFiles& f, const std::string& dir, const std::string& weight_name,
                                 int64_t rows, int64_t cols) {
  if (f.find(weight_name) || weight_name.size() < 7) return std::nullopt;
  const std::string base = weight_name.substr(0, weight_name.size() - 7);  // minus ".weight"
  AwqTensors a;
  a.qweight = f.find(base + ".qweight"), a.qzeros = f.find(base + ".qzeros"), a.scales = f.find(base + ".scales");
  if (!a.qweight) return std::nullopt;
  if (!a.qzeros || !a.scales) fail(dir, ": AWQ layer \"", base, "\" lacks qzeros or scales");
  const int64_t in = cols, out = rows;
  if (a.qweight->dtype != "I32" || a.qweight->shape != std::vector<int64_t>{in, out / 8} || a.qzeros->dtype != "I32" ||
      a.qzeros->shape.size() != 2 || a.qzeros->shape[0] <= 0 || in % a.qzeros->shape[0] != 0 || a.scales->dtype != "F16")
    fail(a.qweight->file, ": AWQ layer \"", base, "\" does not have the shapes and types the config implies");
  a.group = in / a.qzeros->shape[0];
  if (a.group % 32 != 0 || out % 8 != 0) fail(a.qweight->file, ": AWQ layer \"", base, "\": group ", a.group, ", out ", out);
  a.wt = a.group % 128 == 0 ? WType::Q4_Z128 : WType::Q4_Z;
  return a;
}

// Packs layer l into `dst` (layout.bytes bytes) from the files.
void pack_layer(const WeightFiles& f, const std::string& dir, const ModelConfig& c, int64_t l, const LayerLayout& lay,
                uint8_t* dst, const TpPlan* tp) {
  for (const LayerEntry& e : layer_entries(c, l, tp)) {
    uint8_t* out = dst + lay.piece[e.id].off;
    if (e.cols > 0) {
      if (const auto a = awq_of(f, dir, e.name, e.full_rows, e.full_cols)) {
        // The whole matrix repacked (AWQ packs 8 output columns per int32), then the piece's rows
        // and columns of the repacked blocks (all of them at world 1).
        const int64_t R = e.full_rows, C = e.full_cols;
        std::vector<uint8_t> q4z(size_t(R * (C / 32) * 20)), q128;
        awq::repack_q4z(static_cast<const int32_t*>(a->qweight->data), static_cast<const int32_t*>(a->qzeros->data),
                        static_cast<const uint16_t*>(a->scales->data), C, R, a->group, q4z.data());
        const uint8_t* whole = q4z.data();
        if (a->wt == WType::Q4_Z128) {
          q128.resize(size_t(R) * size_t(kernels::wtype_row_bytes(WType::Q4_Z128, C)));
          awq::q4z_to_q4z128(q4z.data(), R, C, q128.data());
          whole = q128.data();
        }
        tp_copy_slice(whole, a->wt, C, e.r0, e.r0 + e.rows, e.c0, e.c0 + e.cols, out, e.name);
        continue;
      }
      const TensorInfo& t = tensor(f, dir, e.name, {e.full_rows, e.full_cols});
      if (e.sliced()) tp_copy_slice(t.data, wtype_of(t), e.full_cols, e.r0, e.r0 + e.rows, e.c0, e.c0 + e.cols, out, e.name);
      else std::memcpy(out, t.data, t.nbytes);
    } else {
      const TensorInfo& t = tensor(f, dir, e.name, {e.full_rows});
      const WType wt = wtype_of(t);
      kernels::to_f32(static_cast<const uint8_t*>(t.data) + kernels::wtype_row_bytes(wt, e.r0), wt,
                      reinterpret_cast<float*>(out), e.rows);
    }
  }
}

LayerLayout layout_of(const WeightFiles& f, const std::string& dir, const ModelConfig& c, int64_t l, const TpPlan* tp) {
  LayerLayout lay;
  size_t off = 0;
  const std::vector<LayerEntry> entries = layer_entries(c, l, tp);
  for (const LayerEntry& e : entries) {  // matrices first, then the f32 vectors
    if (e.cols == 0) continue;
    WType wt = WType::F32;
    if (const auto a = awq_of(f, dir, e.name, e.full_rows, e.full_cols)) wt = a->wt;
    else wt = wtype_of(tensor(f, dir, e.name, {e.full_rows, e.full_cols}));
    lay.piece[e.id] = Piece{off, wt, true};
    off = align_up(off + tp_slice_bytes(wt, e.full_cols, e.r0, e.r0 + e.rows, e.c0, e.c0 + e.cols, e.name));
  }
  for (const LayerEntry& e : entries) {
    if (e.cols != 0) continue;
    lay.piece[e.id] = Piece{off, WType::F32, true};
    off = align_up(off + size_t(e.rows) * 4);
  }
  for (int id : {kWq, kWk, kWv, kWo, kGate, kUp, kDown, kAttnNorm, kMlpNorm})
    if (!lay.piece[id].present) fail("GPU decoder: model_type ", c.model_type, "'s tensor table lacks a tensor the layer needs");
  lay.bytes = off;
  lay.window = c.layer_window.empty() ? 0 : c.layer_window[size_t(l)];
  return lay;
}

// A whole tensor on the device, as stored.
DevBuf upload(const TensorInfo& t) {
  DevBuf d(t.nbytes);
  check(cudaMemcpy(d.p, t.data, t.nbytes, cudaMemcpyHostToDevice), "cudaMemcpy(weights)");
  return d;
}

LayerPtrs ResidentWeights::ptrs(int64_t l) const {
  if (dev_off[size_t(l)] == kNotResident) fail("GPU: layer ", l, " is streamed: it has no resident weights");
  return layer_ptrs(layers.as<uint8_t>() + dev_off[size_t(l)], layouts[size_t(l)]);
}

LayerPtrs layer_ptrs(const uint8_t* base, const LayerLayout& lay) {
  LayerPtrs p{};
  for (int i = 0; i < 7; ++i) p.m[i] = base + lay.piece[i].off;
  for (int i = 0; i < 8; ++i) p.v[i] = lay.piece[7 + i].present ? reinterpret_cast<const float*>(base + lay.piece[7 + i].off) : nullptr;
  return p;
}

ResidentWeights upload_resident(const Model& model, const char* what, const ResidentChoice& choose, HostLayers* host,
                                const TpPlan* tp) {
  const ModelConfig& c = model.config();
  const std::string& dir = model.dir();
  const std::string g = gguf_model_file(dir);
  const WeightFiles f = g.empty() ? WeightFiles::open_dir(dir) : WeightFiles::open_gguf(g, /*keep_quantized=*/false);
  ResidentWeights w;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    w.layouts.push_back(layout_of(f, dir, c, l, tp));
    w.slot_bytes = std::max(w.slot_bytes, w.layouts.back().bytes);
    for (const Piece& pc : w.layouts.back().piece)
      w.q4 = w.q4 || (pc.present && (pc.wt == WType::Q4_Z || pc.wt == WType::Q4_Z128));
  }
  const TensorInfo& emb = tensor(f, dir, "model.embed_tokens.weight", {c.vocab_size, c.hidden_size});
  const TensorInfo* lm = c.tie_word_embeddings ? nullptr : &tensor(f, dir, "lm_head.weight", {c.vocab_size, c.hidden_size});
  const TensorInfo& fn = tensor(f, dir, "model.norm.weight", {c.hidden_size});
  const size_t nonlayer = emb.nbytes + (lm ? lm->nbytes : 0) + size_t(c.hidden_size) * 4;
  std::vector<bool> resident(size_t(c.n_layers), true);
  if (choose) {
    resident = choose(w.layouts, nonlayer);
    if (resident.size() != size_t(c.n_layers) || (!host && std::count(resident.begin(), resident.end(), false) > 0))
      fail(what, ": the resident-layer choice has ", resident.size(), " entries for ", c.n_layers, " layers");
  }
  size_t total = 0, host_total = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const size_t b = w.layouts[size_t(l)].bytes;
    w.dev_off.push_back(resident[size_t(l)] ? total : kNotResident);
    if (host) host->off.push_back(resident[size_t(l)] ? kNotResident : host_total);
    (resident[size_t(l)] ? total : host_total) += b;
  }
  size_t free_b = 0, total_b = 0;
  check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  if (total > free_b)
    fail(what, ": the layers' weights need ", total, " bytes on the device, ", free_b, " of ", total_b, " are free");
  w.layers = DevBuf(total);
  if (host && host_total > 0) {
    if (cudaHostAlloc(&host->buf.p, host_total, cudaHostAllocDefault) != cudaSuccess) {
      cudaGetLastError();
      host->buf.p = nullptr;
      fail(what, ": cannot pin ", host_total, " bytes of host memory for the streamed layers (cudaHostAlloc)");
    }
    host->buf.bytes = host_total;
  }
  std::vector<uint8_t> buf(w.slot_bytes);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerLayout& lay = w.layouts[size_t(l)];
    if (!resident[size_t(l)]) {  // packed once into pinned memory: the copies stream from there
      pack_layer(f, dir, c, l, lay, host->buf.as<uint8_t>() + host->off[size_t(l)], tp);
      continue;
    }
    pack_layer(f, dir, c, l, lay, buf.data(), tp);
    check(cudaMemcpy(w.layers.as<uint8_t>() + w.dev_off[size_t(l)], buf.data(), lay.bytes, cudaMemcpyHostToDevice),
          "cudaMemcpy(layer)");
  }
  w.embed_wt = wtype_of(emb);
  w.embed_w = upload(emb);
  if (!lm) {
    w.lm_head = w.embed_w.p, w.lm_head_wt = w.embed_wt;
  } else {
    w.lm_head_wt = wtype_of(*lm);
    w.lm_head_w = upload(*lm);
    w.lm_head = w.lm_head_w.p;
  }
  std::vector<float> v(size_t(c.hidden_size));
  kernels::to_f32(fn.data, wtype_of(fn), v.data(), c.hidden_size);
  w.final_norm = DevBuf(v.size() * 4);
  check(cudaMemcpy(w.final_norm.p, v.data(), v.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy(norm)");
  return w;
}

}  // namespace kvboost::gpu::dev
