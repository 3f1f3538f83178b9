// Engine's public methods (kvboost/engine.h): each forwards to the engine's state,
// Engine::Impl (engine_impl.h), which the public header keeps opaque.
#include "engine_impl.h"
#include "speculative.h"

namespace kvboost {

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

const Model& Engine::model() const { return *impl_->model_; }
const Tokenizer& Engine::tokenizer() const { return impl_->tok_; }
const EngineOptions& Engine::options() const { return impl_->opt_; }
int64_t Engine::context_length() const { return impl_->context_length(); }
GenerateResult Engine::generate(std::string_view prompt, const GenerateOptions& opt) { return impl_->generate(prompt, opt); }
GenerateResult Engine::generate_ids(const std::vector<int32_t>& prompt_ids, const GenerateOptions& opt) {
  return impl_->generate_ids(prompt_ids, opt);
}
GenerateResult Engine::generate_segments(const std::vector<std::string>& segments, const GenerateOptions& opt) {
  return impl_->generate_segments(segments, opt);
}
std::vector<int32_t> Engine::encode_segments(const std::vector<std::string>& segments, bool add_special,
                                             std::vector<int64_t>* segment_starts) const {
  return impl_->encode_segments(segments, add_special, segment_starts);
}
std::shared_ptr<Request> Engine::submit(std::vector<int32_t> prompt_ids, GenerateOptions opt) {
  return impl_->submit(std::move(prompt_ids), std::move(opt));
}
StepStats Engine::step() { return impl_->step(); }
bool Engine::has_work() const { return impl_->has_work(); }
bool Engine::idle_work() { return impl_->idle_work(); }
kv::KvStats Engine::kv_stats() const { return impl_->kv_stats(); }
int64_t Engine::device_passes() const { return impl_->device_passes(); }
int64_t Engine::kv_block_size() const { return impl_->block_size_; }
Engine::SpecStats Engine::spec_stats() const { return impl_->spec_stats(); }
bool Engine::has_draft_model() const { return impl_->draft_ != nullptr; }
const std::string& Engine::model_id() const { return impl_->model_id_; }
kv::ChunkStore* Engine::chunk_store() const { return impl_->chunks_.get(); }
Engine::GuardCalibration Engine::guard_calibration() const { return impl_->guard_calibration(); }
void Engine::guard_observe(ReuseMode mode, float error) { impl_->guard_observe(mode, error); }
void Engine::save_guard_calibration(const std::string& path) const { impl_->save_guard_calibration(path); }
void Engine::load_guard_calibration(const std::string& path) { impl_->load_guard_calibration(path); }
const std::string& Engine::guard_file() const { return impl_->guard_file_; }
int64_t Engine::warm(const std::vector<int32_t>& ids, const std::vector<int64_t>& segment_starts,
                     const std::string& cache_namespace) {
  return impl_->warm(ids, segment_starts, cache_namespace);
}
Engine::Agreement Engine::verify_correctness(const std::vector<int32_t>& ids, const GenerateOptions& reuse_opt,
                                             int n_tokens) {
  return impl_->verify_correctness(ids, reuse_opt, n_tokens);
}
std::vector<Engine::Agreement> Engine::verify_correctness(const std::vector<std::vector<int32_t>>& prompts,
                                                          const GenerateOptions& reuse_opt, int n_tokens) {
  return impl_->verify_correctness(prompts, reuse_opt, n_tokens);
}

}  // namespace kvboost
