"""Greedy ids through kvboost (both APIs) equal transformers' greedy generation on
stories260K and on a generated fixture of each architecture transformers 4.49 runs (qwen3
through tools/oracle/qwen3_adapter.py)."""
import pytest

import kvboost
import kvboost.transformers as kt
from conftest import make_fixture, need

torch = pytest.importorskip("torch")


_MODELS = {}


def hf_greedy(model_dir, ids, n):
    """transformers' greedy continuation of ids (prompt + up to n ids, stopping after eos)."""
    from hf_reference import argmax, load_model  # tools/oracle: float32, eager attention, strict loading
    if model_dir not in _MODELS:
        _MODELS[model_dir] = load_model(model_dir)[0]
    model = _MODELS[model_dir]
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    with torch.no_grad():
        try:
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 max_new_tokens=n, do_sample=False, num_beams=1, temperature=None, top_p=None,
                                 top_k=None, pad_token_id=min(eos) if eos else 0)
            return out[0].tolist()
        except ValueError as e:
            # Debian's torch 1.13 on Python 3.11: generate() imports torch.distributed, whose
            # dataclasses Python 3.11 rejects ("mutable default ... TensorProperties"). The same
            # greedy search by hand: argmax over past_key_values steps, stopping after eos.
            if "mutable default" not in str(e):
                raise
        seq = list(ids)
        out = model(input_ids=torch.tensor([seq]), use_cache=True)
        for _ in range(n):
            nxt = argmax(out.logits[0, -1].float())
            seq.append(nxt)
            if nxt in eos:
                break
            out = model(input_ids=torch.tensor([[nxt]]), past_key_values=out.past_key_values, use_cache=True)
        return seq


def check(model_dir, prompts, n):
    m = kt.AutoModelForCausalLM.from_pretrained(model_dir)
    eng = m.engine
    for p in prompts:
        ids = eng.tokenizer.encode(p)
        want = hf_greedy(model_dir, ids, n)
        got = m.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)
        assert isinstance(got, torch.Tensor) and got.dtype == torch.long and got.shape[0] == 1
        assert got[0].tolist() == want, (p, got[0].tolist(), want)
        r = eng.generate(p, max_new_tokens=n, temperature=0)
        assert ids + r.token_ids == want
    return m


def test_stories260k_matches_transformers(stories_dir):
    m = check(stories_dir, ["Once upon a time", "The little dog"], 24)
    # a batch of two rows of different lengths, padded on the left with an attention mask
    tok = m.engine.tokenizer
    a, b = tok.encode("Once upon a time"), tok.encode("Lily")
    pad = 0
    x = torch.tensor([a, [pad] * (len(a) - len(b)) + b])
    mask = torch.tensor([[1] * len(a), [0] * (len(a) - len(b)) + [1] * len(b)])
    out = m.generate(x, attention_mask=mask, max_new_tokens=8, do_sample=False)
    assert out.shape[0] == 2
    want_a, want_b = hf_greedy(m.engine.path, a, 8), hf_greedy(m.engine.path, b, 8)
    assert out[0].tolist()[: len(want_a)] == want_a
    assert out[1].tolist()[len(a) - len(b):][: len(want_b)] == want_b  # the left padding stays
    assert m.generate(a, max_new_tokens=4) == [hf_greedy(m.engine.path, a, 4)]  # lists in, lists out


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
def test_fixture_architectures_match_transformers(arch):
    d = make_fixture(f"oracle-{arch}", "--preset", "tiny", "--arch", arch)
    check(d, ["Hello world, this is", "abc"], 16)
