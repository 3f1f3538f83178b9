// _kvboost: the engine's public API (kvboost/runtime.h, hub.h, chat.h) for Python. The friendly
// API (KVBoost, GenerationResult, the transformers adapter) is python/kvboost/*.py over this.
//
// Threads and the GIL: every call that runs the model releases the GIL. Engine::step is safe from
// several threads; the engine may run a request's on_text on any thread that steps, so on_text
// only appends to a mutex-guarded queue and never touches Python. While a call waits it takes the
// GIL back every kSignalPollMs to run PyErr_CheckSignals: Ctrl-C (KeyboardInterrupt) cancels the
// request, the engine frees its KV at the next step, and the exception propagates.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>

#include "kvboost/chat.h"
#include "kvboost/common.h"
#include "kvboost/hub.h"
#include "kvboost/runtime.h"

namespace py = pybind11;
using namespace kvboost;

namespace {

constexpr double kSignalPollMs = 20;

// Errors whose Python class is not the generic EngineError (see translate()).
struct TypedError : std::runtime_error {
  const char* kind;  // attribute of kvboost._errors
  TypedError(const char* k, const std::string& m) : std::runtime_error(m), kind(k) {}
};

template <typename F>
auto as_kind(const char* kind, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const ChatTemplateError& e) {
    throw TypedError("ChatTemplateError", e.what());
  } catch (const Error& e) {
    throw TypedError(kind, e.what());
  }
}

struct PyRequest;

struct PyEngine {
  std::unique_ptr<Engine> e;
  std::string path, chat_config;
  bool has_chat_template = false;
};

// A submitted request with the text its on_text produced and not yet taken.
struct PyRequest {
  std::shared_ptr<PyEngine> eng;  // keeps the engine alive while the request lives
  std::shared_ptr<Request> req;
  std::shared_ptr<std::mutex> mu = std::make_shared<std::mutex>();
  std::shared_ptr<std::deque<std::string>> pieces = std::make_shared<std::deque<std::string>>();
};

// Steps the engine (GIL released) until done() or `ready()`; polls for signals. On a signal:
// cancels `reqs`, lets the engine finish them, and raises the Python exception.
template <typename Ready>
void drive(Engine& e, const std::vector<std::shared_ptr<Request>>& reqs, Ready ready) {
  bool interrupted = false;
  {
    py::gil_scoped_release nogil;
    auto all_done = [&] {
      for (const auto& r : reqs)
        if (!r->done()) return false;
      return true;
    };
    double last = now_ms();
    while (!all_done() && !ready()) {
      e.step();
      if (now_ms() - last >= kSignalPollMs) {
        last = now_ms();
        py::gil_scoped_acquire gil;
        if (PyErr_CheckSignals() != 0) {
          interrupted = true;  // the exception stays set on this thread until we raise it
          break;
        }
      }
    }
    if (interrupted) {
      for (const auto& r : reqs) r->cancel();
      while (!all_done()) e.step();
    }
  }
  if (interrupted) throw py::error_already_set();
}

std::vector<std::string> list_str(const py::dict& d, const char* k) {
  return d.contains(k) && !d[k].is_none() ? d[k].cast<std::vector<std::string>>() : std::vector<std::string>{};
}

// Options dict (built by kvboost/__init__.py) -> GenerateOptions.
GenerateOptions to_options(const py::dict& d) {
  GenerateOptions o;
  auto get = [&](const char* k) -> py::object { return d.contains(k) ? py::object(d[k]) : py::none(); };
  if (auto v = get("max_new_tokens"); !v.is_none()) o.max_new_tokens = v.cast<int>();
  if (auto v = get("temperature"); !v.is_none()) o.sampling.temperature = v.cast<float>();
  if (auto v = get("top_p"); !v.is_none()) o.sampling.top_p = v.cast<float>();
  if (auto v = get("top_k"); !v.is_none()) o.sampling.top_k = v.cast<int>();
  if (auto v = get("min_p"); !v.is_none()) o.sampling.min_p = v.cast<float>();
  if (auto v = get("repetition_penalty"); !v.is_none()) o.sampling.repetition_penalty = v.cast<float>();
  if (auto v = get("presence_penalty"); !v.is_none()) o.sampling.presence_penalty = v.cast<float>();
  if (auto v = get("frequency_penalty"); !v.is_none()) o.sampling.frequency_penalty = v.cast<float>();
  if (auto v = get("seed"); !v.is_none()) o.sampling.seed = v.cast<uint64_t>();
  o.stop = list_str(d, "stop");
  if (auto v = get("ignore_eos"); !v.is_none()) o.ignore_eos = v.cast<bool>();
  if (auto v = get("prefix_cache"); !v.is_none()) o.prefix_cache = v.cast<bool>();
  if (auto v = get("cache_namespace"); !v.is_none()) o.cache_namespace = v.cast<std::string>();
  if (auto v = get("reuse"); !v.is_none()) o.reuse.mode = as_kind("InvalidRequestError", [&] { return parse_reuse_mode(v.cast<std::string>()); });
  if (auto v = get("repair_tokens"); !v.is_none()) o.reuse.repair_tokens = v.cast<int64_t>();
  if (auto v = get("blend_ratio"); !v.is_none()) o.reuse.blend_ratio = v.cast<float>();
  if (auto v = get("guard_lead"); !v.is_none()) o.reuse.guard_lead = v.cast<float>();
  if (auto v = get("guard_risk"); !v.is_none()) o.reuse.guard_risk = v.cast<float>();
  if (auto v = get("guard_tokens"); !v.is_none()) o.reuse.guard_tokens = v.cast<int>();
  if (auto v = get("store"); !v.is_none()) o.reuse.store = v.cast<bool>();
  if (auto v = get("segment_starts"); !v.is_none()) o.segment_starts = v.cast<std::vector<int64_t>>();
  return o;
}

py::dict result_dict(const GenerateResult& r) {
  py::dict d;
  d["text"] = py::bytes(r.text).attr("decode")("utf-8", "replace");
  d["prompt_ids"] = r.prompt_ids;
  d["output_ids"] = r.output_ids;
  d["finish_reason"] = r.finish_reason;
  d["error"] = r.error;
  d["n_cached"] = r.n_cached;
  d["n_reused"] = r.n_reused;
  d["n_recomputed"] = r.n_recomputed;
  d["n_new"] = r.n_new;
  d["guarded"] = r.guarded;
  d["ttft_ms"] = r.ttft_ms;
  d["prefill_ms"] = r.prefill_ms;
  d["decode_ms"] = r.decode_ms;
  d["total_ms"] = r.total_ms;
  d["queue_ms"] = r.queue_ms;
  d["reuse_ratio"] = r.reuse_ratio();
  return d;
}

std::shared_ptr<PyRequest> submit(const std::shared_ptr<PyEngine>& eng, std::vector<int32_t> ids, const py::dict& opts) {
  auto pr = std::make_shared<PyRequest>();
  pr->eng = eng;
  GenerateOptions o = to_options(opts);
  o.on_text = [mu = pr->mu, q = pr->pieces](std::string_view s) {
    std::lock_guard<std::mutex> lock(*mu);
    q->emplace_back(s);
    return true;
  };
  pr->req = as_kind("InvalidRequestError", [&] { return eng->e->submit(std::move(ids), std::move(o)); });
  return pr;
}

// The next text piece (None at the end); steps the engine while none is queued.
py::object next_text(PyRequest& r) {
  auto take = [&](std::string* out) {
    std::lock_guard<std::mutex> lock(*r.mu);
    if (r.pieces->empty()) return false;
    *out = std::move(r.pieces->front());
    r.pieces->pop_front();
    return true;
  };
  std::string s;
  if (!take(&s)) {
    drive(*r.eng->e, {r.req}, [&] {
      std::lock_guard<std::mutex> lock(*r.mu);
      return !r.pieces->empty();
    });
    if (!take(&s)) return py::none();
  }
  return py::bytes(s).attr("decode")("utf-8", "replace");
}

py::dict finish(PyRequest& r) {
  drive(*r.eng->e, {r.req}, [] { return false; });
  GenerateResult res = r.req->result();
  if (res.finish_reason == "error") throw TypedError("EngineError", res.error);
  return result_dict(res);
}

py::list run_batch(const std::shared_ptr<PyEngine>& eng, const std::vector<std::vector<int32_t>>& prompts,
                   const std::vector<py::dict>& opts) {
  if (prompts.size() != opts.size()) throw TypedError("InvalidRequestError", "run_batch: prompts and options differ in length");
  std::vector<std::shared_ptr<Request>> reqs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateOptions o = to_options(opts[i]);
    try {
      reqs.push_back(eng->e->submit(prompts[i], std::move(o)));
    } catch (const Error& e) {
      for (auto& r : reqs) r->cancel();
      drive(*eng->e, reqs, [] { return false; });
      throw TypedError("InvalidRequestError", "request " + std::to_string(i) + ": " + e.what());
    }
  }
  drive(*eng->e, reqs, [] { return false; });
  py::list out;
  for (auto& r : reqs) out.append(result_dict(r->result()));
  return out;
}

std::shared_ptr<PyEngine> load(const std::string& path, const py::dict& k) {
  EngineOptions eo;
  auto has = [&](const char* n) { return k.contains(n) && !k[n].is_none(); };
  as_kind("InvalidRequestError", [&] {
    if (has("chunk_size")) eo.chunk_size = k["chunk_size"].cast<int64_t>();
    if (has("chunk_window")) eo.chunk_window = k["chunk_window"].cast<int64_t>();
    if (has("chunk_ram_bytes")) eo.chunk_store.ram_bytes = k["chunk_ram_bytes"].cast<size_t>();
    if (has("chunk_disk_bytes")) eo.chunk_store.disk_bytes = k["chunk_disk_bytes"].cast<size_t>();
    if (has("chunk_store")) eo.chunk_store.disk_dir = k["chunk_store"].cast<std::string>();
    if (has("kv_quant")) eo.chunk_store.quant = kv::parse_kv_quant(k["kv_quant"].cast<std::string>());
    if (has("kv_budget_bytes")) eo.kv_budget_bytes = k["kv_budget_bytes"].cast<size_t>();
    if (has("block_size")) eo.block_size = k["block_size"].cast<int64_t>();
    if (has("max_batch")) eo.max_batch = k["max_batch"].cast<int64_t>();
    if (has("prefill_chunk")) eo.prefill_chunk = k["prefill_chunk"].cast<int64_t>();
    if (has("cold_dir")) eo.cold_dir = k["cold_dir"].cast<std::string>();
    if (has("weight_budget")) eo.load.weight_budget = k["weight_budget"].cast<uint64_t>();
    if (has("device")) eo.load.device = kernels::parse_device(k["device"].cast<std::string>(), "device");
    if (has("vram_budget")) eo.load.vram_budget = k["vram_budget"].cast<uint64_t>();
    if (has("tp")) eo.tp = k["tp"].cast<int>();
    if (eo.load.vram_budget > 0 && eo.load.device.is_cpu())
      fail("vram_budget = ", eo.load.vram_budget, " is for a CUDA device (device=\"cuda\"); on the CPU, layers "
           "stream from disk under weight_budget");
    if (has("head_quant")) eo.load.head_quant = parse_head_quant(k["head_quant"].cast<std::string>(), "head_quant");
    return 0;
  });
  auto eng = std::make_shared<PyEngine>();
  eng->path = path;
  {
    py::gil_scoped_release nogil;
    eng->e = as_kind("EngineError", [&] { return Engine::load(path, eo); });
  }
  std::string dir = path;
  if (dir.size() > 5 && dir.compare(dir.size() - 5, 5, ".gguf") == 0) {
    const size_t slash = dir.find_last_of('/');
    dir = slash == std::string::npos ? "." : dir.substr(0, slash);
  }
  if (const std::string cfg = path_join(dir, "tokenizer_config.json"); file_exists(cfg)) {
    eng->chat_config = read_file(cfg);
    try {
      chat_template_source(eng->chat_config);
      eng->has_chat_template = true;
    } catch (const Error&) {
    }
  }
  return eng;
}

py::dict agreement_dict(const Engine::Agreement& a) {
  py::dict d;
  d["cosine"] = a.cosine;
  d["kl"] = a.kl;
  d["top1"] = a.top1;
  d["mean_cosine"] = a.mean_cosine();
  d["mean_kl"] = a.mean_kl();
  d["top1_rate"] = a.top1_rate();
  d["ttft_full_ms"] = a.ttft_full_ms;
  d["ttft_reuse_ms"] = a.ttft_reuse_ms;
  d["n_reused"] = a.n_reused;
  d["n_recomputed"] = a.n_recomputed;
  d["n_prompt"] = a.n_prompt;
  d["guarded"] = a.guarded;
  return d;
}

}  // namespace

PYBIND11_MODULE(_kvboost, m) {
  m.doc() = "KVBoost engine bindings (use the kvboost package, not this module)";
  py::register_exception_translator([](std::exception_ptr p) {
    auto raise = [](const char* kind, const char* msg) {
      py::object cls = py::module_::import("kvboost._errors").attr(kind);
      PyErr_SetString(cls.ptr(), msg);
    };
    try {
      if (p) std::rethrow_exception(p);
    } catch (const TypedError& e) {
      raise(e.kind, e.what());
    } catch (const ChatTemplateError& e) {
      raise("ChatTemplateError", e.what());
    } catch (const Error& e) {
      raise("EngineError", e.what());
    }
  });

  m.def("hf_hub_cache_dir", [] { return hf_hub_cache_dir(); }, "The Hugging Face cache folder huggingface_hub uses");
  m.def("parse_hub_id", [](const std::string& s) -> py::object {
    HubId id;
    if (!parse_hub_id(s, &id)) return py::none();
    return py::make_tuple(id.repo, id.revision, id.file);
  });
  m.def("resolve_model", [](const std::string& arg) {
    const ResolvedModel r = as_kind("ModelNotFoundError", [&] { return resolve_model(arg); });
    return py::make_tuple(r.path, r.hub_id, r.commit);
  });
  m.def("set_num_threads", [](int n) { set_num_threads(n); });
  m.def("num_threads", [] { return num_threads(); });

  py::class_<PyRequest, std::shared_ptr<PyRequest>>(m, "Request")
      .def("next_text", &next_text)
      .def("finish", &finish)
      .def("done", [](PyRequest& r) { return r.req->done(); })
      .def("cancel", [](PyRequest& r) {
        r.req->cancel();
        py::gil_scoped_release nogil;
        while (!r.req->done()) r.eng->e->step();
      });

  py::class_<PyEngine, std::shared_ptr<PyEngine>>(m, "Engine")
      .def(py::init(&load), py::arg("path"), py::arg("options"))
      .def_readonly("path", &PyEngine::path)
      .def_readonly("has_chat_template", &PyEngine::has_chat_template)
      .def_property_readonly("context_length", [](PyEngine& e) { return e.e->context_length(); })
      .def_property_readonly("vocab_size", [](PyEngine& e) { return e.e->model().config().vocab_size; })
      .def_property_readonly("eos_token_id", [](PyEngine& e) -> py::object {
        if (auto id = e.e->tokenizer().eos_id()) return py::int_(*id);
        return py::none();
      })
      .def_property_readonly("bos_token_id", [](PyEngine& e) -> py::object {
        if (auto id = e.e->tokenizer().bos_id()) return py::int_(*id);
        return py::none();
      })
      .def("encode", [](PyEngine& e, const std::string& text, bool add_special) {
        return as_kind("InvalidRequestError", [&] { return e.e->tokenizer().encode(text, add_special); });
      })
      .def("decode", [](PyEngine& e, const std::vector<int32_t>& ids, bool skip_special) {
        const std::string s = as_kind("InvalidRequestError", [&] { return e.e->tokenizer().decode(ids, skip_special); });
        return py::bytes(s).attr("decode")("utf-8", "replace");
      })
      .def("encode_segments", [](PyEngine& e, const std::vector<std::string>& segs, bool add_special) {
        std::vector<int64_t> starts;
        auto ids = as_kind("InvalidRequestError", [&] { return e.e->encode_segments(segs, add_special, &starts); });
        return py::make_tuple(ids, starts);
      })
      .def("apply_chat_template", [](PyEngine& e, const std::string& messages_json, bool add_generation_prompt) {
        if (!e.has_chat_template)
          throw TypedError("ChatTemplateError", e.path + ": no chat template (no chat_template in tokenizer_config.json)");
        const auto msgs = as_kind("InvalidRequestError", [&] { return nlohmann::ordered_json::parse(messages_json); });
        return apply_chat_template(e.chat_config, msgs, add_generation_prompt);
      })
      .def("submit", [](const std::shared_ptr<PyEngine>& e, std::vector<int32_t> ids, const py::dict& o) { return submit(e, std::move(ids), o); })
      .def("run_batch", &run_batch)
      .def("warm", [](PyEngine& e, const std::vector<int32_t>& ids, const std::vector<int64_t>& starts, const std::string& ns) {
        py::gil_scoped_release nogil;
        return as_kind("InvalidRequestError", [&] { return e.e->warm(ids, starts, ns); });
      })
      .def("verify_correctness", [](PyEngine& e, const std::vector<std::vector<int32_t>>& prompts, const py::dict& o, int n_tokens) {
        GenerateOptions go = to_options(o);
        std::vector<Engine::Agreement> res;
        {
          py::gil_scoped_release nogil;
          res = as_kind("InvalidRequestError", [&] { return e.e->verify_correctness(prompts, go, n_tokens); });
        }
        py::list out;
        for (const auto& a : res) out.append(agreement_dict(a));
        return out;
      })
      .def("cache_stats", [](PyEngine& e) {
        py::dict d, kvd;
        const kv::KvStats k = e.e->kv_stats();
        kvd["n_blocks"] = k.n_blocks, kvd["blocks_used"] = k.blocks_used, kvd["blocks_free"] = k.blocks_free;
        kvd["blocks_cached"] = k.blocks_cached, kvd["n_queries"] = k.n_queries, kvd["query_tokens"] = k.query_tokens;
        kvd["hit_tokens"] = k.hit_tokens, kvd["hit_rate"] = k.hit_rate(), kvd["evictions"] = k.evictions;
        kvd["block_size"] = e.e->kv_block_size();
        d["prefix_cache"] = kvd;
        if (kv::ChunkStore* cs = e.e->chunk_store()) {
          const kv::ChunkStats c = cs->stats();
          py::dict cd;
          cd["entries"] = c.entries, cd["entries_ram"] = c.entries_ram, cd["entries_disk"] = c.entries_disk;
          cd["pinned"] = c.pinned, cd["bytes_ram"] = c.bytes_ram, cd["bytes_disk"] = c.bytes_disk;
          cd["lookups"] = c.lookups, cd["prefix_hits"] = c.prefix_hits, cd["content_hits"] = c.content_hits;
          cd["hit_rate"] = c.hit_rate(), cd["stores"] = c.stores, cd["evictions_ram"] = c.evictions_ram;
          cd["quant"] = kv::kv_quant_name(cs->options().quant);
          d["chunk_store"] = cd;
        } else {
          d["chunk_store"] = py::none();
        }
        return d;
      })
      .def("flush", [](PyEngine& e) {
        py::gil_scoped_release nogil;
        if (kv::ChunkStore* cs = e.e->chunk_store()) cs->flush();
      });
}
