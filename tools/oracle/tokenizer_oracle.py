#!/usr/bin/env python3
"""Differential-test oracle for the KVBoost tokenizer.

For each tokenizer directory given, encodes thousands of deterministic random strings with the
Hugging Face `tokenizers` library (PyPI, pinned to 0.21.1 in scripts/install-deps.sh) and writes
the ids (with and without special tokens) and the decoded texts to one JSON file, which
tests/tokenizer/test_tokenizer_diff.cpp compares against our implementation.

    tokenizer_oracle.py --out FILE [--n 3000] [--seed 1234] NAME=DIR [NAME=DIR ...]

When `tokenizers` cannot be imported, writes {"skip": "<reason>"} and exits 0 so that the C++
side can skip (or fail, with KVBOOST_REQUIRE_ORACLES=1) with that message.
"""
import argparse
import json
import os
import random
import sys

WORDS = ("the quick brown fox jumps over lazy dog Hello World once upon a time there was little girl "
         "named Lily she loved play outside park token cache prefix reuse engine model layer value "
         "don't can't I'm we've they'll it's HTTP JSON UTF API tokenizer Qwen Llama ÉCOLE naïve café "
         "straße Ωmega").split()
CODE = ["def f(x):\n    return x**2\n", "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
        "if x != None and y >= 3:", "#include <vector>", "std::vector<int32_t> ids;", "x = [1, 2, 3]",
        "print(f\"{name!r}: {value:.3f}\")", "a->b && c || !d", "/* comment */", "// TODO: fix",
        "SELECT * FROM t WHERE id=42;", "<div class=\"x\">hi</div>", "$HOME/.cache", "~/src/main.rs",
        "0x7fff_ffff", "1e-5", "...", "--flag=value", "'''docstring'''", "`code`"]
EMOJI = ["😀", "👍", "🎉", "🚀", "❤️", "🔥", "🤖", "🐍", "🍕", "✅", "⭐", "☕"]
SKIN = ["🏻", "🏼", "🏽", "🏾", "🏿"]
ZWJ = ["👨\u200d👩\u200d👧\u200d👦", "👩\u200d💻", "🏳️\u200d🌈", "👨🏽\u200d🚀", "🧑\u200d🤝\u200d🧑"]
FLAGS = ["🇺🇸", "🇯🇵", "🇩🇪", "🇧🇷", "🇮🇳"]
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "<unk>", "<|begin_of_text|>",
            "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|im_", "<|", "|>", "<0x41>"]
SPACES = [" ", "  ", "   ", "      ", "\t", "\t\t", "\n", "\n\n", "\r\n", " \n", "\n ", " \t ", "\u00a0",
          "\u3000", "\u2003", "\r", "\x0b", "\x0c"]


def rand_range(r, lo, hi, n):
    return "".join(chr(r.randint(lo, hi)) for _ in range(n))


def piece(r):
    k = r.random()
    if k < 0.25:
        w = r.choice(WORDS)
        return w.upper() if r.random() < 0.1 else (w.capitalize() if r.random() < 0.2 else w)
    if k < 0.35:
        return r.choice(CODE)
    if k < 0.47:
        return r.choice(SPACES)
    if k < 0.53:
        return "".join(r.choice("0123456789") for _ in range(r.randint(1, 12)))
    if k < 0.60:
        return rand_range(r, 0x4E00, 0x9FA5, r.randint(1, 6))  # CJK
    if k < 0.63:
        return rand_range(r, 0x3041, 0x30F6, r.randint(1, 5))  # kana
    if k < 0.65:
        return rand_range(r, 0xAC00, 0xD7A3, r.randint(1, 4))  # Hangul
    if k < 0.71:
        c = r.random()
        if c < 0.4:
            return r.choice(EMOJI)
        if c < 0.6:
            return r.choice(["👍", "👋", "🤝", "👏"]) + r.choice(SKIN)
        if c < 0.8:
            return r.choice(ZWJ)
        return r.choice(FLAGS)
    if k < 0.75:  # combining marks on Latin letters
        return "".join(r.choice("aeiouncAEO") + chr(r.randint(0x300, 0x36F)) * r.randint(1, 2)
                       for _ in range(r.randint(1, 3)))
    if k < 0.78:
        return rand_range(r, 0x0621, 0x064A, r.randint(2, 6))  # Arabic
    if k < 0.80:
        return rand_range(r, 0x05D0, 0x05EA, r.randint(2, 6))  # Hebrew
    if k < 0.82:
        return rand_range(r, 0x0905, 0x0939, r.randint(1, 3)) + chr(r.choice([0x093F, 0x0940, 0x094D, 0x0902]))
    if k < 0.88:
        return r.choice(SPECIALS)
    if k < 0.94:
        return "".join(r.choice("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") for _ in range(r.randint(1, 4)))
    if k < 0.97:
        return r.choice(["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "’s"])
    # random BMP / astral code points (no surrogates, no private use)
    out = []
    for _ in range(r.randint(1, 3)):
        while True:
            cp = r.randint(0x20, 0x2FFFF)
            if not (0xD800 <= cp <= 0xF8FF):
                break
        out.append(chr(cp))
    return "".join(out)


def make_strings(n, seed):
    r = random.Random(seed)
    out = ["", " ", "a", "\n", "Hello, world!", "<|im_start|>user\nhi<|im_end|>"]
    while len(out) < n:
        k = r.randint(1, 12)
        sep = r.random() < 0.6
        out.append((" " if sep else "").join(piece(r) for _ in range(k)))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--n-decode", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("tokenizers", nargs="+", help="NAME=DIR with DIR/tokenizer.json")
    args = ap.parse_args()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    try:
        import tokenizers
        from tokenizers import Tokenizer
    except Exception as e:  # noqa: BLE001
        with open(args.out, "w") as f:
            json.dump({"skip": f"Python package 'tokenizers' unavailable in {sys.executable}: {e}"}, f)
        print(f"skip: tokenizers unavailable: {e}")
        return 0

    strings = make_strings(args.n, args.seed)
    result = {"tokenizers_version": tokenizers.__version__, "tokenizers": {}}
    for spec in args.tokenizers:
        name, _, d = spec.partition("=")
        path = os.path.join(d, "tokenizer.json")
        if not os.path.exists(path):
            result["tokenizers"][name] = {"dir": d, "missing": True}
            continue
        tok = Tokenizer.from_file(path)
        plain = tok.encode_batch(strings, add_special_tokens=False)
        special = tok.encode_batch(strings, add_special_tokens=True)
        plain_ids = [e.ids for e in plain]
        special_ids = [e.ids for e in special]
        decoded = tok.decode_batch(plain_ids, skip_special_tokens=False)
        decoded_skip = tok.decode_batch(special_ids, skip_special_tokens=True)
        cases = [{"text": s, "ids": a, "ids_special": b, "decoded": c, "decoded_skip": e}
                 for s, a, b, c, e in zip(strings, plain_ids, special_ids, decoded, decoded_skip)]
        # Random id sequences exercise lossy UTF-8 decoding and byte fallback.
        r = random.Random(args.seed + 1)
        vs = tok.get_vocab_size(with_added_tokens=True)
        id_lists = [[r.randrange(vs) for _ in range(r.randint(1, 12))] for _ in range(args.n_decode)]
        decode_cases = [{"ids": ids, "text": tok.decode(ids, skip_special_tokens=False),
                         "text_skip": tok.decode(ids, skip_special_tokens=True)} for ids in id_lists]
        result["tokenizers"][name] = {"dir": d, "cases": cases, "decode_cases": decode_cases}
        print(f"{name}: {len(cases)} strings, {len(decode_cases)} decode cases")
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, ensure_ascii=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
