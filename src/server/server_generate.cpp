// One generation request (completions, chat, warm): admission, the engine request, streaming
// (SSE) or the whole body, cancellation on disconnect, timeout or shutdown.
#include "server_impl.h"

#include <chrono>
#include <optional>

namespace kvboost {

using namespace server_detail;

void Server::Impl::generate(HttpConn& c, const std::string& endpoint, server::ParsedRequest& p, const std::string& tenant,
              double t_arrival, bool warm) {
  if (draining) throw ApiError(503, "the server is shutting down", "", "shutting_down");
  if (warm) {
    // Pinned chunks are bounded (--chunk-ram in all, --max-pinned-per-tenant each): a tenant at
    // its share is told so before any work is done.
    p.opt.reuse.pin_owner = tenant;
    if (const kv::ChunkStore* cs = engine.chunk_store()) {
      const size_t cap = cs->options().max_pinned_per_owner, have = cs->pinned_bytes(tenant);
      if (cap > 0 && have >= cap)
        throw ApiError(507,
                       "warm: this tenant's budget for pinned chunks is full (" + std::to_string(have) + " of " +
                           std::to_string(cap) + " bytes, --max-pinned-per-tenant); nothing more is pinned",
                       "", "pinned_budget_exceeded");
    }
  }
  if (p.n > 1 || p.best_of > p.n || !p.more_prompt_ids.empty()) return generate_multi(c, endpoint, p, tenant, t_arrival);
  // Admission control: running (max_batch) + waiting (max_queue) requests at most.
  const int64_t limit = engine.options().max_batch + opt.max_queue;
  if (in_flight.fetch_add(1) >= limit) {
    in_flight.fetch_sub(1);
    {
      std::lock_guard<std::mutex> l(stats_mu);
      ++rejected_overload;
    }
    throw ApiError(503, "the server is at capacity (" + std::to_string(limit) + " requests in flight); retry later",
                   "", "server_overloaded");
  }
  auto ch = std::make_shared<Channel>();
  p.opt.on_text = [ch](std::string_view s) {
    {
      std::lock_guard<std::mutex> l(ch->mu);
      ch->pending.append(s);
    }
    ch->cv.notify_all();
    return true;
  };
  if (p.stream && p.opt.logprobs >= 0)
    p.opt.on_logprob = [ch](const TokenLogprob& lp) {
      std::lock_guard<std::mutex> l(ch->mu);
      ch->pending_lp.push_back(lp);
    };
  // Tenants never share cache entries: the namespace is the key identity plus the client's salt.
  p.opt.cache_namespace = tenant + '\x1f' + p.cache_salt;
  std::shared_ptr<Request> req;
  try {
    req = engine.submit(p.prompt_ids, p.opt);
  } catch (const Error& e) {
    in_flight.fetch_sub(1);
    throw ApiError(400, e.what(), "", "invalid_request");
  }
  {
    std::lock_guard<std::mutex> l(active_mu);
    active.push_back({req, ch, warm});
  }
  wake_scheduler();

  const std::string id = server::make_id(p.chat ? "chatcmpl-" : "cmpl-");
  const int64_t created_s = int64_t(std::time(nullptr));
  const std::string& model = ctx.model_name;
  const double deadline = t_arrival + opt.timeout_s * 1000;
  bool streaming_ok = true;
  if (p.stream) {
    streaming_ok = c.begin_stream(200, "text/event-stream", {{"Cache-Control", "no-cache"}});
    if (streaming_ok && p.chat) {
      ojson delta;
      delta["role"] = "assistant";
      delta["content"] = "";
      streaming_ok = send_event(c, server::chat_chunk(id, created_s, model, delta, ""));
    }
    if (streaming_ok && p.echo && !p.prompt_text.empty())
      streaming_ok = send_event(c, server::completion_chunk(id, created_s, model, p.prompt_text, ""));
  }
  // Wait for text, forwarding it when streaming; watch the client and the deadline.
  const char* cancel_why = nullptr;
  std::vector<TokenLogprob> lps;  // streamed logprobs waiting for their text
  size_t text_offset = 0;
  std::optional<server::ToolCallStream> tools;  // chat with tools: content / tool_calls deltas
  if (p.chat && p.parse_tools) tools.emplace(p.tool_syntax);
  for (;;) {
    std::string piece;
    bool done;
    {
      std::unique_lock<std::mutex> l(ch->mu);
      ch->cv.wait_for(l, std::chrono::milliseconds(25), [&] { return !ch->pending.empty() || ch->done; });
      piece.swap(ch->pending);
      lps.insert(lps.end(), std::make_move_iterator(ch->pending_lp.begin()), std::make_move_iterator(ch->pending_lp.end()));
      ch->pending_lp.clear();
      done = ch->done;
    }
    // Logprobs travel with the text their tokens produced; tokens whose text is still held back
    // (part of a UTF-8 character, a possible stop string) wait, and the rest goes out at the end.
    if (p.stream && streaming_ok && (!piece.empty() || (done && (!lps.empty() || tools)))) {
      ojson lp = nullptr;
      if (!lps.empty()) {
        lp = server::logprobs_json(lps, p.chat, *ctx.tok, text_offset);
        for (const TokenLogprob& t : lps) text_offset += ctx.tok->decode({t.id}, false).size();
        lps.clear();
      }
      if (tools) {
        for (const ojson& d : tools->push(piece, done)) {
          streaming_ok = streaming_ok && send_event(c, server::chat_chunk(id, created_s, model, d, "", lp));
          lp = nullptr;
        }
      } else {
        const ojson chunk = p.chat ? server::chat_chunk(id, created_s, model, ojson{{"content", piece}}, "", lp)
                                   : server::completion_chunk(id, created_s, model, piece, "", lp);
        streaming_ok = send_event(c, chunk);
      }
    }
    if (done) break;
    if (!streaming_ok || c.peer_closed()) {
      cancel_why = "disconnect";
      break;
    }
    if (now_ms() > deadline) {
      cancel_why = "timeout";
      break;
    }
    // Shutdown past its grace period. The scheduler counts a request out of in_flight just
    // before it marks the channel done, so stop() may get here first for a request that
    // finished: that one loops once more and ends normally.
    if (stopped && !req->done()) {
      cancel_why = "shutdown";
      break;
    }
  }
  GenerateResult res;
  if (!cancel_why) {
    res = req->result();
    log_result(res);
    if (res.finish_reason == "cancelled") cancel_why = "shutdown";  // cancelled by stop()
  }
  if (cancel_why) {
    req->cancel();
    wake_scheduler();
    {
      std::lock_guard<std::mutex> l(stats_mu);
      if (cancel_why[0] == 'd') ++cancel_disconnect;
      else if (cancel_why[0] == 't') ++cancel_timeout;
      else ++cancel_shutdown;
    }
    if (cancel_why[0] == 'd') {
      count(endpoint, 499);  // nginx's "client closed request"
      c.set_keep_alive(false);
      return;
    }
    const ApiError e = cancel_why[0] == 't'
                           ? ApiError(504, "the request did not finish within the server's timeout of " +
                                               std::to_string(opt.timeout_s) + " s and was cancelled",
                                      "", "timeout")
                           : ApiError(503, "the server shut down before the request finished", "", "shutting_down");
    finish_with_error(c, endpoint, e, p.stream);
    return;
  }
  if (res.finish_reason == "error") {
    const ApiError e(500, "generation failed: " + res.error, "", "generation_error");
    finish_with_error(c, endpoint, e, p.stream);
    return;
  }
  if (warm && res.n_pin_refused > 0) {
    const kv::ChunkStore* cs = engine.chunk_store();
    std::string why = "warm: " + std::to_string(res.n_pin_refused) + " chunk(s) could not be pinned: the pin budget is full";
    if (cs) {
      const size_t cap = cs->options().max_pinned_per_owner;
      why += " (this tenant " + std::to_string(cs->pinned_bytes(tenant)) + " bytes pinned";
      if (cap) why += " of " + std::to_string(cap) + " (--max-pinned-per-tenant)";
      why += "; the server " + std::to_string(cs->stats().pinned_bytes) + " of " + std::to_string(cs->options().ram_bytes) +
             " (--chunk-ram)); the chunks are cached unpinned";
    }
    send_error(c, endpoint, ApiError(507, why, "", "pinned_budget_exceeded"));
    return;
  }
  if (warm) {
    if (kv::ChunkStore* cs = engine.chunk_store()) cs->flush();  // disk tier written before we answer
    ojson w;
    w["object"] = "warm";
    w["model"] = model;
    w["prompt_tokens"] = res.n_prompt();
    w["cached_tokens"] = server::usage_json(res)["prompt_tokens_details"]["cached_tokens"];
    w["prefill_ms"] = res.prefill_ms;
    w["kvboost"] = server::kvboost_json(res);
    send_json(c, endpoint, 200, w);
    return;
  }
  if (!p.stream) {
    send_json(c, endpoint, 200, server::completion_body(id, created_s, model, p, res, ctx.tok));
    return;
  }
  const std::string fr = tools && tools->n_calls() ? "tool_calls" : server::finish_reason_of(res);
  send_event(c, p.chat ? server::chat_chunk(id, created_s, model, ojson::object(), fr)
                       : server::completion_chunk(id, created_s, model, "", fr));
  if (p.include_usage) send_event(c, server::usage_chunk(id, created_s, model, p.chat, res));
  c.send_chunk("data: [DONE]\n\n");
  c.end_stream();
  count(endpoint, 200);
}

}  // namespace kvboost
