// Response bodies: completions and chat bodies, streamed chunks, usage, logprobs, the kvboost
// extension object and the remote tier's statistics.
#include "api.h"

#include <random>
#include <sstream>

namespace kvboost::server {

std::string make_id(const char* prefix) {
  static thread_local std::mt19937_64 rng(std::random_device{}() ^
                                          uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016llx%08llx", (unsigned long long)rng(), (unsigned long long)(rng() & 0xffffffffu));
  return std::string(prefix) + buf;
}

ojson usage_json(const GenerateResult& r) {
  ojson u;
  u["prompt_tokens"] = r.n_prompt();
  u["completion_tokens"] = int64_t(r.output_ids.size());
  u["total_tokens"] = r.n_prompt() + int64_t(r.output_ids.size());
  ojson d;
  d["cached_tokens"] = std::max<int64_t>(0, std::max(r.n_cached, r.n_reused - r.n_recomputed));
  u["prompt_tokens_details"] = d;
  return u;
}

ojson kvboost_json(const GenerateResult& r) {
  ojson k;
  k["cached_prefix_tokens"] = r.n_cached;
  k["reused_tokens"] = r.n_reused;
  k["recomputed_tokens"] = r.n_recomputed;
  k["new_tokens"] = r.n_new;
  k["guarded"] = r.guarded;  // a close call recomputed exactly (reuse.guard_lead)
  if (r.approximate) {  // its first token's lead and the threshold the guard held it to
    k["first_lead"] = r.first_lead;
    k["guard_lead"] = r.guard_lead;
  }
  k["preempted"] = r.n_preempted;
  ojson sp;  // speculative decoding
  sp["drafted"] = r.spec_drafted;
  sp["accepted"] = r.spec_accepted;
  sp["acceptance_rate"] = r.acceptance_rate();
  sp["tokens_per_pass"] = r.tokens_per_pass();
  k["speculative"] = sp;
  k["queue_ms"] = r.queue_ms;
  k["ttft_ms"] = r.ttft_ms;
  k["prefill_ms"] = r.prefill_ms;
  k["decode_ms"] = r.decode_ms;
  k["total_ms"] = r.total_ms;
  if (r.remote_ms > 0 || r.n_remote_chunks > 0) {  // only with --chunk-remote
    k["remote_chunks"] = r.n_remote_chunks;
    k["remote_ms"] = r.remote_ms;
  }
  return k;
}

ojson remote_stats_json(const kv::RemoteStats& s) {
  ojson j;
  j["up"] = s.up;
  j["hits"] = s.hits;
  j["misses"] = s.misses;
  j["bytes"] = s.bytes;
  j["skipped_not_worth_it"] = s.skipped;
  j["unavailable"] = s.unavailable;
  j["corrupt"] = s.corrupt;
  j["errors"] = s.errors;
  j["fetches"] = s.fetches;
  j["fetch_ms_mean"] = s.fetches ? s.fetch_ms_sum / double(s.fetches) : 0.0;
  j["writes"] = s.writes;
  j["write_bytes"] = s.write_bytes;
  j["write_drops"] = s.write_drops;
  j["write_errors"] = s.write_errors;
  j["too_big"] = s.too_big;
  j["rtt_ms"] = s.rtt_ms;
  j["mb_per_s"] = s.mb_per_s;
  j["prefill_tok_per_s"] = s.prefill_tok_per_s;
  return j;
}

std::string remote_metrics_text(const kv::RemoteStats& s) {
  std::ostringstream o;
  auto head = [&](const char* name, const char* type, const char* help) {
    o << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
  };
  head("kvboost_chunk_remote_up", "gauge", "1 when the remote chunk tier answered its last command.");
  o << "kvboost_chunk_remote_up " << (s.up ? 1 : 0) << '\n';
  head("kvboost_chunk_remote_lookups_total", "counter",
       "Remote chunk lookups by result (skipped: recomputing is cheaper; unavailable: remote down).");
  o << "kvboost_chunk_remote_lookups_total{result=\"hit\"} " << s.hits << "\nkvboost_chunk_remote_lookups_total{result=\"miss\"} "
    << s.misses << "\nkvboost_chunk_remote_lookups_total{result=\"skipped\"} " << s.skipped
    << "\nkvboost_chunk_remote_lookups_total{result=\"unavailable\"} " << s.unavailable
    << "\nkvboost_chunk_remote_lookups_total{result=\"corrupt\"} " << s.corrupt << '\n';
  head("kvboost_chunk_remote_fetched_bytes_total", "counter", "Bytes fetched from the remote chunk tier.");
  o << "kvboost_chunk_remote_fetched_bytes_total " << s.bytes << '\n';
  head("kvboost_chunk_remote_errors_total", "counter", "Failed remote commands (connection, timeout, error reply).");
  o << "kvboost_chunk_remote_errors_total " << s.errors << '\n';
  head("kvboost_chunk_remote_writes_total", "counter", "Remote chunk writes by result.");
  o << "kvboost_chunk_remote_writes_total{result=\"ok\"} " << s.writes << "\nkvboost_chunk_remote_writes_total{result=\"dropped\"} "
    << s.write_drops << "\nkvboost_chunk_remote_writes_total{result=\"refused\"} " << s.write_errors
    << "\nkvboost_chunk_remote_writes_total{result=\"too_big\"} " << s.too_big << '\n';
  head("kvboost_chunk_remote_fetch_ms", "histogram", "Latency of one prompt's remote lookup (one round trip), ms.");
  int64_t cum = 0;
  for (size_t b = 0; b < kv::kRemoteFetchBuckets; ++b) {
    cum += s.fetch_ms_buckets[b];
    o << "kvboost_chunk_remote_fetch_ms_bucket{le=\"";
    if (b + 1 < kv::kRemoteFetchBuckets) o << kv::kRemoteFetchBucketsMs[b];
    else o << "+Inf";
    o << "\"} " << cum << '\n';
  }
  o << "kvboost_chunk_remote_fetch_ms_sum " << s.fetch_ms_sum << "\nkvboost_chunk_remote_fetch_ms_count " << s.fetches << '\n';
  head("kvboost_chunk_remote_rtt_ms", "gauge", "The cost model's round-trip time estimate, ms.");
  o << "kvboost_chunk_remote_rtt_ms " << s.rtt_ms << '\n';
  head("kvboost_chunk_remote_bandwidth_mb_per_s", "gauge", "The cost model's remote bandwidth estimate, MB/s.");
  o << "kvboost_chunk_remote_bandwidth_mb_per_s " << s.mb_per_s << '\n';
  head("kvboost_chunk_remote_prefill_tok_per_s", "gauge", "The cost model's prefill rate estimate, tokens/s.");
  o << "kvboost_chunk_remote_prefill_tok_per_s " << s.prefill_tok_per_s << '\n';
  return o.str();
}

namespace {
// A token's text as the client sees it: as it reads after `prev` (decode(prev, id) minus
// decode(prev)), so that the tokens of a completion join to its text (decode({id}) alone strips
// a SentencePiece token's leading space); decode({id}) where the two decodes do not extend each
// other (a UTF-8 character split across the pair). A byte-level token may hold part of a UTF-8
// character: then the text has U+FFFD where the bytes are incomplete.
std::string token_text(const Tokenizer& tok, int32_t prev, int32_t id) {
  if (prev < 0) return tok.decode({id}, false);
  const std::string a = tok.decode({prev}, false), b = tok.decode({prev, id}, false);
  if (b.size() >= a.size() && b.compare(0, a.size(), a) == 0) return b.substr(a.size());
  return tok.decode({id}, false);
}

ojson bytes_json(const std::string& s) {
  ojson b = ojson::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}

std::string valid_utf8(const std::string& s) {
  // nlohmann would throw on invalid UTF-8 in a string value; replace each bad byte by U+FFFD.
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    bool ok = n > 0 && i + n <= s.size();
    for (size_t k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
    if (ok) {
      out.append(s, i, n);
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}
}  // namespace

ojson logprobs_json(const std::vector<TokenLogprob>& lps, bool chat, const Tokenizer& tok, size_t text_offset) {
  if (chat) {
    ojson content = ojson::array();
    for (const TokenLogprob& t : lps) {
      const std::string s = token_text(tok, t.prev, t.id);
      ojson e;
      e["token"] = valid_utf8(s);
      e["logprob"] = t.logprob;
      e["bytes"] = bytes_json(s);
      ojson top = ojson::array();
      for (const auto& [id, lp] : t.top) {
        const std::string ts = token_text(tok, t.prev, id);
        top.push_back(ojson{{"token", valid_utf8(ts)}, {"logprob", lp}, {"bytes", bytes_json(ts)}});
      }
      e["top_logprobs"] = top;
      content.push_back(e);
    }
    ojson o;
    o["content"] = content;
    o["refusal"] = nullptr;
    return o;
  }
  ojson tokens = ojson::array(), token_lps = ojson::array(), tops = ojson::array(), offsets = ojson::array();
  for (const TokenLogprob& t : lps) {
    const std::string s = token_text(tok, t.prev, t.id);
    tokens.push_back(valid_utf8(s));
    token_lps.push_back(t.logprob);
    offsets.push_back(text_offset);
    text_offset += s.size();
    // OpenAI: the top alternatives, plus the sampled token when it is not among them.
    ojson top = ojson::object();
    for (const auto& [id, lp] : t.top) top[valid_utf8(token_text(tok, t.prev, id))] = lp;
    if (!top.contains(valid_utf8(s))) top[valid_utf8(s)] = t.logprob;
    tops.push_back(top);
  }
  ojson o;
  o["tokens"] = tokens;
  o["token_logprobs"] = token_lps;
  o["top_logprobs"] = tops;
  o["text_offset"] = offsets;
  return o;
}

std::string finish_reason_of(const GenerateResult& r) { return r.finish_reason == "stop" ? "stop" : "length"; }

ojson completion_body(const std::string& id, int64_t created, const std::string& model, const ParsedRequest& p,
                      const GenerateResult& r, const Tokenizer* tok) {
  ojson choice;
  choice["index"] = 0;
  if (p.chat) {
    ojson msg;
    msg["role"] = "assistant";
    msg["content"] = r.text;
    if (p.parse_tools) {
      ToolCallSplit tc = split_tool_calls(r.text, p.tool_syntax);
      if (!tc.tool_calls.empty()) {
        msg["content"] = tc.content.empty() ? ojson(nullptr) : ojson(tc.content);
        msg["tool_calls"] = tc.tool_calls;
      }
    }
    choice["message"] = msg;
  } else {
    choice["text"] = p.echo ? p.prompt_text + r.text : r.text;
  }
  choice["logprobs"] = tok && p.opt.logprobs >= 0 ? logprobs_json(r.logprobs, p.chat, *tok, 0) : ojson(nullptr);
  choice["finish_reason"] = p.chat && choice["message"].contains("tool_calls") ? "tool_calls" : finish_reason_of(r);
  ojson o;
  o["id"] = id;
  o["object"] = p.chat ? "chat.completion" : "text_completion";
  o["created"] = created;
  o["model"] = model;
  o["choices"] = ojson::array({choice});
  o["usage"] = usage_json(r);
  o["kvboost"] = kvboost_json(r);
  return o;
}

ojson completion_chunk(const std::string& id, int64_t created, const std::string& model, const std::string& text,
                       const std::string& finish_reason, const ojson& logprobs) {
  ojson choice;
  choice["index"] = 0;
  choice["text"] = text;
  choice["logprobs"] = logprobs;
  choice["finish_reason"] = finish_reason.empty() ? ojson(nullptr) : ojson(finish_reason);
  ojson o;
  o["id"] = id;
  o["object"] = "text_completion";
  o["created"] = created;
  o["model"] = model;
  o["choices"] = ojson::array({choice});
  return o;
}

ojson chat_chunk(const std::string& id, int64_t created, const std::string& model, const ojson& delta,
                 const std::string& finish_reason, const ojson& logprobs) {
  ojson choice;
  choice["index"] = 0;
  choice["delta"] = delta;
  choice["logprobs"] = logprobs;
  choice["finish_reason"] = finish_reason.empty() ? ojson(nullptr) : ojson(finish_reason);
  ojson o;
  o["id"] = id;
  o["object"] = "chat.completion.chunk";
  o["created"] = created;
  o["model"] = model;
  o["choices"] = ojson::array({choice});
  return o;
}

ojson usage_chunk(const std::string& id, int64_t created, const std::string& model, bool chat, const GenerateResult& r) {
  ojson o;
  o["id"] = id;
  o["object"] = chat ? "chat.completion.chunk" : "text_completion";
  o["created"] = created;
  o["model"] = model;
  o["choices"] = ojson::array();
  o["usage"] = usage_json(r);
  o["kvboost"] = kvboost_json(r);
  return o;
}

}  // namespace kvboost::server

