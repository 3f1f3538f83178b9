// The chunk store's remote tier on Redis / Valkey (see remote_store.h and docs/chunk-remote.md).
//
// Two connections: one for the request path (one MGET per prompt, under fetch_mu_), one for the
// writer thread (SETs, and a PING every second when idle, which keeps the RTT estimate fresh and
// finds a restarted server). A failed connection is closed and retried with exponential backoff
// (100 ms doubling to 5 s); while backing off, lookups are skipped at once (counted
// `unavailable`), so a dead Redis costs a request nothing. Warnings are logged once per episode
// (outage, write error replies such as OOM, corrupt values) and the episode ends on success.
//
// The cost model: a chunk is fetched only when its bytes / measured bandwidth is below its tokens /
// measured prefill rate, and the whole round trip (RTT + all bytes / bandwidth) is below 90% of the
// recompute time it saves. RTT, bandwidth and prefill rate are EWMAs (alpha 0.25).
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <hiredis/hiredis.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <sstream>

#include "chunk_file.h"
#include "remote_store.h"

namespace kvboost::kv {
namespace {

constexpr char kValueMagic[8] = {'K', 'V', 'B', 'R', 'E', 'M', 'T', '1'};
constexpr uint32_t kLayoutVersion = 1;
constexpr double kAlpha = 0.25, kMargin = 0.9;
// KEYS come in pairs (prefix key, content key): per pair the prefix entry, else the content entry.
constexpr const char* kPairScript =
    "local r = {} for i = 1, #KEYS, 2 do local v = redis.call('GET', KEYS[i]) "
    "if not v and KEYS[i + 1] ~= KEYS[i] then v = redis.call('GET', KEYS[i + 1]) end r[#r + 1] = v end return r";
constexpr double kBackoffMinMs = 100, kBackoffMaxMs = 5000;
constexpr double kDefaultBytesPerMs = 200e3;  // 200 MB/s until measured

template <typename... A>
void log_warn(const A&... a) {
  std::ostringstream os;
  (os << ... << a);
  std::fprintf(stderr, "kvboost: warning: %s\n", os.str().c_str());
}

std::string hex16(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

double ewma(double old, double x) { return old > 0 ? old + kAlpha * (x - old) : x; }

void put_u32(std::string& o, uint32_t v) { o.append(reinterpret_cast<const char*>(&v), 4); }

struct Reply {  // owns a hiredis reply
  redisReply* r = nullptr;
  explicit Reply(void* p) : r(static_cast<redisReply*>(p)) {}
  ~Reply() {
    if (r) freeReplyObject(r);
  }
  Reply(const Reply&) = delete;
  Reply& operator=(const Reply&) = delete;
};

// Runs one command (binary-safe arguments). nullptr reply: the connection failed (ctx->errstr).
redisReply* command(redisContext* ctx, const std::vector<std::string>& args) {
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (const auto& a : args) argv.push_back(a.data()), lens.push_back(a.size());
  return static_cast<redisReply*>(redisCommandArgv(ctx, int(args.size()), argv.data(), lens.data()));
}

void append_command(redisContext* ctx, const std::vector<std::string>& args) {  // pipelined: the reply is read later
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (const auto& a : args) argv.push_back(a.data()), lens.push_back(a.size());
  redisAppendCommandArgv(ctx, int(args.size()), argv.data(), lens.data());
}

std::string escape_ns(std::string_view ns) {  // keys stay printable and ':'-free per field
  std::string o;
  for (unsigned char ch : ns) {
    if (std::isalnum(ch) || ch == '_' || ch == '-' || ch == '.') {
      o += char(ch);
    } else {
      char b[4];
      std::snprintf(b, sizeof b, "%%%02X", ch);
      o += b;
    }
  }
  return o;
}

int parse_int(const std::string& s, const std::string& url, const char* what) {
  try {
    size_t n = 0;
    const int v = std::stoi(s, &n);
    if (n == s.size() && v >= 0) return v;
  } catch (const std::exception&) {
  }
  fail("--chunk-remote ", url, ": bad ", what, " \"", s, "\"");
}

}  // namespace

std::string redact_remote_url(const std::string& url) {  // passwords never reach a log
  const size_t scheme = url.find("://"), at = url.rfind('@');
  if (scheme == std::string::npos || at == std::string::npos || at < scheme) return url;
  const size_t colon = url.find(':', scheme + 3);
  if (colon != std::string::npos && colon < at) return url.substr(0, colon + 1) + "***" + url.substr(at);
  return url.substr(0, scheme + 3) + "***" + url.substr(at);
}

RemoteUrl parse_remote_url(const std::string& url_in) {
  const std::string url = redact_remote_url(url_in);  // for messages
  const std::string& raw = url_in;
  RemoteUrl u;
  std::string rest;
  if (raw.rfind("rediss://", 0) == 0)
    fail("--chunk-remote ", url, ": TLS (rediss://) is not available: Debian's hiredis 0.14 is built without SSL; "
         "use redis:// on a private network, a unix:// socket, or a TLS tunnel (stunnel) on loopback");
  const bool unix_sock = raw.rfind("unix://", 0) == 0;
  if (raw.rfind("redis://", 0) == 0) rest = raw.substr(8);
  else if (unix_sock) rest = raw.substr(7);
  else fail("--chunk-remote ", url, ": expected redis://HOST[:PORT][/DB] or unix:///PATH");
  std::string query;
  if (const size_t q = rest.find('?'); q != std::string::npos) query = rest.substr(q + 1), rest.resize(q);
  for (size_t b = 0; b < query.size();) {
    size_t e = query.find('&', b);
    if (e == std::string::npos) e = query.size();
    const std::string kv = query.substr(b, e - b);
    const size_t eq = kv.find('=');
    const std::string k = kv.substr(0, eq), v = eq == std::string::npos ? "" : kv.substr(eq + 1);
    if (k == "prefix" && !v.empty() && v.find_first_of(" \t\r\n") == std::string::npos) u.prefix = v;
    else if (k == "db") u.db = parse_int(v, url, "database number");
    else fail("--chunk-remote ", url, ": unknown or empty parameter \"", kv, "\" (known: prefix=NAME, db=N)");
    b = e + 1;
  }
  if (unix_sock) {
    if (rest.empty() || rest[0] != '/') fail("--chunk-remote ", url, ": expected an absolute socket path, unix:///PATH");
    u.socket = rest;
    return u;
  }
  if (const size_t at = rest.rfind('@'); at != std::string::npos) {
    const std::string cred = rest.substr(0, at);
    rest = rest.substr(at + 1);
    const size_t colon = cred.find(':');
    if (colon == std::string::npos) u.password = cred;  // redis://PASSWORD@HOST (the default user)
    else u.user = cred.substr(0, colon), u.password = cred.substr(colon + 1);
  }
  if (const size_t slash = rest.find('/'); slash != std::string::npos) {
    const std::string db = rest.substr(slash + 1);
    if (!db.empty()) u.db = parse_int(db, url, "database number");
    rest.resize(slash);
  }
  if (const size_t colon = rest.rfind(':'); colon != std::string::npos) {
    u.port = parse_int(rest.substr(colon + 1), url, "port");
    if (u.port < 1 || u.port > 65535) fail("--chunk-remote ", url, ": port ", u.port, " out of range");
    rest.resize(colon);
  }
  if (rest.empty()) fail("--chunk-remote ", url, ": no host");
  u.host = rest;
  return u;
}

std::string remote_key(const std::string& prefix, uint64_t model_hash, std::string_view ns, bool exact, uint64_t key) {
  return prefix + ":" + hex16(model_hash) + ":v" + std::to_string(kLayoutVersion) + ":" + escape_ns(ns) + ":" +
         (exact ? "p" : "c") + hex16(key);
}

namespace {
std::string outer_header(const std::string& model_id, std::string_view ns) {
  std::string o(kValueMagic, 8);
  put_u32(o, kLayoutVersion);
  put_u32(o, uint32_t(model_id.size()));
  o += model_id;
  put_u32(o, uint32_t(ns.size()));
  o += ns;
  const uint64_t h = XXH3_64bits(o.data(), o.size());
  o.append(reinterpret_cast<const char*>(&h), 8);
  return o;
}
}  // namespace

size_t remote_value_bytes(const ChunkShape& s, KvQuant q, int64_t n_tokens, const std::string& model_id,
                          std::string_view ns) {
  return 8 + 4 + 4 + model_id.size() + 4 + ns.size() + 8 +
         chunk_encoded_bytes(size_t(n_tokens), chunk_layer_bytes(s, q, n_tokens) * size_t(s.n_layers));
}

std::string encode_remote_value(const Chunk& c, const ChunkShape& s, const std::string& model_id, uint64_t model_hash,
                                std::string_view ns) {
  return outer_header(model_id, ns) + encode_chunk(c, s, model_hash);
}

Chunk decode_remote_value(std::string_view v, const ChunkShape& s, const std::string& model_id, uint64_t model_hash,
                          std::string_view ns, const std::string& key) {
  const std::string want = outer_header(model_id, ns);
  if (v.size() < 8 || std::memcmp(v.data(), kValueMagic, 8) != 0) fail(key, ": not a KVBoost remote chunk (bad magic)");
  if (v.size() < 12) fail(key, ": truncated remote chunk (", v.size(), " bytes)");
  uint32_t ver;
  std::memcpy(&ver, v.data() + 8, 4);
  if (ver != kLayoutVersion) fail(key, ": remote chunk layout version ", ver, " (supported: ", kLayoutVersion, ")");
  if (v.size() < want.size() || v.substr(0, want.size()) != want) {
    uint32_t n = 0;
    if (v.size() >= 16) std::memcpy(&n, v.data() + 12, 4);
    if (v.size() >= 16 + size_t(n) && v.substr(16, n) != model_id) fail(key, ": remote chunk belongs to another model");
    fail(key, ": remote chunk header mismatch (namespace or header checksum)");
  }
  return decode_chunk(v.substr(want.size()), s, model_hash, key);
}

// ---- RemoteStore -------------------------------------------------------------------------------

RemoteStore::RemoteStore(const ChunkShape& shape, const ChunkStoreOptions& opt, uint64_t model_hash)
    : shape_(shape),
      opt_(opt),
      url_(parse_remote_url(opt.remote_url)),
      shown_url_(redact_remote_url(opt.remote_url)),
      model_hash_(model_hash) {
  if (opt_.remote_timeout_ms < 1) fail("remote timeout ", opt_.remote_timeout_ms, " ms must be positive");
  if (opt_.remote_ttl_s < 0) fail("--chunk-remote-ttl ", opt_.remote_ttl_s, " must be >= 0");
  key_prefix_ = url_.prefix + ":" + hex16(model_hash_) + ":v" + std::to_string(kLayoutVersion) + ":";
  st_.enabled = true;
  {
    std::lock_guard<std::mutex> lock(fetch_mu_);
    ensure(fetch_conn_);  // down at start: a warning, and the tier retries later
  }
  writer_ = std::thread([this] { writer_loop(); });
  lookup_ = std::thread([this] { lookup_loop(); });
}

void RemoteStore::stop_lookups() {
  {
    std::lock_guard<std::mutex> lock(lk_mu_);
    lk_stop_ = true;
  }
  lk_cv_.notify_all();
  if (lookup_.joinable()) lookup_.join();
}

RemoteStore::~RemoteStore() {
  stop_lookups();
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    stop_ = true;
  }
  q_cv_.notify_all();
  if (writer_.joinable()) writer_.join();
  if (fetch_conn_.ctx) redisFree(fetch_conn_.ctx);
  if (write_conn_.ctx) redisFree(write_conn_.ctx);
}

bool RemoteStore::ensure(Conn& c) {
  if (c.ctx) return true;
  const double now = now_ms();
  if (now < c.next_try_ms) return false;
  const timeval tv{opt_.remote_timeout_ms / 1000, (opt_.remote_timeout_ms % 1000) * 1000};
  redisContext* ctx = url_.socket.empty() ? redisConnectWithTimeout(url_.host.c_str(), url_.port, tv)
                                          : redisConnectUnixWithTimeout(url_.socket.c_str(), tv);
  c.ctx = ctx;
  if (!ctx || ctx->err) {
    broken(c, ctx ? ctx->errstr : "cannot allocate a connection");
    return false;
  }
  redisSetTimeout(ctx, tv);
  auto ok = [&](const std::vector<std::string>& args, const char* what) {
    Reply r(command(ctx, args));
    if (!r.r) return broken(c, ctx->errstr), false;
    if (r.r->type == REDIS_REPLY_ERROR) return broken(c, std::string(what) + ": " + r.r->str), false;
    return true;
  };
  if (!url_.password.empty()) {
    std::vector<std::string> a{"AUTH"};
    if (!url_.user.empty()) a.push_back(url_.user);
    a.push_back(url_.password);
    if (!ok(a, "AUTH")) return false;
  }
  if (url_.db != 0 && !ok({"SELECT", std::to_string(url_.db)}, "SELECT")) return false;
  const double t0 = now_ms();
  if (!ok({"PING"}, "PING")) return false;
  observe(now_ms() - t0, 0);
  c.backoff_ms = 0;
  healthy();
  return true;
}

void RemoteStore::broken(Conn& c, const std::string& why) {
  if (c.ctx) redisFree(c.ctx);
  c.ctx = nullptr;
  c.backoff_ms = c.backoff_ms > 0 ? std::min(kBackoffMaxMs, c.backoff_ms * 2) : kBackoffMinMs;
  c.next_try_ms = now_ms() + c.backoff_ms;
  std::lock_guard<std::mutex> lock(st_mu_);
  ++st_.errors;
  if (!down_)
    log_warn("remote chunk store ", shown_url_, " unavailable (", why,
             "): serving from the local tiers and recompute; retrying with backoff");
  down_ = true;
  st_.up = false;
}

void RemoteStore::healthy() {
  std::lock_guard<std::mutex> lock(st_mu_);
  if (down_ && st_.errors > 0) log_warn("remote chunk store ", shown_url_, " reachable again");
  down_ = false;
  st_.up = true;
}

void RemoteStore::observe(double ms, size_t bytes) {
  std::lock_guard<std::mutex> lock(st_mu_);
  if (bytes < (size_t(64) << 10)) {
    rtt_ms_ = ewma(rtt_ms_, ms);
  } else {
    const double t = std::max(ms - rtt_ms_, ms * 0.1);
    bytes_per_ms_ = ewma(bytes_per_ms_, double(bytes) / std::max(t, 1e-3));
  }
  st_.rtt_ms = rtt_ms_;
  st_.mb_per_s = bytes_per_ms_ / 1e3;
}

void RemoteStore::note_prefill(int64_t n_tokens, double ms) {
  if (n_tokens < 8 || !(ms > 0)) return;
  std::lock_guard<std::mutex> lock(st_mu_);
  tok_per_ms_ = ewma(tok_per_ms_, double(n_tokens) / ms);
  st_.prefill_tok_per_s = tok_per_ms_ * 1e3;
}

std::vector<std::shared_ptr<Chunk>> RemoteStore::fetch(std::string_view ns, std::span<const ChunkQuery> chunks, bool content,
                                                       const std::function<bool(size_t)>& have, size_t max_bytes) {
  std::vector<std::shared_ptr<Chunk>> out;
  // The cost model's choice.
  double rtt, bpm, tpm;
  {
    std::lock_guard<std::mutex> lock(st_mu_);
    rtt = rtt_ms_, bpm = bytes_per_ms_ > 0 ? bytes_per_ms_ : kDefaultBytesPerMs, tpm = tok_per_ms_;
  }
  struct Ask {
    size_t chunk;
    bool exact;
  };
  std::vector<Ask> asks;
  std::vector<std::string> args{"MGET"};
  std::vector<size_t> picked;
  double fetch_cost = rtt, saved = 0;
  size_t total = 0;
  int64_t n_skipped = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (have(i)) continue;
    const auto& q = chunks[i];
    const size_t b = remote_value_bytes(shape_, opt_.quant, int64_t(q.tokens.size()), opt_.model_id, ns);
    const double t_fetch = double(b) / bpm, t_compute = tpm > 0 ? double(q.tokens.size()) / tpm : 1e30;
    if (t_fetch >= t_compute || b > opt_.remote_max_entry_bytes || total + b > max_bytes) {
      ++n_skipped;
      continue;
    }
    picked.push_back(i);
    total += b;
    fetch_cost += t_fetch;
    saved += t_compute;
  }
  if (!picked.empty() && fetch_cost >= kMargin * saved) n_skipped += int64_t(picked.size()), picked.clear();
  if (n_skipped) {
    std::lock_guard<std::mutex> lock(st_mu_);
    st_.skipped += n_skipped;
  }
  if (picked.empty()) return out;
  // Exact chunks are also stored under their content key (the writer), so asking both keys of a
  // chunk would bring its bytes twice: with content keys a script returns, per chunk, the prefix
  // entry or else the content entry (one round trip). Where EVAL is refused (an ACL without
  // +eval), MGET of both keys.
  bool use_script;
  {
    std::lock_guard<std::mutex> sl(st_mu_);
    use_script = content && !no_script_;
  }
  auto build = [&] {
    asks.clear();
    args.assign({use_script ? "EVAL" : "MGET"});
    if (use_script) args.push_back(kPairScript), args.push_back("0");
    for (size_t i : picked) {
      const auto& q = chunks[i];
      if (use_script) {
        asks.push_back({i, true});
        args.push_back(remote_key(url_.prefix, model_hash_, ns, true, q.keys.prefix));
        args.push_back(q.keys.content ? remote_key(url_.prefix, model_hash_, ns, false, q.keys.content) : args.back());
        continue;
      }
      if (q.keys.prefix) asks.push_back({i, true}), args.push_back(remote_key(url_.prefix, model_hash_, ns, true, q.keys.prefix));
      if (content && q.keys.content)
        asks.push_back({i, false}), args.push_back(remote_key(url_.prefix, model_hash_, ns, false, q.keys.content));
    }
    if (use_script) args[2] = std::to_string(args.size() - 3);
  };
  build();
  std::lock_guard<std::mutex> lock(fetch_mu_);
  bool down;
  {
    std::lock_guard<std::mutex> sl(st_mu_);
    down = down_;
  }
  // While down, only the writer thread's probe reconnects: a request never waits for a connect.
  if ((down && !fetch_conn_.ctx) || !ensure(fetch_conn_)) {
    std::lock_guard<std::mutex> sl(st_mu_);
    st_.unavailable += int64_t(picked.size());
    return out;
  }
  double t0 = now_ms();
  Reply r(command(fetch_conn_.ctx, args));
  if (use_script && r.r && r.r->type == REDIS_REPLY_ERROR) {  // e.g. NOPERM, scripting disabled
    log_warn("remote chunk store ", shown_url_, ": EVAL refused (", r.r->str, "): content lookups use MGET of both keys");
    {
      std::lock_guard<std::mutex> sl(st_mu_);
      no_script_ = true;
    }
    use_script = false;
    build();
    t0 = now_ms();
    if (r.r) freeReplyObject(r.r);
    r.r = static_cast<redisReply*>(command(fetch_conn_.ctx, args));
  }
  const double ms = now_ms() - t0;
  if (!r.r || r.r->type != REDIS_REPLY_ARRAY || r.r->elements != asks.size()) {
    std::string why = !r.r ? std::string(fetch_conn_.ctx->errstr)
                           : r.r->type == REDIS_REPLY_ERROR ? std::string("MGET: ") + r.r->str : "MGET: unexpected reply";
    if (!r.r) {
      broken(fetch_conn_, why);
    } else {
      std::lock_guard<std::mutex> sl(st_mu_);
      ++st_.errors;
      if (!down_) log_warn("remote chunk store ", shown_url_, ": ", why, " (treated as a miss)");
    }
    std::lock_guard<std::mutex> sl(st_mu_);
    st_.unavailable += int64_t(picked.size());
    return out;
  }
  size_t got_bytes = 0;
  std::vector<uint8_t> found(chunks.size(), 0);
  int64_t n_corrupt = 0;
  std::string first_problem;
  for (size_t a = 0; a < asks.size(); ++a) {
    const redisReply* e = r.r->element[a];
    if (e->type != REDIS_REPLY_STRING) continue;
    got_bytes += e->len;
    const size_t i = asks[a].chunk;
    if (found[i]) continue;  // the prefix entry won
    const ChunkQuery& q = chunks[i];
    const std::string& key = args[use_script ? 3 + 2 * a : a + 1];
    try {
      if (e->len > opt_.remote_max_entry_bytes) fail(key, ": ", e->len, " bytes, over the entry size cap");
      auto c = std::make_shared<Chunk>(decode_remote_value(std::string_view(e->str, e->len), shape_, opt_.model_id,
                                                           model_hash_, ns, key));
      if (!std::equal(c->tokens.begin(), c->tokens.end(), q.tokens.begin(), q.tokens.end()))
        fail(key, ": remote chunk holds other tokens");
      // The prefix entry (its prefix key and fingerprint), or with content lookups an entry of
      // these tokens' content key: content-only, or an exact chunk of another context (written
      // under its content key too), reused at this position with repair like a local content hit.
      const bool exact_match = c->keys.prefix == q.keys.prefix && c->keys.check == q.keys.check;
      const bool content_match = content && c->keys.content == q.keys.content;
      if (asks[a].exact && !use_script ? !exact_match : !(exact_match || content_match))
        fail(key, ": remote chunk's keys do not match its key");
      found[i] = 1;
      out.push_back(std::move(c));
    } catch (const Error& err) {
      ++n_corrupt;
      if (first_problem.empty()) first_problem = err.what();
    }
  }
  observe(ms, got_bytes);
  std::lock_guard<std::mutex> sl(st_mu_);
  ++st_.fetches;
  st_.fetch_ms_sum += ms;
  size_t bucket = 0;
  while (bucket + 1 < kRemoteFetchBuckets && ms > kRemoteFetchBucketsMs[bucket]) ++bucket;
  ++st_.fetch_ms_buckets[bucket];
  st_.bytes += int64_t(got_bytes);
  st_.hits += int64_t(out.size());
  st_.misses += int64_t(picked.size() - out.size());
  st_.corrupt += n_corrupt;
  if (n_corrupt && !corrupt_episode_)
    log_warn("remote chunk store: ", first_problem, " -- treated as a miss, recomputed (and rewritten)");
  corrupt_episode_ = n_corrupt > 0;
  return out;
}

void RemoteStore::enqueue(std::string_view ns, std::shared_ptr<const Chunk> c) {
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    if (queue_.size() < opt_.remote_queue) {
      queue_.emplace_back(std::string(ns), std::move(c));
      q_cv_.notify_one();
      return;
    }
  }
  std::lock_guard<std::mutex> lock(st_mu_);
  ++st_.write_drops;
}

void RemoteStore::writer_loop() {
  std::unique_lock<std::mutex> lock(q_mu_);
  for (;;) {
    const bool woke = q_cv_.wait_for(lock, std::chrono::seconds(1), [&] { return stop_ || !queue_.empty(); });
    if (stop_ && queue_.empty()) return;
    if (!woke) {  // idle: probe (RTT estimate; reconnect after an outage)
      lock.unlock();
      if (ensure(write_conn_)) {
        const double t0 = now_ms();
        Reply r(command(write_conn_.ctx, {"PING"}));
        if (!r.r) broken(write_conn_, write_conn_.ctx->errstr);
        else observe(now_ms() - t0, 0);
      }
      lock.lock();
      continue;
    }
    auto [ns, c] = std::move(queue_.front());
    queue_.pop_front();
    writing_ = true;
    lock.unlock();
    const std::string key = remote_key(url_.prefix, model_hash_, ns, c->keys.prefix != 0, c->keys.prefix ? c->keys.prefix : c->keys.content);
    const std::string value = encode_remote_value(*c, shape_, opt_.model_id, model_hash_, ns);
    if (value.size() > opt_.remote_max_entry_bytes) {
      std::lock_guard<std::mutex> sl(st_mu_);
      ++st_.too_big;
    } else if (ensure(write_conn_)) {
      // An exact chunk goes under its content key too (the same value, two independent objects:
      // each is complete and verified on its own), so that the same text at another position or
      // after other text is a content hit on another server, as it is locally (ChunkStore indexes
      // exact chunks by both keys). Both SETs in one pipelined round trip.
      const bool both = c->keys.prefix && c->keys.content;
      std::vector<std::string> args{"SET", key, value};
      if (opt_.remote_ttl_s > 0) args.push_back("EX"), args.push_back(std::to_string(opt_.remote_ttl_s));
      const double t0 = now_ms();
      if (both) {
        std::vector<std::string> a2 = args;
        a2[1] = remote_key(url_.prefix, model_hash_, ns, false, c->keys.content);
        append_command(write_conn_.ctx, a2);
      }
      Reply r(command(write_conn_.ctx, args));
      if (both && r.r) {  // the content SET's reply came first; the prefix SET's is what counts
        void* first = r.r;
        r.r = nullptr;
        if (redisGetReply(write_conn_.ctx, reinterpret_cast<void**>(&r.r)) != REDIS_OK) r.r = nullptr;
        freeReplyObject(first);
      }
      const double ms = now_ms() - t0;
      if (!r.r) {
        broken(write_conn_, write_conn_.ctx->errstr);
      } else if (r.r->type == REDIS_REPLY_ERROR) {  // e.g. OOM under maxmemory + noeviction
        std::lock_guard<std::mutex> sl(st_mu_);
        ++st_.write_errors;
        if (!write_err_episode_) log_warn("remote chunk store ", shown_url_, ": SET refused: ", r.r->str, " (entry not shared)");
        write_err_episode_ = true;
      } else {
        observe(ms, both ? 2 * value.size() : value.size());
        std::lock_guard<std::mutex> sl(st_mu_);
        ++st_.writes;
        st_.write_bytes += int64_t(both ? 2 * value.size() : value.size());
        write_err_episode_ = false;
      }
    } else {
      std::lock_guard<std::mutex> sl(st_mu_);
      ++st_.write_drops;
    }
    lock.lock();
    writing_ = false;
    idle_cv_.notify_all();
  }
}

void RemoteStore::submit(std::function<void(bool)> job) {
  {
    std::lock_guard<std::mutex> lock(lk_mu_);
    if (!lk_stop_) {
      lookups_.push_back(std::move(job));
      lk_cv_.notify_one();
      return;
    }
  }
  job(false);
}

void RemoteStore::lookup_loop() {
  std::unique_lock<std::mutex> lock(lk_mu_);
  for (;;) {
    lk_cv_.wait(lock, [&] { return lk_stop_ || !lookups_.empty(); });
    if (lookups_.empty()) return;
    auto job = std::move(lookups_.front());
    lookups_.pop_front();
    const bool run = !lk_stop_;  // closing: the rest are dropped (done, nothing promoted)
    lock.unlock();
    job(run);
    lock.lock();
  }
}

double RemoteStore::expected_fetch_ms(size_t bytes) const {
  std::lock_guard<std::mutex> lock(st_mu_);
  return rtt_ms_ + double(bytes) / (bytes_per_ms_ > 0 ? bytes_per_ms_ : kDefaultBytesPerMs);
}

double RemoteStore::expected_compute_ms(int64_t n_tokens) const {
  std::lock_guard<std::mutex> lock(st_mu_);
  return tok_per_ms_ > 0 ? double(n_tokens) / tok_per_ms_ : INFINITY;
}

void RemoteStore::flush() {
  std::unique_lock<std::mutex> lock(q_mu_);
  idle_cv_.wait(lock, [&] { return queue_.empty() && !writing_; });
}

RemoteStats RemoteStore::stats() const {
  std::lock_guard<std::mutex> lock(st_mu_);
  return st_;
}

std::vector<RemoteEntryInfo> RemoteStore::list(size_t limit) {
  std::lock_guard<std::mutex> lock(fetch_mu_);
  fetch_conn_.next_try_ms = 0;
  if (!ensure(fetch_conn_)) fail("--chunk-remote ", shown_url_, ": cannot connect");
  std::vector<RemoteEntryInfo> out;
  std::string cursor = "0";
  do {
    Reply r(command(fetch_conn_.ctx, {"SCAN", cursor, "MATCH", key_prefix_ + "*", "COUNT", "256"}));
    if (!r.r || r.r->type != REDIS_REPLY_ARRAY || r.r->elements != 2)
      fail("--chunk-remote ", shown_url_, ": SCAN failed: ", r.r && r.r->type == REDIS_REPLY_ERROR ? r.r->str : fetch_conn_.ctx->errstr);
    cursor.assign(r.r->element[0]->str, r.r->element[0]->len);
    const redisReply* keys = r.r->element[1];
    for (size_t k = 0; k < keys->elements && out.size() < limit; ++k) {
      RemoteEntryInfo e;
      e.key.assign(keys->element[k]->str, keys->element[k]->len);
      Reply v(command(fetch_conn_.ctx, {"GET", e.key}));
      Reply t(command(fetch_conn_.ctx, {"TTL", e.key}));
      if (!v.r || !t.r) fail("--chunk-remote ", shown_url_, ": ", fetch_conn_.ctx->errstr);
      if (v.r->type != REDIS_REPLY_STRING) continue;  // expired meanwhile
      e.bytes = v.r->len;
      e.ttl_s = t.r->type == REDIS_REPLY_INTEGER ? t.r->integer : -1;
      // the namespace is the escaped field after the prefix; the value carries it verbatim
      const std::string_view val(v.r->str, v.r->len);
      std::string ns;
      if (val.size() >= 16) {
        uint32_t n;
        std::memcpy(&n, val.data() + 12, 4);
        if (val.size() >= 20 + size_t(n)) {
          uint32_t m;
          std::memcpy(&m, val.data() + 16 + n, 4);
          if (val.size() >= 20 + size_t(n) + m) ns.assign(val.data() + 20 + n, m);
        }
      }
      e.ns = ns;
      try {
        const Chunk c = decode_remote_value(val, shape_, opt_.model_id, model_hash_, ns, e.key);
        const bool exact = c.keys.prefix != 0;
        if (remote_key(url_.prefix, model_hash_, ns, exact, exact ? c.keys.prefix : c.keys.content) != e.key &&
            remote_key(url_.prefix, model_hash_, ns, false, c.keys.content) != e.key)
          fail(e.key, ": stored under another chunk's key");
        e.n_tokens = int64_t(c.tokens.size());
        e.quant = kv_quant_name(c.quant);
      } catch (const Error& err) {
        e.problem = err.what();
      }
      out.push_back(std::move(e));
    }
  } while (cursor != "0" && out.size() < limit);
  return out;
}

}  // namespace kvboost::kv
