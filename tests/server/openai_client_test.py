#!/usr/bin/env python3
"""The OpenAI Python client (pinned in .venv) against `kvboost serve` over loopback.

Starts `kvboost serve --port 0` on a generated tiny fixture model, drives it with the official
`openai` client — models, completions and chat completions, streaming and not, usage with cached
tokens, the errors the client maps to exception classes — then sends SIGTERM and expects a clean
exit (status 0). Exit 77 (skip) when the openai package is missing, unless
KVBOOST_REQUIRE_ORACLES=1.
"""
import argparse
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvboost_server import Checks, Server, fixture_model, require  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvboost", required=True)
    ap.add_argument("--fixture", required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    openai, = require("openai")
    model_dir = fixture_model(a.fixture, a.workdir, "tiny")
    key = "sk-kvboost-test"
    srv = Server(a.kvboost, model_dir, "tiny", "--api-key", key)
    log = srv.log
    base = srv.base_url
    client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=60)
    check = Checks()

    try:
        ids = [m.id for m in client.models.list()]
        check(ids == ["tiny"], f"models.list() == ['tiny'] (got {ids})")

        prompt = " ".join(f"word{i % 9}" for i in range(60))
        c = client.completions.create(model="tiny", prompt=prompt, max_tokens=8, temperature=0,
                                      extra_body={"ignore_eos": True})
        check(c.object == "text_completion", "completion object")
        check(c.choices[0].finish_reason == "length", f"finish_reason length (got {c.choices[0].finish_reason})")
        check(c.usage.completion_tokens == 8, f"completion_tokens 8 (got {c.usage.completion_tokens})")
        text = c.choices[0].text

        c2 = client.completions.create(model="tiny", prompt=prompt, max_tokens=8, temperature=0,
                                       extra_body={"ignore_eos": True})
        cached = c2.usage.prompt_tokens_details.cached_tokens if c2.usage.prompt_tokens_details else 0
        check(cached >= 16, f"repeated prompt: cached_tokens >= 16 (got {cached})")
        check(c2.choices[0].text == text, "same greedy text from the cache")

        pieces, usage, finish = [], None, None
        for ch in client.completions.create(model="tiny", prompt=prompt, max_tokens=8, temperature=0, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}):
            if ch.usage:
                usage = ch.usage
            for choice in ch.choices:
                pieces.append(choice.text)
                finish = choice.finish_reason or finish
        check("".join(pieces) == text, "streamed completion text == non-streamed text")
        check(finish == "length", "streamed finish_reason")
        check(usage is not None and usage.completion_tokens == 8, "streamed usage chunk")

        msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello."}]
        r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=0, seed=3,
                                           extra_body={"ignore_eos": True})
        check(r.object == "chat.completion", "chat object")
        check(r.choices[0].message.role == "assistant", "assistant message")
        content = r.choices[0].message.content
        stream = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=0, seed=3,
                                                stream=True, extra_body={"ignore_eos": True})
        got = "".join((ch.choices[0].delta.content or "") for ch in stream if ch.choices)
        check(got == content, "streamed chat content == non-streamed content")

        sampled = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=0.8,
                                                 top_p=0.9, seed=42, stop=["\n\n", "###"],
                                                 extra_body={"top_k": 20, "min_p": 0.05})
        check(sampled.choices[0].finish_reason in ("stop", "length"), "sampling parameters accepted")

        # logprobs through the client's own types (chat: ChoiceLogprobs.content; completions: Logprobs)
        lr = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=4, temperature=0,
                                            logprobs=True, top_logprobs=2, presence_penalty=0.5,
                                            frequency_penalty=0.5, extra_body={"ignore_eos": True})
        lc = lr.choices[0].logprobs.content
        check(len(lc) == 4 and all(t.logprob <= 0 and len(t.top_logprobs) == 2 for t in lc), "chat logprobs")
        cl = client.completions.create(model="tiny", prompt=prompt, max_tokens=4, temperature=0, logprobs=2,
                                       extra_body={"ignore_eos": True})
        lp = cl.choices[0].logprobs
        check(len(lp.tokens) == 4 and len(lp.token_logprobs) == 4 and "".join(lp.tokens) == cl.choices[0].text,
              "completion logprobs")

        def expect(exc, fn, what):
            try:
                fn()
            except exc as e:
                check(True, f"{what}: {type(e).__name__} {getattr(e, 'status_code', '')}")
                return
            except Exception as e:  # noqa: BLE001
                check(False, f"{what}: expected {exc.__name__}, got {type(e).__name__}: {e}")
                return
            check(False, f"{what}: expected {exc.__name__}, got success")

        expect(openai.BadRequestError, lambda: client.completions.create(model="tiny", prompt="x", temperature=5),
               "temperature out of range")
        expect(openai.BadRequestError, lambda: client.completions.create(model="tiny", prompt="x", n=0), "n = 0")
        expect(openai.BadRequestError, lambda: client.chat.completions.create(model="tiny", messages=[]),
               "empty messages")
        expect(openai.BadRequestError,
               lambda: client.completions.create(model="tiny", prompt="x", max_tokens=-1), "negative max_tokens")
        expect(openai.NotFoundError, lambda: client.completions.create(model="gpt-4", prompt="x"), "unknown model")
        bad = openai.OpenAI(base_url=base, api_key="wrong", max_retries=0, timeout=30)
        expect(openai.AuthenticationError, lambda: bad.models.list(), "wrong API key")
        # Still serving after all that.
        ok = client.completions.create(model="tiny", prompt="still here", max_tokens=2)
        check(len(ok.choices) == 1, "serves after bad requests")
    finally:
        rc = srv.stop(signal.SIGTERM, timeout=60)
    check(rc == 0, f"SIGTERM: clean exit 0 (got {rc})")
    return check.result(log)


if __name__ == "__main__":
    sys.exit(main())
