// /v1/stats (JSON) and /metrics (Prometheus text; the vLLM-named families: metrics.cpp).
#include "server_impl.h"

#include <sstream>

namespace kvboost {

using namespace server_detail;

ojson Server::Impl::stats_json() {
  const kv::KvStats kv = engine.kv_stats();
  ojson s;
  s["model"] = ctx.model_name;
  s["uptime_s"] = (now_ms() - t_start) / 1000;
  ojson q;
  q["in_flight"] = in_flight.load();
  q["running"] = n_running.load();
  q["waiting"] = n_waiting.load();
  q["max_batch"] = engine.options().max_batch;
  q["max_queue"] = opt.max_queue;
  s["queue"] = q;
  ojson k;
  k["block_size"] = engine.kv_block_size();
  k["blocks_total"] = kv.n_blocks;
  k["blocks_used"] = kv.blocks_used;
  k["blocks_free"] = kv.blocks_free;
  k["blocks_cached"] = kv.blocks_cached;
  k["blocks_cold"] = kv.blocks_cold;
  k["prefix_queries"] = kv.n_queries;
  k["prefix_query_tokens"] = kv.query_tokens;
  k["prefix_hit_tokens"] = kv.hit_tokens;
  k["prefix_hit_rate"] = kv.hit_rate();
  k["evictions"] = kv.evictions;
  k["spills"] = kv.spills;
  k["page_ins"] = kv.page_ins;
  s["kv"] = k;
  if (const kv::ChunkStore* cs = engine.chunk_store()) {
    const kv::ChunkStats c = cs->stats();
    ojson ck;
    ck["entries"] = c.entries;
    ck["entries_ram"] = c.entries_ram;
    ck["entries_disk"] = c.entries_disk;
    ck["pinned"] = c.pinned;
    ck["pinned_bytes"] = c.pinned_bytes;
    ck["pins_refused"] = c.pins_refused;
    ck["bytes_ram"] = c.bytes_ram;
    ck["bytes_disk"] = c.bytes_disk;
    ck["lookups"] = c.lookups;
    ck["prefix_hits"] = c.prefix_hits;
    ck["content_hits"] = c.content_hits;
    ck["hit_rate"] = c.hit_rate();
    ck["disk_loads"] = c.disk_loads;
    ck["corrupt"] = c.corrupt;
    ck["stores"] = c.stores;
    ck["evictions_ram"] = c.evictions_ram;
    ck["evictions_disk"] = c.evictions_disk;
    if (c.remote.enabled) ck["remote"] = server::remote_stats_json(c.remote);
    s["chunks"] = ck;
  }
  std::lock_guard<std::mutex> l(stats_mu);
  ojson rq;
  rq["finished"] = n_finished;
  ojson fr = ojson::object();
  for (const auto& [name, n] : finish_reasons) fr[name] = n;
  rq["finish_reasons"] = fr;
  rq["rejected_overload"] = rejected_overload;
  rq["cancelled_disconnect"] = cancel_disconnect;
  rq["cancelled_timeout"] = cancel_timeout;
  rq["cancelled_shutdown"] = cancel_shutdown;
  ojson by = ojson::object();
  for (const auto& [key, n] : responses) by[key.first][std::to_string(key.second)] = n;
  rq["responses"] = by;
  s["requests"] = rq;
  ojson t;
  t["prompt"] = prompt_tokens;
  t["cached"] = cached_tokens;
  t["cache_hit_rate"] = prompt_tokens ? double(cached_tokens) / double(prompt_tokens) : 0.0;
  t["completion"] = completion_tokens;
  s["tokens"] = t;
  const auto [dr, pr] = window.rates(int64_t(now_ms() / 1000));
  const double up = (now_ms() - t_start) / 1000;
  ojson th;
  th["decode_tok_per_s_10s"] = dr;
  th["prefill_tok_per_s_10s"] = pr;
  th["completion_tok_per_s_avg"] = up > 0 ? double(completion_tokens) / up : 0.0;
  th["steps"] = n_steps;
  th["mean_ttft_ms"] = n_finished ? 1000 * ttft_sum_s / double(n_finished) : 0.0;
  th["mean_queue_ms"] = n_finished ? 1000 * queue_sum_s / double(n_finished) : 0.0;
  s["throughput"] = th;
  ojson pr_;
  pr_["rss_bytes"] = process_rss_bytes();
  {
    pr_["open_connections"] = http ? http->open_connections() : 0;
    pr_["connections_refused"] = http ? http->refused() : 0;
  }
  s["process"] = pr_;
  return s;
}

std::string Server::Impl::metrics_text() {
  const kv::KvStats kv = engine.kv_stats();
  const Engine::SpecStats spec = engine.spec_stats();
  std::ostringstream o;
  auto metric = [&](const char* name, const char* type, const char* help) {
    o << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
  };
  std::lock_guard<std::mutex> l(stats_mu);
  metric("kvboost_http_responses_total", "counter", "HTTP responses by endpoint and status (499: client went away).");
  for (const auto& [key, n] : responses)
    o << "kvboost_http_responses_total{endpoint=\"" << key.first << "\",status=\"" << key.second << "\"} " << n << '\n';
  metric("kvboost_requests_finished_total", "counter", "Generation requests finished, by engine finish reason.");
  for (const auto& [name, n] : finish_reasons) o << "kvboost_requests_finished_total{reason=\"" << name << "\"} " << n << '\n';
  metric("kvboost_requests_cancelled_total", "counter", "Requests cancelled by the server, by cause.");
  o << "kvboost_requests_cancelled_total{cause=\"disconnect\"} " << cancel_disconnect << '\n'
    << "kvboost_requests_cancelled_total{cause=\"timeout\"} " << cancel_timeout << '\n'
    << "kvboost_requests_cancelled_total{cause=\"shutdown\"} " << cancel_shutdown << '\n';
  metric("kvboost_requests_rejected_total", "counter", "Requests answered 503 because the queue was full.");
  o << "kvboost_requests_rejected_total " << rejected_overload << '\n';
  metric("kvboost_requests_in_flight", "gauge", "Generation requests submitted and not finished.");
  o << "kvboost_requests_in_flight " << in_flight.load() << '\n';
  metric("kvboost_requests_running", "gauge", "Requests in the running batch after the last step.");
  o << "kvboost_requests_running " << n_running.load() << '\n';
  metric("kvboost_requests_waiting", "gauge", "Requests waiting for admission after the last step.");
  o << "kvboost_requests_waiting " << n_waiting.load() << '\n';
  metric("kvboost_prompt_tokens_total", "counter", "Prompt tokens of finished requests.");
  o << "kvboost_prompt_tokens_total " << prompt_tokens << '\n';
  metric("kvboost_cached_prompt_tokens_total", "counter", "Prompt tokens whose K/V came from a cache.");
  o << "kvboost_cached_prompt_tokens_total " << cached_tokens << '\n';
  metric("kvboost_generation_tokens_total", "counter", "Tokens generated by finished requests.");
  o << "kvboost_generation_tokens_total " << completion_tokens << '\n';
  metric("kvboost_engine_steps_total", "counter", "Engine scheduling steps (forward passes).");
  o << "kvboost_engine_steps_total " << n_steps << '\n';
  metric("kvboost_engine_decode_tokens_total", "counter", "Decode tokens computed by engine steps.");
  o << "kvboost_engine_decode_tokens_total " << step_decode_tokens << '\n';
  metric("kvboost_engine_prefill_tokens_total", "counter", "Prompt tokens computed by engine steps.");
  o << "kvboost_engine_prefill_tokens_total " << step_prefill_tokens << '\n';
  metric("kvboost_time_to_first_token_seconds", "summary", "Time to first token of finished requests.");
  o << "kvboost_time_to_first_token_seconds_sum " << ttft_sum_s << "\nkvboost_time_to_first_token_seconds_count "
    << n_finished << '\n';
  metric("kvboost_request_duration_seconds", "summary", "Submit-to-finish time of finished requests.");
  o << "kvboost_request_duration_seconds_sum " << e2e_sum_s << "\nkvboost_request_duration_seconds_count " << n_finished
    << '\n';
  metric("kvboost_spec_draft_tokens_total", "counter", "Speculative decoding: tokens drafted and verified.");
  o << "kvboost_spec_draft_tokens_total " << spec.drafted << '\n';
  metric("kvboost_spec_accepted_tokens_total", "counter", "Speculative decoding: drafted tokens accepted.");
  o << "kvboost_spec_accepted_tokens_total " << spec.accepted << '\n';
  metric("kvboost_spec_verify_passes_total", "counter", "Speculative decoding: verification passes.");
  o << "kvboost_spec_verify_passes_total " << spec.passes << '\n';
  metric("kvboost_spec_verify_tokens_total", "counter", "Speculative decoding: tokens emitted by verification passes.");
  o << "kvboost_spec_verify_tokens_total " << spec.tokens << '\n';
  metric("kvboost_kv_blocks", "gauge", "KV blocks by state (cached blocks may also be used or free).");
  o << "kvboost_kv_blocks{state=\"total\"} " << kv.n_blocks << "\nkvboost_kv_blocks{state=\"used\"} " << kv.blocks_used
    << "\nkvboost_kv_blocks{state=\"free\"} " << kv.blocks_free << "\nkvboost_kv_blocks{state=\"cached\"} "
    << kv.blocks_cached << "\nkvboost_kv_blocks{state=\"cold\"} " << kv.blocks_cold << '\n';
  metric("kvboost_prefix_cache_query_tokens_total", "counter", "Prompt tokens looked up in the prefix cache.");
  o << "kvboost_prefix_cache_query_tokens_total " << kv.query_tokens << '\n';
  metric("kvboost_prefix_cache_hit_tokens_total", "counter", "Prompt tokens found in the prefix cache.");
  o << "kvboost_prefix_cache_hit_tokens_total " << kv.hit_tokens << '\n';
  metric("kvboost_kv_evictions_total", "counter", "Cached KV blocks evicted.");
  o << "kvboost_kv_evictions_total " << kv.evictions << '\n';
  metric("kvboost_kv_spills_total", "counter", "KV blocks spilled to the cold tier.");
  o << "kvboost_kv_spills_total " << kv.spills << '\n';
  metric("kvboost_kv_page_ins_total", "counter", "KV blocks paged back from the cold tier.");
  o << "kvboost_kv_page_ins_total " << kv.page_ins << '\n';
  if (const kv::ChunkStore* cs = engine.chunk_store()) {
    const kv::ChunkStats c = cs->stats();
    metric("kvboost_chunk_store_entries", "gauge", "Chunks in the chunk store, by tier.");
    o << "kvboost_chunk_store_entries{tier=\"ram\"} " << c.entries_ram << "\nkvboost_chunk_store_entries{tier=\"disk\"} "
      << c.entries_disk << '\n';
    metric("kvboost_chunk_store_bytes", "gauge", "Bytes held by the chunk store, by tier.");
    o << "kvboost_chunk_store_bytes{tier=\"ram\"} " << c.bytes_ram << "\nkvboost_chunk_store_bytes{tier=\"disk\"} "
      << c.bytes_disk << '\n';
    metric("kvboost_chunk_store_lookups_total", "counter", "Chunk lookups.");
    o << "kvboost_chunk_store_lookups_total " << c.lookups << '\n';
    metric("kvboost_chunk_store_hits_total", "counter", "Chunk hits, by kind (prefix: exact; content: another position).");
    o << "kvboost_chunk_store_hits_total{kind=\"prefix\"} " << c.prefix_hits << "\nkvboost_chunk_store_hits_total{kind=\"content\"} "
      << c.content_hits << '\n';
    metric("kvboost_chunk_store_evictions_total", "counter", "Chunks evicted, by tier.");
    o << "kvboost_chunk_store_evictions_total{tier=\"ram\"} " << c.evictions_ram << "\nkvboost_chunk_store_evictions_total{tier=\"disk\"} "
      << c.evictions_disk << '\n';
    if (c.remote.enabled) o << server::remote_metrics_text(c.remote);
  }
  metric("kvboost_process_resident_memory_bytes", "gauge", "Resident set size of the server process.");
  o << "kvboost_process_resident_memory_bytes " << process_rss_bytes() << '\n';
  const kv::ChunkStats cstats = engine.chunk_store() ? engine.chunk_store()->stats() : kv::ChunkStats{};
  o << vllm.text(ctx.model_name, kv, engine.chunk_store() ? &cstats : nullptr, n_running.load(), n_waiting.load());
  return o.str();
}

}  // namespace kvboost
