// The scheduler: Engine::schedule decides one step -- cancellations, admission (first come
// first served, KV memory and max_batch permitting), decode slots with preemption of the newest
// request when KV runs out, speculative drafts, and the prefill chunks within the step's token
// budget -- and returns it as a StepPlan (scheduler.h). It runs no forward pass.
#include <algorithm>

#include "engine_impl.h"
#include "request.h"
#include "runner.h"
#include "scheduler.h"

namespace kvboost {

bool Engine::Impl::admit(Request::State& r, StepPlan& plan) {
  r.seq = next_seq_++;
  auto alloc = kv_->allocate_for_prompt(r.seq, r.context, r.ns);
  if (!alloc) return false;
  for (const auto& c : alloc->copies) {  // before anything else touches the pool (kv.h)
    runner_->copy_block(c);
    plan.copies.push_back(c);
  }
  r.todo.clear();
  r.todo_next = 0;
  for (int64_t p = alloc->n_cached; p < int64_t(r.context.size()); ++p) r.todo.push_back(int32_t(p));
  if (!r.admitted_once) plan_reuse(r, alloc->n_cached, plan);
  if (!r.admitted_once) {
    std::lock_guard<std::mutex> lock(r.mu);
    r.t_admit = now_ms();
    r.res.queue_ms = r.t_admit - r.t_submit;
  }
  r.admitted_once = true;
  r.phase = Request::State::Phase::kPrefill;
  return true;
}

// Device passes read whole block tables (the attention kernels take a sequence's table, not a
// range of it), so with a cold tier on a device a pass holds only the requests whose tables fit
// in the device pool together; the others' blocks may spill to the host tier meanwhile. Taken
// in turn from slice_start_, greedily, counting one block for each request left out (its last
// block is never spilled) and a block for a decode token that starts one; the first is always
// taken (if it alone cannot fit, the runner's Error names the sizes). A slice runs kSliceSteps
// steps before the turn moves on, so that paging a sequence in is paid once per few tokens.
std::vector<const Request::State*> Engine::Impl::device_slice() {
  constexpr int64_t kSliceSteps = 8;
  std::vector<const Request::State*> out;
  const size_t n = running_.size();
  if (n == 0) return out;
  const int64_t pool = kv_->pool().n_blocks();
  int64_t used = 0;
  for (size_t k = 0; k < n; ++k) {
    const Request::State& r = running_[(slice_start_ + k) % n]->state();
    const int64_t t = kv_->n_tokens(r.seq);
    const int64_t need = int64_t(kv_->block_table(r.seq).size()) +
                         (r.phase == Request::State::Phase::kDecode && t % block_size_ == 0 ? 1 : 0);
    const int64_t left_out = int64_t(n - out.size()) - 1;
    if (!out.empty() && used + need + left_out > pool) continue;
    out.push_back(&r);
    used += need;
  }
  if (out.size() < n && ++slice_steps_ >= kSliceSteps) {
    slice_steps_ = 0;
    slice_start_ = (slice_start_ + out.size()) % n;
  }
  return out;
}

void Engine::Impl::release(Request::State& r) {
  spec_release(r);
  if (r.seq && kv_->has_seq(r.seq)) kv_->free(r.seq);
  r.seq = 0;
}

void Engine::Impl::finish(Request::State& r, const char* reason) {
  hold_restore(r);  // cancelled or failed while the guard held tokens: none was shown, none is in the result
  release(r);
  {
    std::lock_guard<std::mutex> lock(r.mu);
    r.res.finish_reason = reason;
    const double t = now_ms();
    r.res.total_ms = t - r.t_submit;
    r.res.decode_ms = r.res.output_ids.empty() ? 0 : t - r.t_first;
  }
  r.phase = Request::State::Phase::kDone;
  r.done_flag = true;
}

void Engine::Impl::fail_request(Request::State& r, const std::string& why) {
  {
    std::lock_guard<std::mutex> l(r.mu);
    r.res.error = why;
  }
  finish(r, "error");
}

void Engine::Impl::preempt(Request::State& r) {
  hold_restore(r);  // held tokens decoded on approximate K/V are dropped: resumed exact, from the prompt
  release(r);
  r.context = r.history;  // the pending sampled token included: its prefill logits give the next
  r.todo.clear();
  r.todo_next = 0;
  r.blend = false;
  r.remote.reset();  // (the lookup still warms the RAM tier)
  r.approx = false;  // resumed from the exact block cache: recomputed exactly, nothing to guard
  r.phase = Request::State::Phase::kWaiting;
  std::lock_guard<std::mutex> lock(r.mu);
  ++r.res.n_preempted;
}

StepPlan Engine::Impl::schedule() {
  using Phase = Request::State::Phase;
  auto st = [](const std::shared_ptr<Request>& q) -> Request::State& { return q->state(); };
  StepPlan plan;
  // 1. Cancelled requests leave, their KV freed.
  for (auto* list : {&running_, &waiting_}) {
    for (auto& q : *list)
      if (st(q).cancel_flag && st(q).phase != Phase::kDone) {
        finish(st(q), "cancelled");
        plan.finished.push_back(&st(q));
      }
    std::erase_if(*list, [&](const auto& q) { return st(q).phase == Phase::kDone; });
  }
  // 2. Admission, first come first served. With a cold tier, one sequence at a time (paging in
  // for one sequence may spill another's blocks mid-pass). Requests sharing at least a block of
  // prompt prefix with one still in its prefill are grouped behind it: they wait until its blocks
  // are committed and then reuse them instead of computing the same prefix twice.
  // On a CUDA device a pass reads whole tables instead (device_slice below): requests run
  // together as usual, and take turns when their tables outgrow the device pool.
  const bool sliced = cold_ && (runner_->on_device() || slice_for_testing_);
  const size_t max_running = cold_ && !sliced ? 1 : size_t(opt_.max_batch);
  auto shares_prefill = [&](const Request::State& r) {
    if (!r.opt.prefix_cache) return false;
    for (const auto& q : running_) {
      const Request::State& o = st(q);
      if (o.phase != Phase::kPrefill || o.ns != r.ns || !o.opt.prefix_cache) continue;
      const size_t n = std::min(o.context.size(), r.context.size());
      size_t k = 0;
      while (k < n && o.context[k] == r.context[k]) ++k;
      if (int64_t(k) >= block_size_) return true;
    }
    return false;
  };
  for (size_t i = 0; i < waiting_.size() && running_.size() < max_running;) {
    Request::State& r = st(waiting_[i]);
    if (shares_prefill(r)) {
      ++i;
      continue;
    }
    bool ok = false;
    try {
      ok = admit(r, plan);
    } catch (const std::exception& e) {
      release(r);
      fail_request(r, e.what());
      plan.finished.push_back(&r);
      waiting_.erase(waiting_.begin() + std::ptrdiff_t(i));
      continue;
    }
    if (!ok) {
      if (running_.empty()) {  // nothing will ever free memory for it
        fail_request(r, "KV memory exhausted: the prompt needs " + std::to_string((r.context.size() + block_size_ - 1) / block_size_) +
                            " blocks of " + std::to_string(block_size_) + " tokens but the pool has " +
                            std::to_string(kv_->stats().n_blocks) + " (raise the KV budget)");
        plan.finished.push_back(&r);
        waiting_.erase(waiting_.begin() + std::ptrdiff_t(i));
        continue;
      }
      break;
    }
    plan.admitted.push_back(&r);
    running_.push_back(waiting_[i]);
    waiting_.erase(waiting_.begin() + std::ptrdiff_t(i));
  }
  // 3. Slots for decode tokens, oldest first; exhaustion preempts the newest request.
  const std::vector<const Request::State*> slice = sliced ? device_slice() : std::vector<const Request::State*>{};
  auto sits_out = [&](const Request::State& r) { return sliced && std::find(slice.begin(), slice.end(), &r) == slice.end(); };
  for (size_t i = 0; i < running_.size(); ++i) {
    Request::State& r = st(running_[i]);
    if (r.phase != Phase::kDecode || sits_out(r)) continue;
    for (;;) {
      auto slot = kv_->append_slot(r.seq);
      if (slot) {
        if (slot->copy) {
          runner_->copy_block(*slot->copy);
          plan.copies.push_back(*slot->copy);
        }
        break;
      }
      if (running_.size() == 1) {
        fail_request(r, "KV memory exhausted after " + std::to_string(r.history.size() - 1) +
                            " tokens (raise the KV budget or set a cold tier)");
        plan.finished.push_back(&r);
        break;
      }
      Request::State& victim = st(running_.back());
      preempt(victim);
      plan.preempted.push_back(&victim);
      waiting_.insert(waiting_.begin(), running_.back());
      running_.pop_back();
      if (&victim == &r) break;
    }
  }
  std::erase_if(running_, [&](const auto& q) { return st(q).phase == Phase::kDone || st(q).phase == Phase::kWaiting; });
  // 3b. Speculative decoding (speculative.cpp): drafts for decoding requests, their slots reserved.
  {
    int64_t n_decoding = 0;
    for (auto& q : running_) n_decoding += st(q).phase == Phase::kDecode;
    for (auto& q : running_)
      if (st(q).phase == Phase::kDecode) plan.n_drafted += spec_plan(st(q), n_decoding);
  }
  // 4. The step's passes: decode rows and prompt chunks within the prefill budget in one batch;
  // CacheBlend repairs in passes of their own.
  int64_t budget = opt_.prefill_chunk;
  for (auto& q : running_) {
    Request::State& r = st(q);
    if (sits_out(r)) continue;
    PlannedRows b;
    b.req = &r;
    b.seq = r.seq;
    if (r.phase == Phase::kDecode) {
      b.decode = true;
      b.tokens = std::span<const int32_t>(&r.history.back(), 1);
      b.n_past = int64_t(r.history.size()) - 1;
      b.logits = r.logits.data();
      if (r.spec.rows.size() > 1) {  // speculation: history.back() and the drafts, all verified
        b.tokens = r.spec.rows;
        b.n_logits = int64_t(r.spec.rows.size());
      }
      ++plan.n_decode;
    } else if (r.phase == Phase::kPrefill) {
      const int64_t cap = r.remote ? remote_poll(r, plan) : INT64_MAX;  // the remote lookup in flight (reuse.cpp)
      if (r.blend) {
        PlannedBlend pb;
        pb.req = &r;
        pb.seq = r.seq;
        pb.opts.ratio = r.blend_ratio;
        pb.opts.check_layer = r.opt.reuse.blend_check_layer;
        pb.opts.first_ratio = r.blend_first_ratio;
        pb.opts.taper_layers = r.opt.reuse.blend_taper_layers;
        pb.opts.reused = r.reused.data();
        pb.n_past = r.blend_from;
        pb.tokens = r.context.data() + r.blend_from;
        pb.n = int64_t(r.context.size()) - r.blend_from;
        pb.logits = r.logits.data();
        plan.blends.push_back(pb);
        continue;
      }
      const int64_t left = int64_t(r.todo.size() - r.todo_next);
      if (budget <= 0 && left > 0) continue;
      const int64_t take = std::min({left, budget, cap});
      budget -= take;
      if (take == 0) continue;  // nothing to compute (cannot happen: the last token is always computed)
      b.positions = std::span<const int32_t>(&r.todo[r.todo_next], size_t(take));
      // tokens at those positions: gathered (positions may be scattered after a reuse plan)
      b.gathered.reserve(size_t(take));
      for (const int32_t p : b.positions) b.gathered.push_back(r.context[size_t(p)]);
      const bool last = r.todo_next + size_t(take) == r.todo.size();
      b.logits = last ? r.logits.data() : nullptr;
      plan.n_prefill_tokens += take;
    } else {
      continue;
    }
    plan.batch.push_back(std::move(b));
  }
  for (PlannedRows& b : plan.batch)
    if (!b.decode) b.tokens = b.gathered;  // (after the moves: the vector's buffer stays put)
  return plan;
}

}  // namespace kvboost
