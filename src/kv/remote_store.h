// Internal: the chunk store's remote tier on Redis / Valkey (hiredis), shared by many servers.
//
// One object per chunk, written with one SET (so no reader ever sees half an entry):
//   key   = PREFIX ":" hex(model hash) ":v1:" escaped(namespace) ":" ("p" prefix key | "c" content key) hex(key)
//   value = "KVBREMT1", u32 layout version, u32 + model id, u32 + namespace, u64 XXH3 of those,
//           then the chunk file encoding (chunk_file.h: shape, quantization, keys, tokens, payload,
//           checksum).
// A fetched value is used only after every field is checked against what was asked for.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "kvboost/kv.h"

struct redisContext;

namespace kvboost::kv {

struct RemoteUrl {
  std::string host;        // "" for a unix socket
  int port = 6379;
  std::string socket;      // unix socket path
  int db = 0;
  std::string user, password;
  std::string prefix = "kvboost";
};
// Throws Error naming the URL and the problem (rediss:// included: Debian's hiredis 0.14 has no TLS).
RemoteUrl parse_remote_url(const std::string& url);
// The URL with its password replaced by "***" (for logs and errors).
std::string redact_remote_url(const std::string& url);

// The remote key of a chunk: prefix, model, layout version, namespace, kind + key.
std::string remote_key(const std::string& prefix, uint64_t model_hash, std::string_view ns, bool exact, uint64_t key);
// Value encoding (exposed for tests).
std::string encode_remote_value(const Chunk& c, const ChunkShape& s, const std::string& model_id, uint64_t model_hash,
                                std::string_view ns);
// Decodes and verifies a value; throws Error naming `key` and the problem.
Chunk decode_remote_value(std::string_view v, const ChunkShape& s, const std::string& model_id, uint64_t model_hash,
                          std::string_view ns, const std::string& key);
size_t remote_value_bytes(const ChunkShape& s, KvQuant q, int64_t n_tokens, const std::string& model_id,
                          std::string_view ns);

class RemoteStore {
 public:
  RemoteStore(const ChunkShape& shape, const ChunkStoreOptions& opt, uint64_t model_hash);
  ~RemoteStore();
  RemoteStore(const RemoteStore&) = delete;
  RemoteStore& operator=(const RemoteStore&) = delete;

  // Verified chunks found for `chunks` (any order), after the cost model's choice. `have(i)`
  // says whether the local tiers already hold chunk i (then it is not asked for).
  std::vector<std::shared_ptr<Chunk>> fetch(std::string_view ns, std::span<const ChunkQuery> chunks, bool content,
                                            const std::function<bool(size_t)>& have, size_t max_bytes);
  // Queues an asynchronous SET (dropped, and counted, when the queue is full).
  void enqueue(std::string_view ns, std::shared_ptr<const Chunk> c);
  void flush();  // waits until the queue is empty and no write is in flight
  void note_prefill(int64_t n_tokens, double ms);
  // The cost model's estimates: a round trip fetching `bytes`; recomputing n tokens (infinity
  // until a prefill was measured).
  double expected_fetch_ms(size_t bytes) const;
  double expected_compute_ms(int64_t n_tokens) const;
  // Runs `job` on the lookup thread (in order); job(false) instead when the store closes first.
  void submit(std::function<void(bool run)> job);
  void stop_lookups();  // finishes the lookup in flight, drops the rest; the store owning this calls it first
  RemoteStats stats() const;
  std::vector<RemoteEntryInfo> list(size_t limit);

 private:
  struct Conn {
    redisContext* ctx = nullptr;
    double next_try_ms = 0, backoff_ms = 0;
  };
  bool ensure(Conn& c);                                      // connected, or false (backing off)
  void broken(Conn& c, const std::string& why);              // closes; backoff; warns once per episode
  void healthy();                                            // ends an outage episode
  void writer_loop();
  void lookup_loop();
  void observe(double ms, size_t bytes);                     // cost model: RTT and bandwidth

  ChunkShape shape_;
  ChunkStoreOptions opt_;
  RemoteUrl url_;
  std::string shown_url_;  // redacted
  uint64_t model_hash_;
  std::string key_prefix_;  // PREFIX ":" hex(model) ":v1:"

  mutable std::mutex st_mu_;  // stats, estimates, episode flags
  RemoteStats st_;
  bool down_ = false, write_err_episode_ = false, corrupt_episode_ = false, no_script_ = false;
  double rtt_ms_ = 0, bytes_per_ms_ = 0, tok_per_ms_ = 0;

  std::mutex fetch_mu_;  // the request path's connection
  Conn fetch_conn_;

  std::mutex q_mu_;  // the writer's queue and connection
  std::condition_variable q_cv_, idle_cv_;
  std::deque<std::pair<std::string, std::shared_ptr<const Chunk>>> queue_;
  bool stop_ = false, writing_ = false;
  Conn write_conn_;
  std::thread writer_;

  std::mutex lk_mu_;  // the lookup thread's queue (fetch_remote_async)
  std::condition_variable lk_cv_;
  std::deque<std::function<void(bool)>> lookups_;
  bool lk_stop_ = false;
  std::thread lookup_;
};

}  // namespace kvboost::kv
