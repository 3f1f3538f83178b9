// Tensor parallelism under the engine: the ranks and their team of threads (tp_ranks.h).
#include "tp_ranks.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace kvboost {

TpRanks::TpRanks(const Model& model, int world, kv::PagedKvStorage& store0, const kernels::Device& device,
                 int64_t rows_hint, uint64_t vram_budget) {
  if (world < 2) fail("tensor parallel: a group of ", world, " ranks (tp must be at least 2 here)");
  const ModelConfig& c = model.config();
  on_device_ = !device.is_cpu();
  if (on_device_ && vram_budget > 0)
    fail("tensor parallelism (tp ", world, ") with layer streaming (vram_budget, --vram-budget) is not supported");
  ranks_.resize(size_t(world));
  for (int r = 0; r < world; ++r) ranks_[size_t(r)].plan = tp_plan(c, r, world);  // its Errors first
  const int64_t nkv = ranks_[0].plan.config.n_kv_heads;
  if (store0.n_kv_heads() != nkv)
    fail("tensor parallel: the engine's K/V pools hold ", store0.n_kv_heads(), " K/V heads; a rank of ", world,
         " holds ", nkv);
  if (on_device_) {
    for (int r = 0; r < world; ++r)
      kernels::require_device(kernels::Device{kernels::Device::Kind::Cuda, device.index + r},
                              "tensor parallel rank " + std::to_string(r));
    nccl_ = dist::nccl_built();
  } else {
    std::vector<std::unique_ptr<TpShard>> shards = TpShard::create_group(model, world);  // a streamed model shares its streamer
    for (int r = 0; r < world; ++r) {
      Rank& k = ranks_[size_t(r)];
      k.shard = std::move(shards[size_t(r)]);
      if (r == 0) {
        k.store = &store0;
      } else {
        k.own = std::make_unique<kv::PagedKvStorage>(store0.n_blocks(), store0.block_size(), c.n_layers, nkv, c.head_dim);
        k.store = k.own.get();
      }
    }
  }
  if (!nccl_) new_group();
  if (!on_device_) {
    const int share = std::max(1, num_threads() / world);
    for (int r = 0; r < world; ++r) teams_.push_back(std::make_unique<ThreadTeam>(share));
  }
  for (int r = 1; r < world; ++r) threads_.emplace_back([this, r] { worker(r); });
  if (!on_device_) return;
  // Device ranks: NCCL's communicators are made by every rank at once (ncclCommInitRank waits
  // for the group), rank 0's unique id shared in this process.
  try {
    const dist::NcclId id = nccl_ ? dist::nccl_unique_id() : dist::NcclId{};
    run([&](int r) {
      Rank& k = ranks_[size_t(r)];
      const int dev = device.index + r;
      if (nccl_) k.comm = dist::nccl_comm(id, r, world, dev);
      gpu::PagedRunnerOptions o;
      o.device = dev;
      o.pool = gpu::PoolLayout{store0.n_layers(), store0.n_blocks(), store0.block_size(), nkv, store0.head_dim()};
      o.rows_hint = rows_hint;
      o.comm = k.comm;
      k.dev = gpu::PagedRunner::create(model, o);
    });
  } catch (...) {
    release();  // no destructor runs for a constructor that throws: the threads and devices go here
    throw;
  }
}

TpRanks::~TpRanks() { release(); }

size_t TpHotTier::block_bytes() const {
  size_t n = 0;
  for (const kv::PagedKvStorage* s : stores_) n += s->block_bytes();
  return n;
}

std::vector<kv::IoPiece> TpHotTier::block_pieces(kv::BlockId b) {
  std::vector<kv::IoPiece> out;
  for (kv::PagedKvStorage* s : stores_) {
    const std::vector<kv::IoPiece> p = s->block_pieces(b);
    out.insert(out.end(), p.begin(), p.end());
  }
  return out;
}

kv::HotTier& TpRanks::hot_tier() {
  if (on_device_)
    fail("TpRanks::hot_tier: the ranks' pools are on CUDA devices, not host pools a cold tier can spill");
  if (!hot_) {
    std::vector<kv::PagedKvStorage*> stores;
    for (Rank& k : ranks_) stores.push_back(k.store);
    hot_ = std::make_unique<TpHotTier>(std::move(stores));
  }
  return *hot_;
}

void TpRanks::release() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    quit_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
  for (Rank& k : ranks_) {
    k.dev.reset();  // before its NCCL stream goes
    if (k.comm.backend() == dist::Backend::Nccl) dist::nccl_destroy(k.comm);
  }
}

void TpRanks::new_group() {
  group_ = dist::ShmGroup::create(world());
  for (int r = 0; r < world(); ++r) ranks_[size_t(r)].comm = group_->comm(r);
}

void TpRanks::worker(int r) {
  if (!teams_.empty()) bind_thread_team(teams_[size_t(r)].get());
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* job = nullptr;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return quit_ || gen_ != seen; });
      if (quit_) return;
      seen = gen_;
      job = job_;
    }
    std::string err;
    try {
      (*job)(r);
    } catch (const std::exception& e) {
      err = e.what();
    } catch (...) {
      err = "unknown exception";
    }
    if (!err.empty() && group_) group_->abort(r, err);
    std::lock_guard<std::mutex> lk(mu_);
    errors_[size_t(r)] = std::move(err);
    if (--pending_ == 0) done_cv_.notify_all();
  }
}

void TpRanks::run(const std::function<void(int)>& fn) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    errors_.assign(size_t(world()), std::string());
    job_ = &fn;
    pending_ = world() - 1;
    ++gen_;
  }
  cv_.notify_all();
  std::string err0;
  ThreadTeam* before = teams_.empty() ? nullptr : bind_thread_team(teams_[0].get());
  try {
    fn(0);
  } catch (const std::exception& e) {
    err0 = e.what();
  } catch (...) {
    err0 = "unknown exception";
  }
  if (!teams_.empty()) bind_thread_team(before);
  if (!err0.empty() && group_) group_->abort(0, err0);
  std::unique_lock<std::mutex> lk(mu_);
  done_cv_.wait(lk, [&] { return pending_ == 0; });
  job_ = nullptr;
  errors_[0] = err0;
  for (int r = 0; r < world(); ++r) {
    if (errors_[size_t(r)].empty()) continue;
    // The rank that failed first names the problem (the others' collectives only say that the
    // group was aborted): its own message, as the engine without TP would give it.
    std::string first = errors_[size_t(r)];
    if (group_) {
      const std::string why = group_->abort_message();  // "rank R: message"
      const size_t colon = why.find(": ");
      if (why.rfind("rank ", 0) == 0 && colon != std::string::npos) {
        const int fr = std::atoi(why.c_str() + 5);
        if (fr >= 0 && fr < world() && !errors_[size_t(fr)].empty()) first = errors_[size_t(fr)];
      }
      lk.unlock();
      new_group();  // an aborted group stays aborted: the next run gets a fresh one
    }
    fail(first);
  }
}

}  // namespace kvboost
