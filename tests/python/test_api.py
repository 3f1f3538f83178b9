"""kvboost's Python API on generated fixtures and stories260K: generation, streaming, batching,
caches, verify_correctness, errors, cancellation, threads."""
import _thread
import json
import os
import shutil
import threading
import time

import pytest

import kvboost
from conftest import SHARED, make_fixture, need

PROMPT = "Once upon a time, there was a little"


def greedy(engine, prompt, n=12, **kw):
    return engine.generate(prompt, max_new_tokens=n, temperature=0, **kw)


def test_generate_returns_a_full_result(tiny):
    r = greedy(tiny, PROMPT, 16, ignore_eos=True)
    assert isinstance(r, kvboost.GenerationResult)
    assert len(r.token_ids) == 16 and r.finish_reason == "length"
    assert r.prompt_tokens == len(tiny.tokenizer.encode(PROMPT)) == len(r.prompt_ids)
    assert r.ttft_ms > 0 and r.total_ms >= r.ttft_ms
    assert r.output_text == tiny.tokenizer.decode(r.token_ids)
    assert 0.0 <= r.kv_reuse_ratio <= 1.0 and r.guarded is False
    # the same prompt again: its full blocks come from the prefix cache
    again = greedy(tiny, PROMPT, 16, ignore_eos=True)
    assert again.token_ids == r.token_ids
    assert again.cached_tokens > 0 and again.kv_reuse_ratio > 0


def test_stream_equals_non_stream(tiny):
    want = greedy(tiny, PROMPT, 24, ignore_eos=True, prefix_cache=False)
    s = tiny.generate(PROMPT, max_new_tokens=24, temperature=0, ignore_eos=True, stream=True, prefix_cache=False)
    pieces = list(s)
    assert len(pieces) > 1
    assert "".join(pieces) == want.output_text
    assert s.result is not None and s.result.token_ids == want.token_ids


def test_stop_strings_and_sampling_seed(tiny):
    base = greedy(tiny, PROMPT, 24, ignore_eos=True)
    stop = base.output_text[5:8]
    need(len(stop) == 3, "fixture output too short for a stop string")
    r = greedy(tiny, PROMPT, 24, ignore_eos=True, stop=stop)
    assert r.finish_reason == "stop" and stop not in r.output_text
    a = tiny.generate(PROMPT, max_new_tokens=12, temperature=1.0, seed=7, ignore_eos=True)
    b = tiny.generate(PROMPT, max_new_tokens=12, temperature=1.0, seed=7, ignore_eos=True)
    assert a.token_ids == b.token_ids


def test_generate_batch_equals_one_by_one(tiny):
    prompts = [PROMPT, "The cat sat", {"prompt": "A dog", "max_new_tokens": 5}]
    batch = tiny.generate_batch(prompts, max_new_tokens=10, temperature=0, ignore_eos=True)
    assert [len(r.token_ids) for r in batch] == [10, 10, 5]
    for p, r in zip(prompts, batch):
        p, n = (p["prompt"], p["max_new_tokens"]) if isinstance(p, dict) else (p, 10)
        assert greedy(tiny, p, n, ignore_eos=True).token_ids == r.token_ids


def test_tokenizer_round_trip(tiny):
    ids = tiny.tokenizer.encode("hello world", add_special_tokens=False)
    assert ids and all(isinstance(i, int) for i in ids)
    assert tiny.tokenizer.decode(ids) == "hello world"
    assert tiny.tokenizer("hi")["input_ids"] == tiny.tokenizer.encode("hi")


def test_messages_use_the_chat_template():
    tok_dir = os.path.join(SHARED, "tokenizers", "qwen2.5")
    need(os.path.isfile(os.path.join(tok_dir, "tokenizer_config.json")), f"{tok_dir} missing")
    d = make_fixture("tiny-qwen-tok", "--preset", "tiny", "--tokenizer", tok_dir)
    e = kvboost.KVBoost.from_pretrained(d, recompute_strategy="prefix")
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there!"}]
    r = e.generate(messages=msgs, max_new_tokens=3, temperature=0, ignore_eos=True)
    from transformers import AutoTokenizer
    want = AutoTokenizer.from_pretrained(tok_dir).apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    assert r.prompt_ids == list(want)
    assert e.generate(msgs, max_new_tokens=3, temperature=0, ignore_eos=True).token_ids == r.token_ids


def test_warm_then_ask_reuses_the_system_prompt(stories):
    system = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. " * 3
    stories.warm(system)
    r = stories.generate(system + "One day, she saw a big dog.", max_new_tokens=8, temperature=0)
    assert r.cached_tokens >= len(stories.tokenizer.encode(system)) - 16  # all full blocks of it
    st = stories.cache_stats()
    assert st["prefix_cache"]["hit_tokens"] > 0 and st["chunk_store"]["entries"] > 0


def test_verify_correctness_on_reordered_rag_documents(stories):
    sys_p = "You read the stories and answer.\n"
    doc_a = "Tom had a red ball. He threw it high and his dog ran to catch it in the green grass.\n"
    doc_b = "Sue baked a cake with her mom. They put sugar and eggs in a big bowl and mixed it well.\n"
    q = "Who had a red ball?"
    stories.warm(segments=[sys_p, doc_a, doc_b])
    (agr,) = stories.verify_correctness([[sys_p, doc_b, doc_a, q]], n_tokens=6)
    assert isinstance(agr, kvboost.Agreement)
    assert agr.reused_tokens > 0, agr  # doc_a and doc_b found at other positions
    assert len(agr.cosine) == 6 and len(agr.kl) == 6
    assert agr.mean_cosine > 0.9 and agr.top1_rate >= 0.5, agr
    # exact prefix reuse is exact: the warmed order itself agrees everywhere
    (same,) = stories.verify_correctness([[sys_p, doc_a, doc_b]], n_tokens=4)
    assert same.top1_rate == 1.0 and same.mean_cosine > 0.99999 and same.mean_kl < 1e-6, same


def test_errors_are_kvboost_errors(tiny, tiny_dir, tmp_path):
    with pytest.raises(kvboost.InvalidRequestError, match="empty"):
        tiny.generate("", max_new_tokens=2)
    with pytest.raises(kvboost.InvalidRequestError, match="temperature"):
        tiny.generate(PROMPT, max_new_tokens=2, temperature=-1)
    with pytest.raises(ValueError):  # InvalidRequestError is a ValueError too
        tiny.generate(PROMPT, max_new_tokens=2, bogus=1)
    with pytest.raises(kvboost.InvalidRequestError, match="recompute_strategy"):
        kvboost.KVBoost.from_pretrained(tiny_dir, recompute_strategy="magic")
    with pytest.raises(kvboost.InvalidRequestError, match="kv_cache_bits"):
        kvboost.KVBoost.from_pretrained(tiny_dir, kv_cache_bits=16)
    with pytest.raises(kvboost.ModelNotFoundError, match="no such directory"):
        kvboost.KVBoost.from_pretrained(str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError):
        kvboost.KVBoost.from_pretrained(str(tmp_path / "nope"))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{ not json")
    (bad / "tokenizer.json").write_bytes(open(os.path.join(tiny_dir, "tokenizer.json"), "rb").read())
    with pytest.raises(kvboost.EngineError, match="config.json") as ei:
        kvboost.KVBoost.from_pretrained(str(bad))
    assert isinstance(ei.value, kvboost.Error)
    plain = tmp_path / "plain"  # the fixture without a chat template
    shutil.copytree(tiny_dir, plain)
    cfg = json.loads((plain / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(kvboost.ChatTemplateError, match="chat template"):
        kvboost.KVBoost.from_pretrained(str(plain)).generate(messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(kvboost.InvalidRequestError, match="request 1"):
        tiny.generate_batch([PROMPT, ""], max_new_tokens=2)


def idle_blocks(engine):
    st = engine.cache_stats()["prefix_cache"]
    return st["blocks_used"]


def test_ctrl_c_cancels_cleanly(tiny):
    # KeyboardInterrupt arrives as SIGINT would (the main thread's signal flag); the engine must
    # stop within a poll interval, free the request's KV, and stay usable.
    used_before = idle_blocks(tiny)
    timer = threading.Timer(0.3, _thread.interrupt_main)
    t0 = time.monotonic()
    timer.start()
    # Generate until interrupted: on a fast host one 4000-token request on the tiny model can end
    # before the timer fires, and the interrupt must land inside a generate call.
    with pytest.raises(KeyboardInterrupt):
        while time.monotonic() - t0 < 5.0:
            tiny.generate(PROMPT, max_new_tokens=4000, temperature=0, ignore_eos=True, prefix_cache=False)
    assert time.monotonic() - t0 < 5.0
    timer.join()
    assert idle_blocks(tiny) == used_before
    assert len(greedy(tiny, PROMPT, 4, ignore_eos=True).token_ids) == 4
    # and while streaming
    timer = threading.Timer(0.3, _thread.interrupt_main)
    t0 = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        while time.monotonic() - t0 < 5.0:
            for _ in tiny.generate(PROMPT, max_new_tokens=4000, temperature=0, ignore_eos=True, stream=True):
                pass
    timer.join()
    assert idle_blocks(tiny) == used_before


def test_leaving_a_stream_early_cancels_it(tiny):
    used_before = idle_blocks(tiny)
    s = tiny.generate(PROMPT, max_new_tokens=4000, temperature=0, ignore_eos=True, stream=True)
    it = iter(s)
    next(it)
    it.close()
    assert idle_blocks(tiny) == used_before


def test_two_threads_generate_at_once_and_the_gil_is_released(tiny):
    prompts = [PROMPT, "The little dog ran"]
    want = [greedy(tiny, p, 200, ignore_eos=True, prefix_cache=False).token_ids for p in prompts]
    got = [None, None]
    errors = []
    ticks = [0]
    stop = threading.Event()

    def run(i):
        try:
            got[i] = greedy(tiny, prompts[i], 200, ignore_eos=True, prefix_cache=False).token_ids
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    def tick():  # runs only if generate() lets go of the GIL
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.001)

    t = threading.Thread(target=tick)
    t.start()
    ths = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    stop.set()
    t.join()
    assert not errors and got == want
    # the GIL: the ticker ran while the main thread sat in generate()
    ticks[0] = 0
    stop.clear()
    t = threading.Thread(target=tick)
    t.start()
    r = greedy(tiny, PROMPT, 2000, ignore_eos=True, prefix_cache=False)
    stop.set()
    t.join()
    assert r.total_ms < 50 or ticks[0] >= 5, (ticks[0], r.total_ms)


def test_kv_cache_bits_and_chunk_store_dir(tiny_dir, tmp_path):
    e = kvboost.KVBoost.from_pretrained(tiny_dir, recompute_strategy="cacheblend", kv_cache_bits=8,
                                        chunk_store=str(tmp_path / "store"), max_cache_bytes="64MiB", chunk_size=32)
    text = "The sun was warm and the birds sang in the tall trees near the river bank. " * 4
    e.warm(text)
    e.flush()
    st = e.cache_stats()["chunk_store"]
    assert st["quant"] == "int8" and st["entries"] > 0
    assert any(p.is_file() for p in (tmp_path / "store").rglob("*"))
    assert "KVBoost(" in repr(e)
    json.dumps(e.cache_stats())  # plain data


def test_tp_option(stories_dir):
    """tp=2 (tensor parallelism, docs/gpu.md) gives TP = 1's greedy tokens; a bad value or a
    split the heads do not allow is an error that names it."""
    one = kvboost.KVBoost.from_pretrained(stories_dir, recompute_strategy="prefix")
    two = kvboost.KVBoost.from_pretrained(stories_dir, recompute_strategy="prefix", tp=2)
    assert greedy(two, PROMPT, 16, ignore_eos=True).token_ids == greedy(one, PROMPT, 16, ignore_eos=True).token_ids
    for bad in (0, -1, 1.5, True):
        with pytest.raises(kvboost.InvalidRequestError, match="tp = .* must be an integer >= 1"):
            kvboost.KVBoost.from_pretrained(stories_dir, tp=bad)
    with pytest.raises(kvboost.EngineError, match="do not split over 3 ranks"):
        kvboost.KVBoost.from_pretrained(stories_dir, tp=3)


def test_device_option(tiny_dir):
    """device="cpu" is the default and loads; a bad value names itself; CUDA without a CUDA build
    (or without a device) is an EngineError naming the device (docs/gpu.md)."""
    e = kvboost.KVBoost.from_pretrained(tiny_dir, recompute_strategy="prefix", device="cpu")
    assert len(greedy(e, PROMPT, 4, ignore_eos=True).token_ids) == 4
    with pytest.raises(kvboost.InvalidRequestError, match='"cuda:x" is not a device'):
        kvboost.KVBoost.from_pretrained(tiny_dir, device="cuda:x")
    with pytest.raises(kvboost.InvalidRequestError, match='"gpu" is not a device'):
        kvboost.KVBoost.from_pretrained(tiny_dir, device="gpu")
    # cuda:7: past the device count of any machine these tests run on (with two or more
    # devices, cuda:1 would load and run: the engine's device runner, docs/gpu.md)
    with pytest.raises(kvboost.EngineError, match="cuda:7") as ei:
        kvboost.KVBoost.from_pretrained(tiny_dir, device="cuda:7")
    msg = str(ei.value)
    assert ("built without CUDA (-DKVBOOST_CUDA=ON)" in msg or "CUDA sees" in msg
            or "no CUDA device" in msg), msg
    # vram_budget (device layer streaming) is for a CUDA device: on the CPU, an error naming it
    with pytest.raises(kvboost.InvalidRequestError, match="vram_budget = 1073741824 is for a CUDA device"):
        kvboost.KVBoost.from_pretrained(tiny_dir, device="cpu", vram_budget="1GiB")
