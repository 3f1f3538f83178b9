#!/usr/bin/env python3
"""Oracle for the Gemma 3 270M real-model test (tests/model/test_gemma3.cpp): llama.cpp's token
ids and greedy continuations on gemma-3-270m-q4_k_m.gguf, written to
tests/model/data/gemma3_llamacpp.json.

    tools/oracle/gemma3_llamacpp.py --gguf /path/gemma-3-270m-q4_k_m.gguf \
        --bin /path/llama.cpp/build/bin [--out tests/model/data/gemma3_llamacpp.json]

Runs llama-tokenize (-p TEXT --ids --no-escape: BOS added, special tokens parsed, as llama-simple does) on
every text of TOKENIZE and on every prompt, and llama-simple (-n 32: greedy sampler,
stops early at an end-of-generation token) on every prompt of PROMPTS. llama-simple prints the
prompt's pieces (special tokens as text: "<bos>") and then the generated pieces on stdout; the
generated text is what follows the echoed prompt.
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys

TOKENIZE = [
    "Hello world",
    "Hello, world! How are you today?",
    " leading space and  double  spaces",
    "trailing space ",
    "line one\nline two\n\nparagraph\n\n\n",
    "\ttabs\tand\r\nCRLF",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < 10; ++i) { printf(\"%d\\n\", i); }",
    "The year 2024 had 366 days; 3.14159 is pi, 1e-6 is small.",
    "Ünïcödé: naïve café, São Paulo, Zürich",
    "日本語のテキストと中文文本",
    "Emoji 🙂🚀 and symbols ∑∫√ ≠ ≤",
    "Привет, мир! Γειά σου κόσμε",
    "مرحبا بالعالم",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "URL: https://example.com/path?q=1&b=two#frag",
    "    indented    text    ",
    "ALL CAPS AND lowercase MiXeD",
    "a",
    "\U0001f600\U0001f923 rare: \u2603 \U00010348 \x7f",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
]

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
]

N_PREDICT = 32


def run(cmd):
    r = subprocess.run(cmd, capture_output=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {r.returncode}\n{r.stderr.decode(errors='replace')[-2000:]}")
    return r.stdout


def tokenize(bin_dir, gguf, text):
    out = run([os.path.join(bin_dir, "llama-tokenize"), "-m", gguf, "-p", text, "--ids", "--no-escape", "--log-disable"])
    line = out.decode().strip().splitlines()[-1]
    return json.loads(line)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--bin", required=True, help="llama.cpp build/bin with llama-tokenize and llama-simple")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "../../tests/model/data/gemma3_llamacpp.json"))
    a = ap.parse_args()
    h = hashlib.sha256()
    with open(a.gguf, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    data = {
        "model": os.path.basename(a.gguf),
        "sha256": h.hexdigest(),
        "generator": "tools/oracle/gemma3_llamacpp.py (llama.cpp llama-tokenize --ids, llama-simple -n %d)" % N_PREDICT,
        "tokenize": [{"text": t, "ids": tokenize(a.bin, a.gguf, t)} for t in TOKENIZE],
        "generate": [],
    }
    for p in PROMPTS:
        out = run([os.path.join(a.bin, "llama-simple"), "-m", a.gguf, "-n", str(N_PREDICT), p]).decode("utf-8")
        echo = "<bos>" + p
        if not out.startswith(echo):
            sys.exit(f"llama-simple output does not start with the echoed prompt {echo!r}: {out[:200]!r}")
        text = out[len(echo):]
        if text.endswith("\n"):
            text = text[:-1]  # llama-simple's final newline
        data["generate"].append({"prompt": p, "prompt_ids": tokenize(a.bin, a.gguf, p), "n_predict": N_PREDICT,
                                 "text": text})
        print(f"{p!r} -> {text!r}")
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote", a.out)


if __name__ == "__main__":
    main()
