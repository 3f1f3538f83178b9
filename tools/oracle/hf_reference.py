#!/usr/bin/env python3
"""Reference logits from Hugging Face transformers, for comparing KVBoost against.

    hf_reference.py --model DIR --ids "1 2 3 ..." --greedy N --out FILE.json

Loads the model directory (config.json + safetensors, single file or sharded) with transformers in
float32 with eager attention -- bf16/f16 weights are upcast exactly, so the comparison measures the
engine's arithmetic, not a second rounding -- and writes:

    {
      "prompt_logits": [[float] * vocab] * n_prompt,   # row i: logits after prompt[0..i], one forward
      "greedy_ids":    [int] * N,                       # greedy_ids[0] = argmax(prompt_logits[-1])
      "greedy_logits": [[float] * vocab] * N,           # row k: logits of the decode step that consumed
                                                        #   greedy_ids[k] at position n_prompt + k;
                                                        #   greedy_ids[k+1] = argmax(greedy_logits[k])
      ...metadata keys (ignored by compare_logits.py)
    }

Greedy decoding runs exactly N steps through the KV cache (past_key_values) and never stops at EOS.
argmax ties go to the lowest token id.

Architectures: llama, mistral, qwen2 (transformers' own classes), qwen3 (qwen3_adapter.py: the
pinned transformers 4.49 predates Qwen3 and newer releases need torch >= 2).
"""

import argparse
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def fail(msg: str) -> "NoReturn":  # noqa: F821
    print(f"hf_reference: error: {msg}", file=sys.stderr)
    sys.exit(2)


def load_model(model_dir: str):
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    cfg_path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(cfg_path):
        fail(f"{cfg_path}: not found")
    with open(cfg_path) as f:
        raw = json.load(f)
    model_type = raw.get("model_type")

    if model_type in ("llama", "mistral", "qwen2"):
        config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
        cls = AutoModelForCausalLM
    elif model_type == "qwen3":
        from qwen3_adapter import Qwen3ForCausalLM, qwen3_config
        config = qwen3_config(raw)
        cls = Qwen3ForCausalLM
    else:
        fail(f"{cfg_path}: model_type {model_type!r} not supported (llama, mistral, qwen2, qwen3)")

    if model_type in ("qwen2", "qwen3"):
        # transformers 4.49's Qwen2 mask applies config.sliding_window to every layer whenever it is
        # set, even with use_sliding_window false (which real Qwen2/Qwen3 configs carry alongside a
        # sliding_window number). The model's semantics are "no window" then, so say so.
        if not getattr(config, "use_sliding_window", False):
            config.sliding_window = None
        elif getattr(config, "max_window_layers", 0) != 0:
            fail(f"{cfg_path}: use_sliding_window with max_window_layers != 0 is not reproduced "
                 "faithfully by transformers 4.49's eager attention")

    model, info = cls.from_pretrained(model_dir, config=config, torch_dtype=torch.float32,
                                      attn_implementation="eager", local_files_only=True,
                                      output_loading_info=True)
    # A tensor missing from the files would be silently random-initialized: refuse instead.
    missing = [k for k in info.get("missing_keys", []) if not (
        k == "lm_head.weight" and getattr(model.config, "tie_word_embeddings", False))]
    problems = {"missing": missing, "unexpected": list(info.get("unexpected_keys", [])),
                "mismatched": [str(m) for m in info.get("mismatched_keys", [])]}
    if any(problems.values()):
        fail(f"{model_dir}: weights do not match the {type(model).__name__} built from config.json: {problems}")
    model.eval()
    return model, model_type


def rows(t) -> list:
    # float32 -> Python float is exact; json writes the shortest repr that round-trips.
    return [[float(x) for x in r] for r in t.tolist()]


def argmax(row) -> int:
    import torch
    m = torch.max(row)
    return int(torch.nonzero(row == m)[0].item())  # lowest id among equal maxima


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="Hugging Face model directory")
    ap.add_argument("--ids", required=True, help='prompt token ids, e.g. "1 2 3" (spaces or commas)')
    ap.add_argument("--greedy", type=int, default=0, help="greedy continuation length N")
    ap.add_argument("--out", required=True, help="output JSON file")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = ap.parse_args()

    try:
        ids = [int(t) for t in args.ids.replace(",", " ").split()]
    except ValueError:
        fail(f"--ids {args.ids!r}: not a list of integers")
    if not ids:
        fail("--ids: empty prompt")
    if args.greedy < 0:
        fail("--greedy must be >= 0")

    import torch
    import transformers
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    model, model_type = load_model(args.model)
    vocab = model.config.vocab_size
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        fail(f"--ids: {bad[:5]} out of range for vocab_size {vocab}")

    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=True)
        prompt_logits = out.logits[0].float()
        past = out.past_key_values
        greedy_ids, greedy_logits = [], []
        nxt = argmax(prompt_logits[-1])
        for _ in range(args.greedy):
            greedy_ids.append(nxt)
            out = model(input_ids=torch.tensor([[nxt]], dtype=torch.long), past_key_values=past, use_cache=True)
            past = out.past_key_values
            row = out.logits[0, -1].float()
            greedy_logits.append(row)
            nxt = argmax(row)

    result = {
        "prompt_logits": rows(prompt_logits),
        "greedy_ids": greedy_ids,
        "greedy_logits": rows(torch.stack(greedy_logits)) if greedy_logits else [],
        "ids": ids,
        "model_type": model_type,
        "producer": f"transformers {transformers.__version__}, torch {torch.__version__}, float32, eager",
    }
    with open(args.out, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
