// ChunkStore: RAM tier + optional disk tier of computed chunks (see kv.h).
//
// Eviction is by frequency with recency (LRFU): an entry's score decays by half every
// kHalfLife store operations and gains 1 per hit, so a chunk used often long ago loses to one
// used a few times recently. Pinned entries (warm()) are never evicted from RAM. With a disk tier,
// every stored chunk is also written to disk (in the background), so RAM eviction only drops the
// RAM copy; the disk tier evicts by the same score when over its byte budget.
#include <chrono>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <dirent.h>
#include <sstream>
#include <sys/stat.h>
#include <unistd.h>

#include "chunk_file.h"
#include "kvboost/kv.h"
#include "remote_store.h"

namespace kvboost::kv {

namespace {
constexpr double kHalfLife = 256;
template <typename... A>
void log_warn(const A&... a) {  // warnings go to stderr; the stats keep the details too
  std::ostringstream os;
  (os << ... << a);
  std::fprintf(stderr, "kvboost: warning: %s\n", os.str().c_str());
}
std::string hex16(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}
}  // namespace

struct ChunkStore::Entry {
  uint64_t id = 0;
  ChunkKeys keys;
  int64_t n_tokens = 0;
  std::shared_ptr<const Chunk> ram;  // null: on disk only
  size_t ram_bytes = 0;
  std::string path;                  // "" until written (or no disk tier)
  size_t disk_bytes = 0;
  bool queued = false;               // waiting for the writer
  bool pinned = false;
  std::string owner;                 // who pinned it
  size_t pin_bytes = 0;              // counted against the pin budgets while pinned
  double score = 0;
  uint64_t last = 0;
  double score_now(uint64_t tick) const { return score * std::exp2(-double(tick - last) / kHalfLife); }
};

std::string ChunkStats::to_string() const {
  char b[512];
  std::snprintf(b, sizeof b,
                "chunks: %lld (ram %lld, %.1f MiB; disk %lld, %.1f MiB; pinned %lld) | lookups %lld: prefix hits %lld, "
                "content hits %lld (hit rate %.1f%%), disk loads %lld, corrupt %lld | stored %lld, evicted ram %lld, disk %lld",
                (long long)entries, (long long)entries_ram, double(bytes_ram) / 1048576.0, (long long)entries_disk,
                double(bytes_disk) / 1048576.0, (long long)pinned, (long long)lookups, (long long)prefix_hits,
                (long long)content_hits, 100.0 * hit_rate(), (long long)disk_loads, (long long)corrupt, (long long)stores,
                (long long)evictions_ram, (long long)evictions_disk);
  std::string out = b;
  if (remote.enabled) {
    std::snprintf(b, sizeof b,
                  " | remote %s: hits %lld, misses %lld, %.1f MiB fetched, skipped (not worth it) %lld, unavailable %lld, "
                  "corrupt %lld, errors %lld, written %lld (dropped %lld, refused %lld), rtt %.2f ms, %.0f MB/s",
                  remote.up ? "up" : "down", (long long)remote.hits, (long long)remote.misses,
                  double(remote.bytes) / 1048576.0, (long long)remote.skipped, (long long)remote.unavailable,
                  (long long)remote.corrupt, (long long)remote.errors, (long long)remote.writes,
                  (long long)remote.write_drops, (long long)remote.write_errors, remote.rtt_ms, remote.mb_per_s);
    out += b;
  }
  return out;
}

ChunkStore::ChunkStore(const ChunkShape& shape, const ChunkStoreOptions& opt) : shape_(shape), opt_(opt) {
  model_hash_ = chunk_root(opt.model_id, "\x01model");
  if (!opt_.disk_dir.empty()) {
    ::mkdir(opt_.disk_dir.c_str(), 0755);
    struct stat sb;
    if (::stat(opt_.disk_dir.c_str(), &sb) != 0 || !S_ISDIR(sb.st_mode))
      fail(opt_.disk_dir, ": chunk store directory cannot be created");
    scan_disk();
    writer_ = std::thread([this] { writer_loop(); });
  }
  if (!opt_.remote_url.empty()) remote_ = std::make_unique<RemoteStore>(shape_, opt_, model_hash_);
}

ChunkStore::~ChunkStore() {
  if (remote_) remote_->stop_lookups();  // their jobs use this store's tiers
  remote_.reset();  // its writer finishes the write in flight (bounded by the command timeout)
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (writer_.joinable()) writer_.join();
}

void ChunkStore::note_corrupt_locked(const std::string& path, const std::string& why) {
  ++st_.corrupt;
  st_.corrupt_files.push_back(why);
  if (st_.corrupt_files.size() > 8) st_.corrupt_files.erase(st_.corrupt_files.begin());
  log_warn("chunk store: ", why, " -- treated as a miss and removed");
  ::unlink(path.c_str());
}

void ChunkStore::scan_disk() {
  DIR* d = ::opendir(opt_.disk_dir.c_str());
  if (!d) fail(opt_.disk_dir, ": cannot list the chunk store directory");
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n.size() > 4 && n.compare(n.size() - 4, 4, ".kvc") == 0) names.push_back(n);
    else if (n.find(".kvc.tmp.") != std::string::npos) ::unlink((opt_.disk_dir + "/" + n).c_str());  // interrupted write
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& n : names) {
    const std::string path = opt_.disk_dir + "/" + n;
    ChunkFileInfo fi;
    try {
      fi = peek_chunk_file(path, shape_, model_hash_);
    } catch (const Error& e) {
      if (std::string(e.what()).find("another model") != std::string::npos) continue;  // not ours: leave it
      note_corrupt_locked(path, e.what());
      continue;
    }
    auto en = std::make_unique<Entry>();
    en->id = next_id_++;
    en->keys = fi.keys;
    en->n_tokens = fi.n_tokens;
    en->path = path;
    en->disk_bytes = fi.file_bytes;
    st_.bytes_disk += int64_t(fi.file_bytes);
    if (fi.keys.prefix) by_prefix_[fi.keys.prefix] = en->id;
    if (fi.keys.content && !by_content_.count(fi.keys.content)) by_content_[fi.keys.content] = en->id;
    entries_[en->id] = std::move(en);
  }
}

void ChunkStore::touch(Entry& e) {
  ++tick_;
  e.score = e.score_now(tick_) + 1;
  e.last = tick_;
}

std::shared_ptr<const Chunk> ChunkStore::load_locked(Entry& e) {
  if (e.ram) return e.ram;
  if (e.path.empty()) return nullptr;
  std::shared_ptr<Chunk> c;
  try {
    c = std::make_shared<Chunk>(read_chunk_file(e.path, shape_, model_hash_));
  } catch (const Error& err) {
    const std::string path = e.path;
    e.path.clear();  // the file is gone: drop_locked must not count it again
    st_.bytes_disk -= int64_t(e.disk_bytes);
    note_corrupt_locked(path, err.what());
    drop_locked(e.id);
    return nullptr;
  }
  ++st_.disk_loads;
  const size_t b = c->bytes();
  evict_ram_locked(b);
  e.ram = c;
  e.ram_bytes = b;
  st_.bytes_ram += int64_t(b);
  return c;
}

std::shared_ptr<const Chunk> ChunkStore::find_prefix(const ChunkKeys& keys, std::span<const int32_t> tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  ++st_.lookups;
  auto it = by_prefix_.find(keys.prefix);
  if (it == by_prefix_.end()) return nullptr;
  const uint64_t id = it->second;
  Entry& e = *entries_.at(id);
  if (e.keys.check != keys.check || e.n_tokens != int64_t(tokens.size())) return nullptr;
  auto c = load_locked(e);
  if (!c || !std::equal(c->tokens.begin(), c->tokens.end(), tokens.begin(), tokens.end())) return nullptr;
  touch(*entries_.at(id));
  ++st_.prefix_hits;
  return c;
}

std::shared_ptr<const Chunk> ChunkStore::find_content(uint64_t content_key, std::span<const int32_t> tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  ++st_.lookups;
  auto it = by_content_.find(content_key);
  if (it == by_content_.end()) return nullptr;
  const uint64_t id = it->second;
  Entry& e = *entries_.at(id);
  if (e.n_tokens != int64_t(tokens.size())) return nullptr;
  auto c = load_locked(e);
  if (!c || !std::equal(c->tokens.begin(), c->tokens.end(), tokens.begin(), tokens.end())) return nullptr;
  touch(*entries_.at(id));
  ++st_.content_hits;
  return c;
}

bool ChunkStore::contains_prefix(uint64_t k) const {
  std::lock_guard<std::mutex> lock(mu_);
  return by_prefix_.count(k) != 0;
}

bool ChunkStore::contains_content(uint64_t k) const {
  std::lock_guard<std::mutex> lock(mu_);
  return by_content_.count(k) != 0;
}

bool ChunkStore::may_pin_locked(const std::string& owner, size_t bytes) const {
  if (size_t(st_.pinned_bytes) + bytes > opt_.ram_bytes) return false;
  if (opt_.max_pinned_per_owner) {
    auto it = pinned_by_owner_.find(owner);
    const size_t have = it == pinned_by_owner_.end() ? 0 : it->second;
    if (have + bytes > opt_.max_pinned_per_owner) return false;
  }
  return true;
}

void ChunkStore::unpin_locked(Entry& e) {
  if (!e.pinned) return;
  e.pinned = false;
  --st_.pinned;
  st_.pinned_bytes -= int64_t(e.pin_bytes);
  if (auto it = pinned_by_owner_.find(e.owner); it != pinned_by_owner_.end()) {
    it->second -= std::min(it->second, e.pin_bytes);
    if (it->second == 0) pinned_by_owner_.erase(it);
  }
  e.pin_bytes = 0;
}

size_t ChunkStore::pinned_bytes(const std::string& owner) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pinned_by_owner_.find(owner);
  return it == pinned_by_owner_.end() ? 0 : it->second;
}

bool ChunkStore::put(std::shared_ptr<Chunk> c, bool pin, std::string_view ns, const std::string& owner) {
  if (!c || c->tokens.empty()) fail("chunk store: empty chunk");
  if (c->data.size() != chunk_layer_bytes(shape_, c->quant, int64_t(c->tokens.size())) * size_t(shape_.n_layers))
    fail("chunk store: chunk data of ", c->data.size(), " bytes does not match its shape");
  std::shared_ptr<const Chunk> shared = c;
  bool added, refused = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    added = put_locked(std::move(c), pin, owner, &refused);
  }
  if (added && remote_) remote_->enqueue(ns, std::move(shared));
  return !refused;
}

// True when the chunk became a new entry (or could only go to the remote tier). *refused: a pin
// was asked for and refused (over ram_bytes or the owner's max_pinned_per_owner).
bool ChunkStore::put_locked(std::shared_ptr<Chunk> c, bool pin, const std::string& owner, bool* refused) {
  // Already there? Keep the existing entry (it may be pinned or hot).
  uint64_t existing = 0;
  if (c->keys.prefix) {
    if (auto it = by_prefix_.find(c->keys.prefix); it != by_prefix_.end()) existing = it->second;
  } else if (auto it = by_content_.find(c->keys.content); it != by_content_.end()) {
    existing = it->second;
  }
  const size_t b = c->bytes();
  if (pin && !may_pin_locked(owner, b)) {
    pin = false;
    if (refused) *refused = true;
    ++st_.pins_refused;
  }
  if (existing) {
    Entry& e = *entries_.at(existing);
    if (pin && !e.pinned) {
      e.pinned = true, ++st_.pinned;
      e.owner = owner;
      e.pin_bytes = b;
      st_.pinned_bytes += int64_t(b);
      pinned_by_owner_[owner] += b;
    }
    if (pin) load_locked(e);
    return false;
  }
  if (!pin && b > opt_.ram_bytes && opt_.disk_dir.empty()) return true;  // cannot hold it here (the remote may)
  evict_ram_locked(b);
  auto en = std::make_unique<Entry>();
  en->id = next_id_++;
  en->keys = c->keys;
  en->n_tokens = int64_t(c->tokens.size());
  en->ram = c;
  en->ram_bytes = b;
  en->pinned = pin;
  st_.pinned += pin;
  if (pin) {
    en->owner = owner;
    en->pin_bytes = b;
    st_.pinned_bytes += int64_t(b);
    pinned_by_owner_[owner] += b;
  }
  st_.bytes_ram += int64_t(b);
  ++st_.stores;
  if (c->keys.prefix) by_prefix_[c->keys.prefix] = en->id;
  if (c->keys.content && !by_content_.count(c->keys.content)) by_content_[c->keys.content] = en->id;
  touch(*en);
  if (!opt_.disk_dir.empty()) {
    en->queued = true;
    queue_.emplace_back(en->id, c);
    cv_.notify_one();
  }
  entries_[en->id] = std::move(en);
  return true;
}

int64_t ChunkStore::fetch_remote(std::string_view ns, std::span<const ChunkQuery> chunks, bool content) {
  if (!remote_ || chunks.empty()) return 0;
  auto have = [&](size_t i) {
    const ChunkQuery& q = chunks[i];
    return (q.keys.prefix && contains_prefix(q.keys.prefix)) || (content && contains_content(q.keys.content));
  };
  std::vector<std::shared_ptr<Chunk>> got = remote_->fetch(ns, chunks, content, have, opt_.ram_bytes / 2);
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = 0;
  for (auto& c : got) n += put_locked(std::move(c), false, std::string(), nullptr);  // promoted to RAM (and disk), not written back
  return n;
}

bool RemoteFetch::wait_for(double ms) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::microseconds(int64_t(std::max(0.0, ms) * 1e3)), [&] { return done_; });
}

bool RemoteFetch::ready() {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void RemoteFetch::finish(int64_t n_promoted) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    n = n_promoted;
    ms = now_ms() - t0;
    done_ = true;
  }
  cv_.notify_all();
}

std::shared_ptr<RemoteFetch> ChunkStore::fetch_remote_async(std::string ns, std::vector<ChunkKeys> keys,
                                                            std::vector<std::vector<int32_t>> tokens, bool content) {
  auto f = std::make_shared<RemoteFetch>();
  f->t0 = now_ms();
  if (!remote_ || keys.empty() || keys.size() != tokens.size()) {
    f->finish(0);
    return f;
  }
  size_t bytes = 0;
  int64_t n_tok = 0;
  for (const auto& t : tokens)
    bytes += chunk_layer_bytes(shape_, opt_.quant, int64_t(t.size())) * size_t(shape_.n_layers), n_tok += int64_t(t.size());
  f->expected_ms = remote_->expected_fetch_ms(bytes);
  f->compute_ms = remote_->expected_compute_ms(n_tok);
  // The job runs on the remote tier's thread, which the store's destructor joins first: `this` outlives it.
  remote_->submit([this, f, ns = std::move(ns), keys = std::move(keys), tokens = std::move(tokens), content](bool run) {
    int64_t n = 0;
    if (run) {
      std::vector<ChunkQuery> q(keys.size());
      for (size_t i = 0; i < keys.size(); ++i) q[i] = {keys[i], tokens[i]};
      n = fetch_remote(ns, q, content);
    }
    f->finish(n);
  });
  return f;
}

void ChunkStore::note_prefill(int64_t n_tokens, double ms) {
  if (remote_) remote_->note_prefill(n_tokens, ms);
}

std::vector<RemoteEntryInfo> ChunkStore::list_remote(size_t limit) const {
  if (!remote_) fail("chunk store: no remote tier (--chunk-remote)");
  return remote_->list(limit);
}

void ChunkStore::evict_ram_locked(size_t incoming) {
  while (st_.bytes_ram > 0 && size_t(st_.bytes_ram) + incoming > opt_.ram_bytes) {
    Entry* victim = nullptr;
    double best = 0;
    for (auto& [id, e] : entries_) {
      if (!e->ram || e->pinned) continue;
      const double s = e->score_now(tick_);
      if (!victim || s < best) victim = e.get(), best = s;
    }
    if (!victim) return;  // everything left is pinned
    ++st_.evictions_ram;
    st_.bytes_ram -= int64_t(victim->ram_bytes);
    victim->ram.reset();
    victim->ram_bytes = 0;
    if (victim->path.empty() && !victim->queued) drop_locked(victim->id);
    // queued: the writer holds its own reference and will give it a path
  }
}

void ChunkStore::evict_disk_locked() {
  if (opt_.disk_bytes == 0) return;
  while (size_t(st_.bytes_disk) > opt_.disk_bytes) {
    Entry* victim = nullptr;
    double best = 0;
    for (auto& [id, e] : entries_) {
      if (e->path.empty() || e->pinned) continue;
      const double s = e->score_now(tick_);
      if (!victim || s < best) victim = e.get(), best = s;
    }
    if (!victim) return;
    ++st_.evictions_disk;
    ::unlink(victim->path.c_str());
    st_.bytes_disk -= int64_t(victim->disk_bytes);
    victim->path.clear();
    victim->disk_bytes = 0;
    if (!victim->ram) drop_locked(victim->id);
  }
}

void ChunkStore::drop_locked(uint64_t id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  Entry& e = *it->second;
  if (e.keys.prefix) {
    if (auto p = by_prefix_.find(e.keys.prefix); p != by_prefix_.end() && p->second == id) by_prefix_.erase(p);
  }
  if (e.keys.content) {
    if (auto p = by_content_.find(e.keys.content); p != by_content_.end() && p->second == id) by_content_.erase(p);
  }
  st_.bytes_ram -= int64_t(e.ram_bytes);
  if (!e.path.empty()) {
    ::unlink(e.path.c_str());
    st_.bytes_disk -= int64_t(e.disk_bytes);
  }
  unpin_locked(e);
  entries_.erase(it);
}

void ChunkStore::writer_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) {
      if (stop_) return;
      continue;
    }
    auto [id, c] = queue_.front();
    queue_.pop_front();
    writing_ = true;
    const std::string path = opt_.disk_dir + "/" + hex16(c->keys.prefix ? c->keys.prefix : c->keys.content) +
                             (c->keys.prefix ? "p" : "c") + ".kvc";
    lock.unlock();
    std::string err;
    size_t bytes = 0;
    try {
      write_chunk_file(path, *c, shape_, model_hash_);
      bytes = 8 + 104 + c->tokens.size() * 4 + c->data.size();
    } catch (const std::exception& e) {
      err = e.what();
    }
    lock.lock();
    writing_ = false;
    auto it = entries_.find(id);
    if (!err.empty()) {
      log_warn("chunk store: ", err);
      if (it != entries_.end()) {
        it->second->queued = false;
        if (!it->second->ram) drop_locked(id);
      }
    } else if (it == entries_.end()) {
      ::unlink(path.c_str());  // dropped meanwhile
    } else {
      Entry& e = *it->second;
      e.queued = false;
      e.path = path;
      e.disk_bytes = bytes;
      st_.bytes_disk += int64_t(bytes);
      evict_disk_locked();
    }
    idle_cv_.notify_all();
  }
}

void ChunkStore::flush() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    idle_cv_.wait(lock, [&] { return queue_.empty() && !writing_; });
  }
  if (remote_) remote_->flush();
}

int64_t ChunkStore::verify_disk() {
  flush();
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<uint64_t> bad;
  for (auto& [id, e] : entries_) {
    if (e->path.empty()) continue;
    try {
      (void)read_chunk_file(e->path, shape_, model_hash_);
    } catch (const Error& err) {
      const std::string path = e->path;
      e->path.clear();
      st_.bytes_disk -= int64_t(e->disk_bytes);
      e->disk_bytes = 0;
      note_corrupt_locked(path, err.what());
      if (!e->ram) bad.push_back(id);
    }
  }
  for (uint64_t id : bad) drop_locked(id);
  return int64_t(bad.size());
}

void ChunkStore::unpin_all() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, e] : entries_) unpin_locked(*e);
  st_.pinned = 0;
  st_.pinned_bytes = 0;
  pinned_by_owner_.clear();
  evict_ram_locked(0);
}

ChunkStats ChunkStore::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  ChunkStats s = st_;
  s.entries = int64_t(entries_.size());
  s.entries_ram = s.entries_disk = 0;
  for (auto& [id, e] : entries_) {
    s.entries_ram += e->ram != nullptr;
    s.entries_disk += !e->path.empty();
  }
  if (remote_) s.remote = remote_->stats();
  return s;
}

}  // namespace kvboost::kv
