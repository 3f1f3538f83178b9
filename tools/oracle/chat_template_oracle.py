#!/usr/bin/env python3
"""Golden chat prompts rendered by Hugging Face transformers, for tests/chat (test_chat).

Renders each template over a set of conversations with transformers' own Jinja environment
(transformers.utils.chat_template_utils._compile_jinja_template: trim_blocks, lstrip_blocks,
loopcontrols, its tojson, raise_exception, strftime_now) and, for the real tokenizers, checks
that tokenizer.apply_chat_template(..., tokenize=False) gives the same string. Writes
tests/chat/data/golden.json; the C++ test needs no Python at run time.

Regenerate (from the repository root, after scripts/install-deps.sh):
    .venv/bin/python tools/oracle/chat_template_oracle.py
"""
import argparse
import datetime
import json
import os
import sys

from transformers import AutoTokenizer
from transformers.utils.chat_template_utils import _compile_jinja_template

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "chat", "data")
SHARED = os.environ.get("KVBOOST_SHARED_DIR", os.path.join(ROOT, "..", "shared"))
# strftime_now() in every case renders this instant (the C++ test injects the same).
NOW = datetime.datetime(2025, 3, 7, 14, 5, 9)

SYS = {"role": "system", "content": "You are a terse assistant."}
U1 = {"role": "user", "content": "What is the capital of France?"}
A1 = {"role": "assistant", "content": "Paris."}
U2 = {"role": "user", "content": "And of Italy?"}
TRICKY = {"role": "user", "content": "  Héllo 世界 🙂\n\tline two {{ not_a_tag }} {% raw %} \"dq\" 'sq' \\ back\\slash <|im_end|>\n\n"}
EMPTY = {"role": "user", "content": ""}

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name, e.g. Zürich"},
                           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        },
    },
}]
TOOL_CALL = {"role": "assistant", "content": "",
             "tool_calls": [{"type": "function", "function": {"name": "get_weather",
                                                              "arguments": {"city": "Zürich", "unit": "celsius", "n": 2, "x": 1.5}}}]}
TOOL_RESULT = {"role": "tool", "content": "{\"temp\": 21}"}

COMMON = [
    ("system_user_gen", [SYS, U1], True, {}),
    ("user_only_gen", [U1], True, {}),
    ("user_only_nogen", [U1], False, {}),
    ("multi_turn_gen", [SYS, U1, A1, U2], True, {}),
    ("multi_turn_nogen", [SYS, U1, A1, U2], False, {}),
    ("assistant_last", [U1, A1], False, {}),
    ("special_chars", [SYS, TRICKY], True, {}),
    ("empty_content", [EMPTY], True, {}),
]

QWEN3_EXTRA = [
    ("reasoning_content_last", [U1, {"role": "assistant", "content": "Paris.", "reasoning_content": "\nThe user asks about France.\n"}], False, {}),
    ("think_in_content_history", [U1, {"role": "assistant", "content": "<think>\nEasy one.\n</think>\n\nParis."}, U2], True, {}),
    ("think_in_content_last", [U1, {"role": "assistant", "content": "<think>\nEasy one.\n</think>\n\nParis."}], False, {}),
    ("enable_thinking_false", [U1], True, {"enable_thinking": False}),
    ("enable_thinking_true", [U1], True, {"enable_thinking": True}),
    ("multi_step_tool", [SYS, U1, TOOL_CALL, TOOL_RESULT, TOOL_RESULT,
                         {"role": "assistant", "content": "<think>got it</think>It is 21 degrees."}], True, {}),
    ("tool_response_user", [U1, {"role": "user", "content": "<tool_response>x</tool_response>"}], True, {}),
]

MISTRAL_EXTRA = [
    ("bad_alternation", [U1, U2], True, {}),
    ("bad_role", [U1, {"role": "tool", "content": "x"}], True, {}),
    ("system_folded_multi", [SYS, U1, A1, U2], False, {}),
]

QWEN25_EXTRA = [
    ("tools", [SYS, U1, TOOL_CALL, TOOL_RESULT], True, {"tools": TOOLS}),
    ("tools_no_system", [U1], True, {"tools": TOOLS}),
    ("tool_results_no_tools", [U1, TOOL_CALL, TOOL_RESULT, TOOL_RESULT], True, {}),
]

LLAMA31_EXTRA = [
    ("tools_indent", [SYS, U1], True, {"tools": TOOLS}),
    ("date_string_kwarg", [U1], True, {"date_string": "26 Jul 2024"}),
]

# Real model templates (tests/chat/data/real/, copied from the llama.cpp sources vendored in the
# llama-cpp-python sdist on PyPI, models/templates/): the whole tool round trip as OpenAI clients
# send it (call ids Mistral accepts: 9 letters and digits; arguments as objects).
CALL_ID = "a1B2c3D4e"
TOOL_CALL_ID = {"role": "assistant", "content": "",
                "tool_calls": [{"id": CALL_ID, "type": "function",
                                "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}}]}
TOOL_RESULT_ID = {"role": "tool", "tool_call_id": CALL_ID, "name": "get_weather", "content": "{\"temp\": 21}"}
A_AFTER_TOOL = {"role": "assistant", "content": "It is 21 degrees in Zürich."}
REAL_TOOLS = [
    ("tools_gen", [SYS, U1], True, {"tools": TOOLS}),
    ("tools_user_only", [U1], True, {"tools": TOOLS}),
    ("tool_round_trip", [SYS, U1, TOOL_CALL_ID, TOOL_RESULT_ID], True, {"tools": TOOLS}),
    ("tool_round_trip_then_user", [SYS, U1, TOOL_CALL_ID, TOOL_RESULT_ID, A_AFTER_TOOL, U2], True, {"tools": TOOLS}),
]
REAL = [
    # (name, file, special tokens, extra cases)
    ("llama3.1-real", "real/meta-llama-Llama-3.1-8B-Instruct.jinja",
     {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}, REAL_TOOLS + LLAMA31_EXTRA),
    ("llama3.2-real", "real/meta-llama-Llama-3.2-3B-Instruct.jinja",
     {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}, REAL_TOOLS),
    ("mistral-nemo-real", "real/mistralai-Mistral-Nemo-Instruct-2407.jinja",
     {"bos_token": "<s>", "eos_token": "</s>"}, REAL_TOOLS),
    ("mistral-small-3.2-real", "real/Mistral-Small-3.2-24B-Instruct-2506.jinja",
     {"bos_token": "<s>", "eos_token": "</s>"}, REAL_TOOLS),
    ("devstral-small-2507-real", "real/unsloth-mistral-Devstral-Small-2507.jinja",
     {"bos_token": "<s>", "eos_token": "</s>"}, REAL_TOOLS),
    ("ministral-3-2512-real", "real/mistralai-Ministral-3-14B-Reasoning-2512.jinja",
     {"bos_token": "<s>", "eos_token": "</s>"}, REAL_TOOLS),
    ("hermes3-real", "real/NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
     {"bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>"}, REAL_TOOLS),
    ("qwen2.5-real", "real/Qwen-Qwen2.5-7B-Instruct.jinja", {"eos_token": "<|im_end|>"}, REAL_TOOLS),
    ("qwen3-real", "real/Qwen-Qwen3-0.6B.jinja", {"eos_token": "<|im_end|>"}, REAL_TOOLS),
]


def render_env(source, messages, add_gen, kwargs, special):
    tmpl = _compile_jinja_template(source)
    tmpl.globals["strftime_now"] = lambda fmt: NOW.strftime(fmt)
    ctx = {"tools": None, "documents": None}
    ctx.update(special)
    ctx.update(kwargs)
    return tmpl.render(messages=messages, add_generation_prompt=add_gen, **ctx)


def run_case(name, source, messages, add_gen, kwargs, special, tokenizer=None):
    case = {"name": name, "messages": messages, "add_generation_prompt": add_gen, "kwargs": kwargs}
    try:
        out = render_env(source, messages, add_gen, kwargs, special)
    except Exception as e:  # raise_exception(): the C++ side must raise with this message
        case["error"] = str(e)
        return case
    if tokenizer is not None:
        kw = dict(kwargs)
        tools = kw.pop("tools", None)
        via_tok = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                                add_generation_prompt=add_gen, **kw)
        assert via_tok == out, f"{name}: apply_chat_template differs from the compiled template"
    case["expected"] = out
    return case


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(DATA, "golden.json"))
    args = ap.parse_args()

    templates = []

    def add_shared(name, tok_dir, rel_source, extra):
        path = os.path.join(SHARED, tok_dir)
        tok = AutoTokenizer.from_pretrained(path)
        cfg = json.load(open(os.path.join(path, "tokenizer_config.json"), encoding="utf-8"))
        if rel_source.endswith(".jinja"):
            source = open(os.path.join(path, os.path.basename(rel_source)), encoding="utf-8").read()
        else:
            source = cfg["chat_template"]
        special = {k: v for k, v in tok.special_tokens_map.items() if isinstance(v, str)}
        cases = [run_case(n, source, m, g, k, special, tok) for n, m, g, k in COMMON + extra]
        templates.append({"name": name, "shared": rel_source, "special_tokens": special, "cases": cases})

    def add_own(name, file, special, extra, common=True):
        source = open(os.path.join(DATA, file), encoding="utf-8").read()
        cases = [run_case(n, source, m, g, k, special) for n, m, g, k in (COMMON if common else []) + extra]
        templates.append({"name": name, "file": file, "special_tokens": special, "cases": cases})

    add_shared("qwen2.5", "tokenizers/qwen2.5", "tokenizers/qwen2.5/tokenizer_config.json", QWEN25_EXTRA)
    add_shared("qwen2.5-jinja-file", "tokenizers/qwen2.5", "tokenizers/qwen2.5/chat_template.jinja", [])
    add_shared("llama3", "tokenizers/llama3", "tokenizers/llama3/tokenizer_config.json", [])
    add_own("chatml", "chatml.jinja", {"eos_token": "<|im_end|>"}, [])
    add_own("mistral_style", "mistral_style.jinja", {"bos_token": "<s>", "eos_token": "</s>"}, MISTRAL_EXTRA)
    add_own("qwen3_style", "qwen3_style.jinja", {"eos_token": "<|im_end|>"}, QWEN3_EXTRA)
    add_own("llama31_style", "llama31_style.jinja", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}, LLAMA31_EXTRA)
    for name, file, special, extra in REAL:
        # Hermes 3's tool_use template is the one for requests with tools (it iterates them).
        add_own(name, file, special, extra, common=not name.startswith("hermes"))

    doc = {"generator": "tools/oracle/chat_template_oracle.py",
           "now": NOW.isoformat(), "templates": templates}
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n = sum(len(t["cases"]) for t in templates)
    print(f"wrote {n} cases for {len(templates)} templates to {args.out}")


if __name__ == "__main__":
    sys.exit(main())
