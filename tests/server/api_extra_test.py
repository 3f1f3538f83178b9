#!/usr/bin/env python3
"""The rest of the API surface (issue 22) with the pinned clients against `kvboost serve`.

Starts `kvboost serve --port 0 --api-key K --metrics-no-auth --log-requests` on the tiny
fixture; with the official `openai` client: n=3 completions and chat (3 choices, index in
order, choices 2..3 served from choice 1's prefill), a prompt list, logit_bias forcing a token,
streaming with per-choice index; then GET /metrics without the key, parsed with
`prometheus_client`'s text parser, must hold the kvboost:* histograms with buckets and the
gauges/counters; the request log lines carry status and token counts. Exit 77 (skip) when openai
or prometheus_client is missing, unless KVBOOST_REQUIRE_ORACLES=1.
"""
import argparse
import json
import os
import re
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvboost_server import Checks, Server, fixture_model, require  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvboost", required=True)
    ap.add_argument("--fixture", required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    openai, prom = require("openai", "prometheus_client.parser")
    text_string_to_metric_families = prom.text_string_to_metric_families
    model_dir = fixture_model(a.fixture, a.workdir, "tiny")
    key = "sk-kvboost-extra"
    srv = Server(a.kvboost, model_dir, "tiny", "--api-key", key, "--metrics-no-auth", "--log-requests")
    port, log = srv.port, srv.log
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0, timeout=60)
    check = Checks()

    try:
        prompt = " ".join(f"tok{i % 7}" for i in range(60))
        c = client.completions.create(model="tiny", prompt=prompt, max_tokens=4, temperature=1.0, seed=5, n=3,
                                      extra_body={"ignore_eos": True, "cache_salt": "py-n3"})
        check(len(c.choices) == 3, f"n=3 gives 3 choices (got {len(c.choices)})")
        check([ch.index for ch in c.choices] == [0, 1, 2], "choice indexes in order")
        kv = [ch.model_extra.get("kvboost", {}).get("cached_prefix_tokens", -1) for ch in c.choices]
        n_prompt = c.usage.prompt_tokens
        check(kv[0] == 0 and all(k >= n_prompt // 2 for k in kv[1:]),
              f"one prefill: choices 2..3 cached from choice 1 (cached {kv}, prompt {n_prompt})")
        check(c.usage.prompt_tokens_details.cached_tokens >= n_prompt, "usage counts the shared prompt as cached")

        ch = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello"}],
                                            max_tokens=3, n=3, temperature=0.9, extra_body={"ignore_eos": True})
        check([x.index for x in ch.choices] == [0, 1, 2], "chat n=3: indexes 0, 1, 2")

        pl = client.completions.create(model="tiny", prompt=["one two", "three", "four five six"], max_tokens=2,
                                       temperature=0, extra_body={"ignore_eos": True})
        check([x.index for x in pl.choices] == [0, 1, 2], "prompt list: one choice per prompt, in order")

        tok = json.loads(urllib.request.urlopen(urllib.request.Request(
            f"http://127.0.0.1:{port}/tokenize", data=json.dumps({"content": "z"}).encode(),
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})).read())
        zid = tok["tokens"][0]
        lb = client.completions.create(model="tiny", prompt="abc", max_tokens=5, temperature=1.0,
                                       logit_bias={str(zid): 100}, extra_body={"ignore_eos": True})
        check(lb.choices[0].text == "zzzzz", f"logit_bias +100 forces the token (got {lb.choices[0].text!r})")

        seen = {}
        for ev in client.completions.create(model="tiny", prompt="stream me", max_tokens=3, n=2, stream=True,
                                            extra_body={"ignore_eos": True}):
            for x in ev.choices:
                seen.setdefault(x.index, []).append(x.finish_reason)
        check(sorted(seen) == [0, 1] and all(v[-1] == "length" for v in seen.values()),
              f"streaming n=2: both indexes, each finishes (got {seen})")

        try:
            client.completions.create(model="tiny", prompt="x", max_tokens=1, suffix="y")
            check(False, "suffix on a model without FIM tokens is a 400")
        except openai.BadRequestError as e:
            check("fim" in str(e).lower() or "FIM" in str(e), "suffix without FIM tokens: 400 saying why")

        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        for h in ["kvboost:time_to_first_token_seconds", "kvboost:inter_token_latency_seconds",
                  "kvboost:e2e_request_latency_seconds", "kvboost:request_queue_time_seconds",
                  "kvboost:request_prefill_time_seconds"]:
            f = fams.get(h)
            ok = f is not None and f.type == "histogram"
            buckets = [s for s in f.samples if s.name == h + "_bucket"] if ok else []
            count = [s.value for s in f.samples if s.name == h + "_count"] if ok else []
            check(ok and len(buckets) > 5 and buckets[-1].labels.get("le") == "+Inf" and count and count[0] > 0
                  and buckets[-1].value == count[0] and all(s.labels.get("model_name") == "tiny" for s in buckets),
                  f"{h}: a histogram with buckets, labelled model_name, +Inf == count")
        check(fams.get("kvboost:kv_cache_usage_perc") is not None and fams["kvboost:kv_cache_usage_perc"].type == "gauge",
              "kvboost:kv_cache_usage_perc gauge")
        for cname in ["kvboost:num_preemptions", "kvboost:prefix_cache_queries", "kvboost:prefix_cache_hits"]:
            f = fams.get(cname)
            check(f is not None and f.type == "counter", f"{cname}_total counter")
        q = fams["kvboost:prefix_cache_queries"].samples[0].value
        hits = fams["kvboost:prefix_cache_hits"].samples[0].value
        check(q > 0 and 0 < hits <= q, f"prefix cache queries {q} >= hits {hits} > 0")
        check("kvboost_http_responses" in fams, "the older kvboost_* metrics are still there")
    finally:
        srv.stop()
    time.sleep(0.2)
    lines = [l for l in log if "status=" in l]
    check(any(re.search(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ .*status=200 POST /v1/completions prompt_tokens=\d+ "
                        r"cached_tokens=\d+ completion_tokens=12 ttft_ms=[\d.]+ total_ms=[\d.]+", l) for l in lines),
          "a request log line: timestamp, status, route, prompt/cached/completion tokens, TTFT, total")
    check(any("status=400" in l for l in lines), "a request log line for the 400")
    return check.result(log)


if __name__ == "__main__":
    sys.exit(main())
