// n > 1, best_of > n and prompt lists.
//
// One engine request per candidate, all submitted together: the engine groups requests that
// share a block of prompt prefix behind the one still in its prefill (Engine::step's admission),
// so candidates 2.. of a prompt wait for the first one's committed blocks and reuse them from the
// prefix cache instead of prefilling again (their usage shows them as cached). Each candidate
// samples with seed + its index. Without best_of the candidates are the choices (index = prompt *
// n + i); with best_of > n each prompt gets best_of candidates and its n with the highest
// cumulative log-probability are returned, best first (vLLM's and OpenAI's semantics; the
// log-probabilities are of the raw logits, as logprobs reports them). Streamed chunks carry their
// choice's index, and with logprobs each choice's logprobs travel in its own chunks.

#include "server_impl.h"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <optional>

namespace kvboost {

using namespace server_detail;

void Server::Impl::generate_multi(HttpConn& c, const std::string& endpoint, server::ParsedRequest& p,
                                  const std::string& tenant, double t_arrival) {
  std::vector<std::pair<const std::vector<int32_t>*, const std::string*>> prompts{{&p.prompt_ids, &p.prompt_text}};
  for (size_t j = 0; j < p.more_prompt_ids.size(); ++j) prompts.push_back({&p.more_prompt_ids[j], &p.more_prompt_texts[j]});
  const bool ranked = p.best_of > p.n;  // parse_n_and_bias: never with stream
  const int64_t per_prompt = ranked ? p.best_of : p.n;
  const int64_t k = int64_t(prompts.size()) * per_prompt;
  const int64_t limit = engine.options().max_batch + opt.max_queue;
  if (in_flight.fetch_add(k) + k > limit) {
    in_flight.fetch_sub(k);
    {
      std::lock_guard<std::mutex> l(stats_mu);
      ++rejected_overload;
    }
    throw ApiError(503, "the server is at capacity (" + std::to_string(limit) + " requests in flight; this one needs " +
                            std::to_string(k) + (ranked ? " (best_of per prompt)" : "") + "); retry later",
                   "", "server_overloaded");
  }
  struct Choice {
    std::shared_ptr<Request> req;
    std::shared_ptr<Channel> ch;
    size_t prompt = 0;
    std::optional<server::ToolCallStream> tools;
    std::vector<TokenLogprob> lps;  // streamed logprobs waiting for their text
    size_t text_offset = 0;
    bool finished = false;
  };
  std::vector<Choice> choices(static_cast<size_t>(k));
  p.opt.cache_namespace = tenant + '\x1f' + p.cache_salt;
  for (int64_t idx = 0; idx < k; ++idx) {
    Choice& ch = choices[size_t(idx)];
    ch.prompt = size_t(idx / per_prompt);
    ch.ch = std::make_shared<Channel>();
    GenerateOptions o = p.opt;
    o.sampling.seed = p.opt.sampling.seed + uint64_t(idx);
    if (ranked) o.logprobs = std::max(o.logprobs, 0);  // the ranking needs each token's log-probability
    o.on_text = [q = ch.ch](std::string_view s) {
      {
        std::lock_guard<std::mutex> l(q->mu);
        q->pending.append(s);
      }
      q->cv.notify_all();
      return true;
    };
    if (p.stream && p.opt.logprobs >= 0)
      o.on_logprob = [q = ch.ch](const TokenLogprob& lp) {
        std::lock_guard<std::mutex> l(q->mu);
        q->pending_lp.push_back(lp);
      };
    if (p.chat && p.parse_tools) ch.tools.emplace(p.tool_syntax);
    try {
      ch.req = engine.submit(*prompts[ch.prompt].first, o);
    } catch (const Error& e) {
      for (int64_t j = 0; j < idx; ++j) choices[size_t(j)].req->cancel();  // reaped (and counted out) by the scheduler
      in_flight.fetch_sub(k - idx);
      wake_scheduler();
      throw ApiError(400, e.what(), "", "invalid_request");
    }
    std::lock_guard<std::mutex> l(active_mu);
    active.push_back({ch.req, ch.ch, false});
  }
  wake_scheduler();

  const std::string id = server::make_id(p.chat ? "chatcmpl-" : "cmpl-");
  const int64_t created_s = int64_t(std::time(nullptr));
  const std::string& model = ctx.model_name;
  const double deadline = t_arrival + opt.timeout_s * 1000;
  auto indexed = [](ojson chunk, int64_t idx) {
    chunk["choices"][0]["index"] = idx;
    return chunk;
  };
  bool streaming_ok = true;
  if (p.stream) {
    streaming_ok = c.begin_stream(200, "text/event-stream", {{"Cache-Control", "no-cache"}});
    for (int64_t idx = 0; idx < k && streaming_ok; ++idx) {
      if (p.chat)
        streaming_ok = send_event(c, indexed(server::chat_chunk(id, created_s, model, ojson{{"role", "assistant"}, {"content", ""}}, ""), idx));
      else if (p.echo && !prompts[choices[size_t(idx)].prompt].second->empty())
        streaming_ok = send_event(c, indexed(server::completion_chunk(id, created_s, model, *prompts[choices[size_t(idx)].prompt].second, ""), idx));
    }
  }
  const char* cancel_why = nullptr;
  for (size_t n_done = 0; n_done < choices.size();) {
    for (Choice& ch : choices)  // wait a little on the first unfinished one, then poll them all
      if (!ch.finished) {
        std::unique_lock<std::mutex> l(ch.ch->mu);
        ch.ch->cv.wait_for(l, std::chrono::milliseconds(10), [&] { return !ch.ch->pending.empty() || ch.ch->done; });
        break;
      }
    for (size_t idx = 0; idx < choices.size(); ++idx) {
      Choice& ch = choices[idx];
      if (ch.finished) continue;
      std::string piece;
      bool done;
      {
        std::lock_guard<std::mutex> l(ch.ch->mu);
        piece.swap(ch.ch->pending);
        ch.lps.insert(ch.lps.end(), std::make_move_iterator(ch.ch->pending_lp.begin()),
                      std::make_move_iterator(ch.ch->pending_lp.end()));
        ch.ch->pending_lp.clear();
        done = ch.ch->done;
      }
      // As for one choice (server_generate.cpp): logprobs go out with the text of their tokens.
      if (p.stream && streaming_ok && (!piece.empty() || (done && (!ch.lps.empty() || ch.tools)))) {
        ojson lp = nullptr;
        if (!ch.lps.empty()) {
          lp = server::logprobs_json(ch.lps, p.chat, *ctx.tok, ch.text_offset);
          for (const TokenLogprob& t : ch.lps) ch.text_offset += ctx.tok->decode({t.id}, false).size();
          ch.lps.clear();
        }
        if (ch.tools) {
          for (const ojson& d : ch.tools->push(piece, done)) {
            streaming_ok = streaming_ok && send_event(c, indexed(server::chat_chunk(id, created_s, model, d, "", lp), int64_t(idx)));
            lp = nullptr;
          }
        } else {
          streaming_ok = send_event(c, indexed(p.chat ? server::chat_chunk(id, created_s, model, ojson{{"content", piece}}, "", lp)
                                                      : server::completion_chunk(id, created_s, model, piece, "", lp),
                                               int64_t(idx)));
        }
      }
      if (done) {
        ch.finished = true;
        ++n_done;
        if (p.stream && streaming_ok) {
          const GenerateResult r = ch.req->result();
          const std::string fr = ch.tools && ch.tools->n_calls() ? "tool_calls" : server::finish_reason_of(r);
          streaming_ok = send_event(c, indexed(p.chat ? server::chat_chunk(id, created_s, model, ojson::object(), fr)
                                                      : server::completion_chunk(id, created_s, model, "", fr),
                                               int64_t(idx)));
        }
      }
    }
    if (n_done == choices.size()) break;
    if (!streaming_ok || c.peer_closed()) cancel_why = "disconnect";
    else if (now_ms() > deadline) cancel_why = "timeout";
    else if (stopped) cancel_why = "shutdown";
    if (cancel_why) break;
  }
  std::vector<GenerateResult> res;
  if (!cancel_why)
    for (Choice& ch : choices) {
      res.push_back(ch.req->result());
      log_result(res.back());
      if (res.back().finish_reason == "cancelled") cancel_why = "shutdown";
    }
  if (cancel_why) {
    for (Choice& ch : choices) ch.req->cancel();
    wake_scheduler();
    {
      std::lock_guard<std::mutex> l(stats_mu);
      if (cancel_why[0] == 'd') ++cancel_disconnect;
      else if (cancel_why[0] == 't') ++cancel_timeout;
      else ++cancel_shutdown;
    }
    if (cancel_why[0] == 'd') {
      count(endpoint, 499);
      c.set_keep_alive(false);
      return;
    }
    const ApiError e = cancel_why[0] == 't' ? ApiError(504, "the request did not finish within the server's timeout and was cancelled", "", "timeout")
                                            : ApiError(503, "the server shut down before the request finished", "", "shutting_down");
    finish_with_error(c, endpoint, e, p.stream);
    return;
  }
  for (const GenerateResult& r : res)
    if (r.finish_reason == "error") {
      const ApiError e(500, "generation failed: " + r.error, "", "generation_error");
      finish_with_error(c, endpoint, e, p.stream);
      return;
    }
  // Usage: each prompt once (its first candidate), every candidate's completion tokens (best_of
  // candidates that are not returned were generated all the same, as OpenAI bills them); cached
  // tokens over all candidates (candidates 2.. of a prompt show the shared prefill here).
  int64_t n_prompt = 0, n_completion = 0, n_cached = 0;
  for (size_t idx = 0; idx < res.size(); ++idx) {
    if (idx % size_t(per_prompt) == 0) n_prompt += res[idx].n_prompt();
    n_completion += int64_t(res[idx].output_ids.size());
    n_cached += server::usage_json(res[idx])["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
  }
  ojson usage;
  usage["prompt_tokens"] = n_prompt;
  usage["completion_tokens"] = n_completion;
  usage["total_tokens"] = n_prompt + n_completion;
  usage["prompt_tokens_details"] = ojson{{"cached_tokens", n_cached}};
  if (p.stream) {
    if (p.include_usage) {
      ojson u = server::usage_chunk(id, created_s, model, p.chat, res[0]);
      u["usage"] = usage;
      u.erase("kvboost");
      send_event(c, u);
    }
    c.send_chunk("data: [DONE]\n\n");
    c.end_stream();
    count(endpoint, 200);
    return;
  }
  // The candidates returned, in choice order: all of them, or per prompt the n best by
  // cumulative log-probability (ties: the lower candidate index).
  std::vector<size_t> returned;
  std::vector<double> cumulative(res.size(), 0.0);
  for (size_t idx = 0; idx < res.size(); ++idx)
    for (const TokenLogprob& t : res[idx].logprobs) cumulative[idx] += t.logprob;
  for (size_t j = 0; j < prompts.size(); ++j) {
    std::vector<size_t> cand(static_cast<size_t>(per_prompt));
    std::iota(cand.begin(), cand.end(), j * size_t(per_prompt));
    if (ranked)
      std::stable_sort(cand.begin(), cand.end(), [&](size_t a, size_t b) { return cumulative[a] > cumulative[b]; });
    returned.insert(returned.end(), cand.begin(), cand.begin() + p.n);
  }
  ojson body;
  ojson all = ojson::array();
  for (size_t i = 0; i < returned.size(); ++i) {
    const size_t idx = returned[i];
    server::ParsedRequest pi;  // what completion_body reads: chat, echo, the prompt text, tools, logprobs
    pi.chat = p.chat;
    pi.echo = p.echo;
    pi.parse_tools = p.parse_tools;
    pi.tool_syntax = p.tool_syntax;
    pi.opt.logprobs = p.opt.logprobs;  // best_of's own log-probabilities stay out unless asked for
    pi.prompt_text = *prompts[choices[idx].prompt].second;
    ojson one = server::completion_body(id, created_s, model, pi, res[idx], ctx.tok);
    ojson choice = one["choices"][0];
    choice["index"] = i;
    choice["kvboost"] = one["kvboost"];  // per choice: cached_prefix_tokens shows the shared prefill
    if (ranked) {
      choice["kvboost"]["cumulative_logprob"] = cumulative[idx];
      choice["kvboost"]["candidate"] = idx;
    }
    all.push_back(choice);
    if (i == 0) body = one;
  }
  body["choices"] = all;
  body["usage"] = usage;
  body.erase("kvboost");
  send_json(c, endpoint, 200, body);
}

}  // namespace kvboost
