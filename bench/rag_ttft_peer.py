#!/usr/bin/env python3
"""Re-ordered RAG time-to-first-token: `kvboost serve` (chunk reuse, --reuse auto by default)
against llama.cpp's `llama-server` on the same GGUF file and the same text, in the same run.

Documents are cut from real text (--corpus), wrapped in a chat turn (--turn: Gemma's by default), and cached in one
order (--docs per warm-up request, every document once); each measured prompt then asks about
one of them with --docs documents drawn in another order. Each prompt goes to both servers (the
order alternating per prompt), max_tokens 1 (or --max-tokens; by default kvboost's --guard-tokens), greedy; the time is the client-side wall time of
the request (the first token's). kvboost gets the documents as `segments` (its extension: each
one chunked on its own, so that it is found wherever it appears); llama-server gets the same
text joined into one prompt (and --cache-reuse, its KV-shifting reuse of chunks of the previous
prompt, on). Both use the same thread count. Prints per-server median and mean TTFT, their
ratio, and (kvboost) how many prompts the guard escalated.

    bench/rag_ttft_peer.py --kvboost build/kvboost --llama-server /work/peers/build-llama/bin/llama-server \
        --gguf "$(bash scripts/gemma_path.sh)" --corpus tests/data/corpus/harbour.txt,/usr/share/common-licenses/GPL-3

--llama-server none measures kvboost alone (its full prefill vs reuse instead, same server, by
sending each prompt once with "reuse": "prefix" and "prefix_cache": false as the baseline).
"""
import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
import urllib.request


def words_of(files):
    w = []
    for f in files.split(","):
        with open(f, encoding="utf-8", errors="replace") as fh:
            w += fh.read().split()
    return w


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def post(port, path, body, timeout=600):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=timeout) as r:
        out = json.loads(r.read())
    return (time.perf_counter() - t0) * 1000.0, out


def wait_up(port, proc, name, timeout=300):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            sys.exit(f"{name} exited with {proc.returncode} before answering")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            time.sleep(0.5)
    sys.exit(f"{name} did not come up on port {port} within {timeout} s")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvboost", default="build/kvboost")
    ap.add_argument("--llama-server", default="/work/peers/build-llama/bin/llama-server")
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--docs", type=int, default=6)
    ap.add_argument("--pool", type=int, default=18)
    ap.add_argument("--doc-words", type=int, default=230)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--log-dir", default="/tmp")
    ap.add_argument("--guard-risk", type=float, default=None,
                    help="kvboost's reuse.guard_risk per request (default: the server's, ReusePolicy::guard_risk)")
    ap.add_argument("--guard-lead", type=float, default=None,
                    help="kvboost's reuse.guard_lead per request (with --guard-risk 0 a fixed threshold; 0 and 0: the guard off)")
    ap.add_argument("--guard-tokens", type=int, default=None,
                    help="kvboost's reuse.guard_tokens per request (default: the server's, ReusePolicy::guard_tokens)")
    ap.add_argument("--turn", choices=["gemma", "chatml", "none"], default="gemma",
                    help="the chat turn around the prompt: gemma (<start_of_turn>), chatml (Qwen's <|im_start|>) "
                         "or none (plain text)")
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="an extra argument for `kvboost serve` (repeat), e.g. --serve-arg=--chunk-store "
                         "--serve-arg=DIR to start from the guard calibration DIR holds")
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="tokens per request on both servers (default: kvboost's guard_tokens, at least 1): the time "
                         "is then to the first N tokens, which covers kvboost's held-back guard tokens honestly")
    ap.add_argument("--per-prompt", default=None,
                    help="write one TSV row per prompt: client ms of each server and kvboost's own accounting "
                         "(ttft_ms, prefill_ms, cached/reused/recomputed/new tokens, guarded)")
    a = ap.parse_args()
    if a.max_tokens is None:
        a.max_tokens = max(1, a.guard_tokens or 1)
    rng = random.Random(a.seed)
    words = words_of(a.corpus)
    at = rng.randrange(len(words))

    def take(n):
        nonlocal at
        out = [words[(at + i) % len(words)] for i in range(n)]
        at = (at + n) % len(words)
        return " ".join(out)

    head, tail = {"gemma": ("<start_of_turn>user\n", "<end_of_turn>\n<start_of_turn>model\n"),
                  "chatml": ("<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n"),
                  "none": ("", "\nAnswer:")}[a.turn]
    sys_text = head + "You answer questions about the documents below. Answer briefly.\n"
    docs = ["\n" + take(a.doc_words) for _ in range(a.pool)]

    procs = []
    kv_port = free_port()
    kv_log = open(os.path.join(a.log_dir, "rag_peer_kvboost.log"), "w")
    procs.append(subprocess.Popen([a.kvboost, "serve", "--model", a.gguf, "--port", str(kv_port), "--threads",
                                   str(a.threads)] + a.serve_arg, stdout=kv_log, stderr=subprocess.STDOUT))
    peer = a.llama_server != "none" and os.path.exists(a.llama_server)
    if a.llama_server != "none" and not peer:
        print(f"llama-server not found at {a.llama_server}: measuring kvboost alone (full prefill vs reuse)")
    ll_port = free_port()
    if peer:
        ll_log = open(os.path.join(a.log_dir, "rag_peer_llama.log"), "w")
        procs.append(subprocess.Popen([a.llama_server, "-m", a.gguf, "--port", str(ll_port), "-t", str(a.threads),
                                       "-c", str(a.ctx), "-np", "1", "--cache-reuse", "64"],
                                      stdout=ll_log, stderr=subprocess.STDOUT))
    try:
        wait_up(kv_port, procs[0], "kvboost serve")
        if peer:
            wait_up(ll_port, procs[1], "llama-server")

        def kv(segs, prompt, **extra):
            body = {"prompt": prompt, "segments": segs, "max_tokens": a.max_tokens, "temperature": 0}
            body.update(extra)
            return post(kv_port, "/v1/completions", body)

        def ll(segs, prompt):
            return post(ll_port, "/v1/completions", {"prompt": "".join(segs) + prompt, "max_tokens": a.max_tokens,
                                                      "temperature": 0, "cache_prompt": True})

        # Cache in one order.
        order = list(range(a.pool))
        rng.shuffle(order)
        for i in range(0, a.pool, a.docs):
            segs = [sys_text] + [docs[d] for d in order[i:i + a.docs]]
            kv(segs, "\n")
            if peer:
                ll(segs, "\n")
        t_kv, t_ll, t_full, texts_equal, escalated = [], [], [], 0, 0
        rows = []
        for p in range(a.prompts):
            pick = rng.sample(range(a.pool), a.docs)
            segs = [sys_text] + [docs[d] for d in pick]
            q = docs[rng.choice(pick)].split()
            k = rng.randrange(max(1, len(q) - 6))
            prompt = "\n\nQuestion: What does the text say about \"" + " ".join(q[k:k + 6]) + "\"?" + tail
            runs = ["kv", "ll" if peer else "full"]
            if p % 2:
                runs.reverse()
            got = {}
            for r in runs:
                if r == "kv":
                    reuse = {"mode": "auto", "store": False}
                    if a.guard_risk is not None:
                        reuse["guard_risk"] = a.guard_risk
                    if a.guard_tokens is not None:
                        reuse["guard_tokens"] = a.guard_tokens
                    if a.guard_lead is not None:
                        reuse["guard_lead"] = a.guard_lead
                    ms, out = kv(segs, prompt, reuse=reuse)
                    t_kv.append(ms)
                    k = out.get("kvboost", {})
                    escalated += bool(k.get("guarded", False))
                    rows.append([p, round(ms, 1)] + [k.get(f) for f in (
                        "ttft_ms", "prefill_ms", "cached_prefix_tokens", "reused_tokens", "recomputed_tokens",
                        "new_tokens", "guarded", "first_lead", "guard_lead")])
                elif r == "ll":
                    ms, out = ll(segs, prompt)
                    t_ll.append(ms)
                else:
                    ms, out = kv(segs, prompt, reuse={"mode": "prefix", "store": False}, cache_salt=f"cold{p}")
                    t_full.append(ms)
                got[r] = out["choices"][0]["text"]
            if len(set(got.values())) == 1:
                texts_equal += 1
            rows[-1] += [round((t_ll if peer else t_full)[-1], 1), len(set(got.values())) == 1]
            if p == 0:
                print(f"prompt 0: {len(prompt.split()) + sum(len(s.split()) for s in segs)} words", flush=True)
        if a.per_prompt:
            with open(a.per_prompt, "w") as fh:
                fh.write("prompt\tkv_ms\tttft_ms\tprefill_ms\tcached\treused\trecomputed\tnew\tguarded\t"
                         "first_lead\tguard_lead\tother_ms\tsame_text\n")
                for r in rows:
                    fh.write("\t".join(str(x) for x in r) + "\n")
        other = t_ll if peer else t_full
        name = "llama-server" if peer else "kvboost full prefill"
        print(f"\n{a.prompts} re-ordered RAG prompts, {a.docs} documents of {a.doc_words} words from a pool of "
              f"{a.pool}, {a.threads} threads, file {a.gguf}")
        print("| server | TTFT median ms | TTFT mean ms |\n|---|---|---|")
        print(f"| kvboost serve (auto) | {statistics.median(t_kv):.0f} | {statistics.mean(t_kv):.0f} |")
        print(f"| {name} | {statistics.median(other):.0f} | {statistics.mean(other):.0f} |")
        print(f"\nratio {name} / kvboost: median {statistics.median(other) / statistics.median(t_kv):.2f}x, "
              f"mean {statistics.mean(other) / statistics.mean(t_kv):.2f}x; same first token on "
              f"{texts_equal}/{a.prompts} prompts; kvboost's guard recomputed {escalated}/{a.prompts} "
              f"(their TTFT is in the mean)")
    finally:
        for pr in procs:
            pr.terminate()
        for pr in procs:
            try:
                pr.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pr.kill()


if __name__ == "__main__":
    main()
