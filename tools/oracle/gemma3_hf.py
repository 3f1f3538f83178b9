#!/usr/bin/env python3
"""Hugging Face transformers oracle for Gemma 3 270M on the dequantized GGUF weights
(tests/model/test_gemma3.cpp, Gemma3Hf.*).

    # 1. the GGUF's weights, dequantized by gguf-py, as a Hugging Face directory (~1.1 GB, f32):
    tools/oracle/gemma3_hf.py dequant --gguf gemma-3-270m-q4_k_m.gguf --out DIR
    # 2. transformers' greedy tokens and logits on it (needs transformers >= 4.50, see below):
    tools/oracle/gemma3_hf.py oracle --model DIR [--out tests/model/data/gemma3_hf.json]

`dequant` (numpy, gguf 0.19, safetensors; the project's .venv has them) writes config.json and
generation_config.json as google/gemma-3-270m's (model_type gemma3_text, eos [1, 106]) and
model.safetensors with every tensor in f32, renamed to transformers' names. Two GGUF facts:
llama.cpp's converter stored every "*norm.weight" as 1 + w (Gemma3RMSNorm computes x * (1 + w)),
so w = stored - 1 is written back (exact: the stored values have at most bf16 precision); the
embedding scale sqrt(hidden) is not in the weights on either side (Gemma3TextScaledWordEmbedding
multiplies at run time, as llama.cpp's graph does).

`oracle` runs Gemma3ForCausalLM in float32 with eager attention, no KV cache (every step is a
full forward over prompt + generated tokens, so no cache or mask-slicing code is involved), for
the prompts below (their ids come from tests/model/data/gemma3_llamacpp.json, i.e. llama.cpp's
tokenizer, which ours matches): N greedy steps without stopping at EOS; per step the top
TOP_K (id, logit) pairs and log-sum-exp over the whole vocabulary.

transformers first has Gemma 3 in 4.50, which imports torch-2 modules at load
(torch.distributed.tensor, torch.compiler, torch._dynamo). With Debian's torch 1.13 this tool
installs inert stand-ins for those before importing transformers (none is on the f32 eager
forward path); checked against an independent numpy forward of the same weights (see README
"Real model"). A venv for it, leaving the project's .venv (transformers 4.49) alone:

    python3 -m venv --system-site-packages /tmp/hf450
    /tmp/hf450/bin/pip install transformers==4.50.3 tokenizers==0.21.1 safetensors==0.8.0 gguf==0.19.0
"""
import argparse
import hashlib
import json
import os
import sys
import types

TOP_K = 8
N_STEPS = 32
N_STEPS_LONG = 8
HERE = os.path.dirname(os.path.abspath(__file__))
LLAMACPP_ORACLE = os.path.join(HERE, "../../tests/model/data/gemma3_llamacpp.json")

# GGUF tensor suffix -> transformers Gemma3 name (gguf-py tensor_mapping.py, gemma3).
LAYER_MAP = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


def hf_name(g):
    if g == "token_embd.weight":
        return "model.embed_tokens.weight"
    if g == "output_norm.weight":
        return "model.norm.weight"
    if g.startswith("blk."):
        layer, rest = g[4:].split(".", 1)
        if rest in LAYER_MAP:
            return f"model.layers.{layer}.{LAYER_MAP[rest]}"
    raise SystemExit(f"unexpected GGUF tensor {g!r}")


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def field(r, key, default=None):
    f = r.fields.get(key)
    return default if f is None else f.contents()


def dequant(a):
    import gguf
    import numpy as np
    from safetensors.numpy import save_file

    r = gguf.GGUFReader(a.gguf)
    if field(r, "general.architecture") != "gemma3":
        raise SystemExit(f"{a.gguf}: general.architecture is {field(r, 'general.architecture')!r}, not gemma3")
    p = "gemma3."
    n_layers = int(field(r, p + "block_count"))
    pattern = 6  # llama.cpp set_swa_pattern(6); the 270M file has no sliding_window_pattern key
    tensors = {}
    for t in r.tensors:
        w = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)
        w = w.reshape([int(x) for x in reversed(t.shape)])
        if t.name.endswith("norm.weight"):
            w = w - np.float32(1.0)  # the converter's Gemma3RMSNorm shift, undone
        tensors[hf_name(t.name)] = np.ascontiguousarray(w)
    if len(tensors) != 2 + 13 * n_layers:
        raise SystemExit(f"{a.gguf}: {len(tensors)} tensors, expected {2 + 13 * n_layers}")
    heads = int(field(r, p + "attention.head_count"))
    head_dim = int(field(r, p + "attention.key_length"))
    config = {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "vocab_size": int(tensors["model.embed_tokens.weight"].shape[0]),
        "hidden_size": int(field(r, p + "embedding_length")),
        "intermediate_size": int(field(r, p + "feed_forward_length")),
        "num_hidden_layers": n_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": int(field(r, p + "attention.head_count_kv")),
        "head_dim": head_dim,
        "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": int(field(r, p + "context_length")),
        "rms_norm_eps": float(np.float32(field(r, p + "attention.layer_norm_rms_epsilon"))),
        "rope_theta": float(field(r, p + "rope.freq_base")),
        "rope_local_base_freq": float(field(r, p + "rope.freq_base_swa", 10000.0)),
        "rope_scaling": None,
        "query_pre_attn_scalar": head_dim,
        "sliding_window": int(field(r, p + "attention.sliding_window")),
        "sliding_window_pattern": pattern,
        "layer_types": ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n_layers)],
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
        "attention_bias": False,
        "tie_word_embeddings": True,
        "bos_token_id": int(field(r, "tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(field(r, "tokenizer.ggml.eos_token_id")),
        "pad_token_id": int(field(r, "tokenizer.ggml.padding_token_id", 0)),
        "torch_dtype": "float32",
        "kvboost_source": {"gguf": os.path.basename(a.gguf), "sha256": sha256(a.gguf),
                           "generator": "tools/oracle/gemma3_hf.py dequant (gguf-py quants.dequantize)"},
    }
    tokens = field(r, "tokenizer.ggml.tokens")
    eot = tokens.index("<end_of_turn>")
    generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": [config["eos_token_id"], eot],
                  "pad_token_id": config["pad_token_id"], "do_sample": True, "top_k": 64, "top_p": 0.95}
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    with open(os.path.join(a.out, "generation_config.json"), "w") as f:
        json.dump(generation, f, indent=1)
    save_file(tensors, os.path.join(a.out, "model.safetensors"), metadata={"format": "pt"})
    print(f"wrote {a.out}: {len(tensors)} tensors, {sum(v.nbytes for v in tensors.values()) / 1e9:.2f} GB f32")


def torch1_shims():
    """Inert stand-ins for the torch-2 modules transformers 4.50 imports at load time."""
    import torch
    if int(torch.__version__.split(".")[0]) >= 2:
        return
    for name in ("torch.distributed.tensor", "torch.distributed.tensor.parallel"):
        sys.modules.setdefault(name, types.ModuleType(name))

    class _Stub:
        def __init__(self, *a, **k):
            pass

    sys.modules["torch.distributed.tensor"].Replicate = _Stub
    sys.modules["torch.distributed.tensor"].DTensor = type("DTensor", (), {})
    for n in ("ColwiseParallel", "RowwiseParallel", "ParallelStyle", "PrepareModuleInput", "SequenceParallel"):
        setattr(sys.modules["torch.distributed.tensor.parallel"], n, _Stub)
    if not hasattr(torch, "compiler"):
        c = types.ModuleType("torch.compiler")
        c.is_compiling = lambda: False
        c.disable = lambda fn=None, recursive=True: fn if fn is not None else (lambda f: f)
        torch.compiler = c
        sys.modules["torch.compiler"] = c
    if not hasattr(torch, "_dynamo"):
        d = types.ModuleType("torch._dynamo")
        d.mark_static_address = lambda t, guard=True: None
        d.is_compiling = lambda: False
        torch._dynamo = d
        sys.modules["torch._dynamo"] = d


def prompts():
    """(name, ids, n_steps): llama.cpp's three prompts and its chat-turn string (ids from its
    tokenizer), and a prompt past the sliding window (512): the oracle's tokenized strings
    repeated to 700 tokens."""
    with open(LLAMACPP_ORACLE, encoding="utf-8") as f:
        o = json.load(f)
    out = [(g["prompt"], g["prompt_ids"], N_STEPS) for g in o["generate"]]
    chat = next(c for c in o["tokenize"] if c["text"].startswith("<start_of_turn>"))
    out.append((chat["text"], chat["ids"], N_STEPS))
    body = [i for c in o["tokenize"] for i in c["ids"][1:]]
    long_ids = [2]
    while len(long_ids) < 700:
        long_ids += body
    out.append(("long (700 tokens: the tokenize strings repeated)", long_ids[:700], N_STEPS_LONG))
    return out


def oracle(a):
    torch1_shims()
    import torch
    import transformers
    from transformers import Gemma3ForCausalLM

    torch.set_grad_enabled(False)
    # Built from the config and loaded by hand: from_pretrained in 4.50 calls torch-2's
    # load_state_dict(assign=...). Every parameter must come from the file (no random init left).
    from safetensors.torch import load_file
    from transformers import Gemma3TextConfig
    config = Gemma3TextConfig.from_pretrained(a.model)
    config._attn_implementation = "eager"
    model = Gemma3ForCausalLM(config).float().eval()
    state = load_file(os.path.join(a.model, "model.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or set(missing) != {"lm_head.weight"}:
        raise SystemExit(f"{a.model}: weights do not match Gemma3ForCausalLM: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    with open(os.path.join(a.model, "config.json")) as f:
        src = json.load(f).get("kvboost_source", {})
    data = {
        "model": src.get("gguf", ""),
        "sha256": src.get("sha256", ""),
        "generator": f"tools/oracle/gemma3_hf.py oracle (transformers {transformers.__version__}, torch "
                     f"{torch.__version__}, Gemma3ForCausalLM float32 eager, no KV cache)",
        "top_k": TOP_K,
        "cases": [],
    }
    for name, ids, n in prompts():
        seq = list(ids)
        steps = []
        for _ in range(n):
            logits = model(torch.tensor([seq]), use_cache=False).logits[0, -1].double()
            top = torch.topk(logits, TOP_K)
            steps.append({"top_ids": [int(i) for i in top.indices],
                          "top_logits": [round(float(v), 6) for v in top.values],
                          "lse": round(float(torch.logsumexp(logits, 0)), 6)})
            seq.append(int(top.indices[0]))
        greedy = seq[len(ids):]
        margin = min(s["top_logits"][0] - s["top_logits"][1] for s in steps)
        data["cases"].append({"name": name, "prompt_ids": ids, "greedy_ids": greedy, "steps": steps})
        print(f"{name[:40]!r}: {len(ids)} tokens -> {greedy}  (smallest top-2 margin {margin:.4f})", flush=True)
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, indent=None, separators=(",", ":"))
        f.write("\n")
    print("wrote", a.out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dequant", help="GGUF -> Hugging Face directory (f32)")
    d.add_argument("--gguf", required=True)
    d.add_argument("--out", required=True)
    o = sub.add_parser("oracle", help="transformers' greedy tokens and logits -> JSON")
    o.add_argument("--model", required=True, help="directory written by dequant")
    o.add_argument("--out", default=os.path.join(HERE, "../../tests/model/data/gemma3_hf.json"))
    a = ap.parse_args()
    dequant(a) if a.cmd == "dequant" else oracle(a)


if __name__ == "__main__":
    main()
