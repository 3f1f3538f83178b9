#!/usr/bin/env python3
"""Python binding overhead and the quick-start scenario, printed as tables.

    PYTHONPATH=build/python:python .venv/bin/python bench/python_bench.py \
        --model ../shared/models/stories260K --kvboost build/kvboost [--runs 9] [--tokens 64]

1. The same greedy generation (prompt, max new tokens, no cache of any kind so that every run
   computes the whole prompt) through `kvboost generate --repeat` and through KVBoost.generate
   in one process each; medians of TTFT and decode tokens/s, and the difference.
2. The quick start: a long system prompt, asked cold, then warm()ed and asked again with other
   questions (TTFT, prompt tokens, cached tokens).
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

import kvboost

SYSTEM = ("You are a storyteller for small children. Your stories are short, kind and simple. They have a "
          "girl or a boy, an animal friend, a small problem and a happy ending. Use easy words. ") * 4
PROMPT = "Once upon a time, there was a little girl named Lily. She loved to play in the park with her dog."


def cli_runs(a, threads):
    cmd = [a.kvboost, "generate", "-m", a.model, "-p", PROMPT, "-n", str(a.tokens), "--temperature", "0",
           "--ignore-eos", "--no-prefix-cache", "--chunk-ram", "0", "--repeat", str(a.runs + 1), "--no-echo"]
    if threads:
        cmd += ["--threads", str(threads)]
    # stdout to /dev/null: a pipe would wake its reader on every token the CLI streams
    err = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=True).stderr
    ttft = [float(x) for x in re.findall(r"time to first token: ([\d.]+) ms", err)]
    tps = [float(x) for x in re.findall(r"decode: ([\d.]+) tokens/s", err)]
    return ttft[1:], tps[1:]  # the first run warms pages and caches


def py_runs(a, e):
    ttft, tps = [], []
    for i in range(a.runs + 1):
        r = e.generate(PROMPT, max_new_tokens=a.tokens, temperature=0, ignore_eos=True, prefix_cache=False)
        if i:
            ttft.append(r.ttft_ms)
            tps.append(r.tokens_per_s)
    return ttft, tps


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--kvboost", required=True, help="the kvboost binary")
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()

    e = kvboost.KVBoost.from_pretrained(a.model, recompute_strategy="prefix", max_cache_bytes=0,
                                        threads=a.threads or None)
    # Interleave CLI and Python rounds so that machine load hits both alike.
    c_ttft, c_tps, p_ttft, p_tps, wall_py = [], [], [], [], []
    for _ in range(3):
        t, s = cli_runs(a, a.threads)
        c_ttft += t
        c_tps += s
        t0 = time.perf_counter()
        t, s = py_runs(a, e)
        wall_py.append((time.perf_counter() - t0) * 1000 / (a.runs + 1))
        p_ttft += t
        p_tps += s
    med = statistics.median
    print(f"model {a.model}, prompt {len(e.tokenizer.encode(PROMPT))} tokens, {a.tokens} new tokens, "
          f"medians of {len(c_ttft)} runs each")
    print(f"{'':10} {'TTFT ms':>10} {'decode tok/s':>14}")
    print(f"{'CLI':10} {med(c_ttft):10.3f} {med(c_tps):14.1f}")
    print(f"{'Python':10} {med(p_ttft):10.3f} {med(p_tps):14.1f}")
    dt = med(p_ttft) - med(c_ttft)
    print(f"{'diff':10} {dt:+10.3f} {100 * (med(p_tps) / med(c_tps) - 1):+13.1f}%   "
          f"(TTFT {100 * dt / med(c_ttft):+.1f}%)")
    # The engine times TTFT inside; what a Python caller sees end to end per call:
    r = e.generate(PROMPT, max_new_tokens=1, temperature=0, ignore_eos=True, prefix_cache=False)
    calls = []
    for _ in range(20):
        t0 = time.perf_counter()
        r = e.generate(PROMPT, max_new_tokens=1, temperature=0, ignore_eos=True, prefix_cache=False)
        calls.append(((time.perf_counter() - t0) * 1000, r.total_ms))
    over = med([c - t for c, t in calls])
    print(f"Python call overhead beyond the engine's own total_ms (1-token generate): {over:.3f} ms")

    print()
    print("Quick start: warm a system prompt, then ask (greedy, 32 new tokens)")
    q = kvboost.KVBoost.from_pretrained(a.model, recompute_strategy="cacheblend", threads=a.threads or None)
    questions = ["Tell me about a cat who lost her hat.", "Tell me about a boy and his red kite.",
                 "Tell me about a dog who could not sleep."]
    rows = []
    q.generate("An unrelated warm-up prompt.", max_new_tokens=4, temperature=0, store=False)  # first-call costs
    r = q.generate(SYSTEM + questions[0], max_new_tokens=32, temperature=0, store=False)
    rows.append(("cold (no warm)", r))
    t0 = time.perf_counter()
    q.warm(SYSTEM)
    warm_ms = (time.perf_counter() - t0) * 1000
    for qq in questions:
        rows.append(("warm: " + qq[:28], q.generate(SYSTEM + qq, max_new_tokens=32, temperature=0)))
    print(f"warm(system prompt of {len(q.tokenizer.encode(SYSTEM))} tokens): {warm_ms:.1f} ms")
    print(f"{'request':36} {'prompt':>7} {'cached':>7} {'reuse':>7} {'TTFT ms':>9} {'total ms':>9}")
    for name, r in rows:
        print(f"{name:36} {r.prompt_tokens:7d} {r.cached_tokens:7d} {100 * r.kv_reuse_ratio:6.1f}% "
              f"{r.ttft_ms:9.2f} {r.total_ms:9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
