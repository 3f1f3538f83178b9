#!/usr/bin/env python3
"""GGUF fixtures for KVBoost's tests, written with the `gguf` package (llama.cpp's own writer).

  model   --src DIR --out FILE.gguf --type T [--ref-out DIR]
          Converts a safetensors model directory (as `kvboost-fixture --dtype f32` writes it) to
          GGUF the way llama.cpp's convert_hf_to_gguf.py does (tensor names, metadata, Q/K row
          permutation for `llama`), storing matrices as T: f32 f16 bf16 q8_0 q4_0 q4_k q5_k q6_k
          or q4_k_m (Q4_K with Q6_K for attn_v, ffn_down and output, like llama.cpp's Q4_K_M; rows
          that are not whole 256-blocks fall back as llama.cpp's quantizer does: Q5_0 / Q8_0).
          --ref-out writes a copy of the model directory whose weights are the gguf package's
          dequantization of what was stored: the exact reference for the GGUF model's logits.
  tokenizer --src DIR --out FILE.gguf [--pre NAME] [--n-vocab N]
          A GGUF holding only the tokenizer of DIR (tokenizer.json, tokenizer_config.json) as
          tokenizer.ggml.* metadata, the way convert_hf_to_gguf.py writes it (see add_tokenizer).
          `model --tokenizer` embeds the same into a model file.
  tokenizers --fixture BIN --shared DIR --out DIR
          Tokenizer GGUFs of the shared Qwen2.5 / Llama 3 / stories260K tokenizers and of the two
          generated fixture tokenizers, plus DIR/manifest.json {name: {src, gguf}} for
          tests/model/test_gguf_tokenizer.cpp.
  dequant --out FILE.gguf
          Random tensors of every supported type, each followed by "<name>.ref": the gguf
          package's dequantization of it in F32 (the oracle for the C++ dequant kernels).
  suite   --fixture BIN --out DIR
          Everything tests/model/test_gguf.cpp needs, plus DIR/manifest.json describing it.

The gguf package quantizes Q8_0/Q4_0/Q5_0 like ggml; it has no K-quant quantizer, so q4_k/q5_k/q6_k
use the simple (not error-optimal) one below, whose output the package's dequantizer reads back.
Exit status 77 when numpy / gguf / safetensors are missing.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

try:
    import numpy as np
    import gguf
    from gguf import GGMLQuantizationType as QT
    from safetensors.numpy import load_file, save_file
except ImportError as e:  # pragma: no cover
    print(f"skip: {e}", file=sys.stderr)
    sys.exit(77)

QK_K = 256


def _f16(x):
    return x.astype(np.float16)


def quantize_q4_k(x, five=False):
    levels = 31 if five else 15
    nb = x.size // QK_K
    sub = x.reshape(nb, 8, 32).astype(np.float32)
    mn = np.minimum(sub.min(-1), 0)
    scale = (sub.max(-1) - mn) / levels
    mins = -mn
    d = _f16(scale.max(-1) / 63)
    dmin = _f16(mins.max(-1) / 63)
    df, dminf = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(df > 0, np.round(scale / df), 0).clip(0, 63).astype(np.uint8)
        m = np.where(dminf > 0, np.round(mins / dminf), 0).clip(0, 63).astype(np.uint8)
        es = (df * sc)[..., None]
        em = (dminf * m)[..., None]
        q = np.where(es > 0, np.round((sub + em) / es), 0).clip(0, levels).astype(np.uint8)
    scales = np.zeros((nb, 12), np.uint8)
    for j in range(4):
        scales[:, j] = (sc[:, j] & 63) | ((sc[:, j + 4] >> 4) << 6)
        scales[:, j + 4] = (m[:, j] & 63) | ((m[:, j + 4] >> 4) << 6)
        scales[:, j + 8] = (sc[:, j + 4] & 0xF) | ((m[:, j + 4] & 0xF) << 4)
    ql = q & 0xF
    qs = (ql[:, 0::2, :] | (ql[:, 1::2, :] << 4)).reshape(nb, 128)
    parts = [d.view(np.uint8).reshape(nb, 2), dmin.view(np.uint8).reshape(nb, 2), scales]
    if five:
        qh = np.zeros((nb, 32), np.uint8)
        for j in range(8):
            qh |= ((q[:, j, :] >> 4) & 1) << j
        parts.append(qh)
    parts.append(qs)
    return np.concatenate(parts, axis=1)


def quantize_q6_k(x):
    nb = x.size // QK_K
    sub = x.reshape(nb, 16, 16).astype(np.float32)
    scale = np.abs(sub).max(-1) / 31
    d = _f16(scale.max(-1) / 127)
    df = d.astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(df > 0, np.round(scale / df), 0).clip(-128, 127).astype(np.int8)
        es = (df * sc)[..., None]
        q = np.where(es != 0, np.round(sub / es), 0).clip(-32, 31).astype(np.int16) + 32
    q = q.reshape(nb, 256).astype(np.uint8)
    ql = np.zeros((nb, 128), np.uint8)
    qh = np.zeros((nb, 64), np.uint8)
    for h in range(2):
        for k in range(4):
            v = q[:, 128 * h + 32 * k: 128 * h + 32 * k + 32]
            lo = 64 * h + 32 * (k % 2)
            ql[:, lo:lo + 32] |= (v & 0xF) << (4 * (k // 2))
            qh[:, 32 * h: 32 * h + 32] |= (v >> 4) << (2 * k)
    return np.concatenate([ql, qh, sc.view(np.uint8), d.view(np.uint8).reshape(nb, 2)], axis=1)


TYPES = {"f32": QT.F32, "f16": QT.F16, "bf16": QT.BF16, "q8_0": QT.Q8_0, "q4_0": QT.Q4_0,
         "q4_k": QT.Q4_K, "q5_k": QT.Q5_K, "q6_k": QT.Q6_K}


def quantize(x, qt):
    """x: float32 [rows, cols] -> (stored array, raw_dtype or None)."""
    if qt == QT.F32:
        return x.astype(np.float32), None
    if qt == QT.F16:
        return x.astype(np.float16), None
    if qt in (QT.BF16, QT.Q8_0, QT.Q4_0, QT.Q5_0):
        return gguf.quants.quantize(x, qt), qt
    rows = x.reshape(-1, x.shape[-1])
    if qt == QT.Q6_K:
        blocks = quantize_q6_k(rows)
    else:
        blocks = quantize_q4_k(rows, five=(qt == QT.Q5_K))
    return blocks.reshape(x.shape[0], -1), qt


def dequantize(stored, qt):
    if qt is None:
        return stored.astype(np.float32)
    return gguf.quants.dequantize(stored, qt).astype(np.float32)


def permute(w, n_head):
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute (rows of Q/K, or a bias)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def unpermute(w, n_head):
    return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


HF_TO_GGUF = [
    ("input_layernorm.weight", "attn_norm.weight"),
    ("post_attention_layernorm.weight", "ffn_norm.weight"),
    ("self_attn.q_proj.weight", "attn_q.weight"), ("self_attn.k_proj.weight", "attn_k.weight"),
    ("self_attn.v_proj.weight", "attn_v.weight"), ("self_attn.o_proj.weight", "attn_output.weight"),
    ("self_attn.q_proj.bias", "attn_q.bias"), ("self_attn.k_proj.bias", "attn_k.bias"),
    ("self_attn.v_proj.bias", "attn_v.bias"), ("self_attn.o_proj.bias", "attn_output.bias"),
    ("self_attn.q_norm.weight", "attn_q_norm.weight"), ("self_attn.k_norm.weight", "attn_k_norm.weight"),
    ("mlp.gate_proj.weight", "ffn_gate.weight"), ("mlp.up_proj.weight", "ffn_up.weight"),
    ("mlp.down_proj.weight", "ffn_down.weight"),
]


def gguf_name(hf):
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    parts = hf.split(".")
    if parts[:2] == ["model", "layers"]:
        rest = ".".join(parts[3:])
        for a, b in HF_TO_GGUF:
            if rest == a:
                return f"blk.{parts[2]}.{b}"
    raise ValueError(f"no GGUF name for {hf}")


def type_for(gname, shape, qtype_name, tied=False):
    if len(shape) == 1:
        return QT.F32  # norms and biases stay F32, as llama.cpp keeps them
    if qtype_name == "q4_k_m":
        # the output projection (token_embd when the embeddings are tied) Q6_K, as llama-quantize does
        head = gname == "output.weight" or (tied and gname == "token_embd.weight")
        qt = QT.Q6_K if head or gname.endswith(("attn_v.weight", "ffn_down.weight")) else QT.Q4_K
    else:
        qt = TYPES[qtype_name]
    # Rows that are not whole blocks: llama.cpp's tensor_type_fallback (llama-quant.cpp, as vendored
    # by llama-cpp-python 0.3.36) demotes a 256-block K-quant to the 32-block type beside it
    # (Q4_K -> Q5_0, Q6_K -> Q8_0; Q5_K -> Q5_1, which kvboost does not read: F16 here), and
    # anything still not whole to F16.
    if shape[-1] % gguf.GGML_QUANT_SIZES[qt][0] != 0:
        qt = {QT.Q4_K: QT.Q5_0, QT.Q6_K: QT.Q8_0}.get(qt, QT.F16)
        if shape[-1] % gguf.GGML_QUANT_SIZES[qt][0] != 0:
            qt = QT.F16
    return qt


# Split regexes of the pre-tokenizers llama.cpp names (its converter recognizes them by hashing
# sample tokenizations; here the regex in tokenizer.json says it directly).
PRE_REGEX = {
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+": "qwen2",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+": "llama-bpe",
}


def detect_pre(tj):
    pre = tj.get("pre_tokenizer") or {}
    for p in pre.get("pretokenizers", [pre]):
        if p.get("type") == "Split" and p.get("pattern", {}).get("Regex") in PRE_REGEX:
            return PRE_REGEX[p["pattern"]["Regex"]]
        if p.get("type") == "ByteLevel" and p.get("use_regex", True):
            return "gpt-2"
    raise SystemExit("unrecognized pre-tokenizer: pass --pre")


def looks_special(t):
    """convert_hf_to_gguf.py TextModel.does_token_look_special."""
    return (t in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (t.startswith("<|") and t.endswith("|>"))
            or (t.startswith("<\uff5c") and t.endswith("\uff5c>")) or (t.startswith("<unused") and t.endswith(">")))


def add_tokenizer(w, d, n_vocab=None, pre=None):
    """tokenizer.ggml.* from a Hugging Face tokenizer directory, as convert_hf_to_gguf.py writes them.

    Byte-level BPE (no byte_fallback) -> "gpt2": get_vocab_base (ids missing up to n_vocab become
    "[PAD<i>]" UNUSED; added tokens CONTROL when special or special-looking, else USER_DEFINED),
    the merges, tokenizer.ggml.pre. SentencePiece-style BPE (byte_fallback) -> "llama":
    _create_vocab_sentencepiece with the scores tokenizer.model would hold (-id for normal pieces,
    0 for the rest; its merges are then derivable from the scores), UNKNOWN/CONTROL/BYTE types.
    BOS/EOS/add_*_token/chat_template from gguf.SpecialVocab, as the converter does."""
    tj = json.load(open(os.path.join(d, "tokenizer.json"), encoding="utf-8"))
    m = tj["model"]
    vocab = dict(m["vocab"])
    added = {a["id"]: a for a in tj.get("added_tokens", [])}
    for a in added.values():
        vocab[a["content"]] = a["id"]
    rev = {i: t for t, i in vocab.items()}
    size = max(n_vocab or 0, max(rev) + 1)
    TT = gguf.TokenType
    spm = bool(m.get("byte_fallback"))
    tokens, types, scores = [], [], []
    for i in range(size):
        t = rev.get(i)
        score = 0.0
        if t is None:
            t, ty = f"[PAD{i}]", TT.UNUSED
        elif spm:
            if t == m.get("unk_token"):
                ty = TT.UNKNOWN
            elif i in added and added[i]["special"]:
                ty = TT.CONTROL
            elif i in added:
                ty = TT.USER_DEFINED
            elif len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
                ty = TT.BYTE
            else:
                ty, score = TT.NORMAL, -float(i)
        elif i in added:
            ty = TT.CONTROL if added[i]["special"] or looks_special(t) else TT.USER_DEFINED
        else:
            ty = TT.NORMAL
        tokens.append(t)
        types.append(ty)
        scores.append(score)
    w.add_tokenizer_model("llama" if spm else "gpt2")
    w.add_tokenizer_pre("default" if spm else (pre or detect_pre(tj)))
    w.add_token_list(tokens)
    if spm:
        w.add_token_scores(scores)
    w.add_token_types(types)
    if spm:
        norm = json.dumps(tj.get("normalizer")) + json.dumps(tj.get("pre_tokenizer"))
        w.add_add_space_prefix('"Prepend"' in norm or '"prepend_scheme": "always"' in norm
                               or '"prepend_scheme": "first"' in norm)
    gguf.SpecialVocab(d, load_merges=not spm, n_vocab=len(tokens)).add_to_gguf(w, quiet=True)


def convert_model(src, out, qtype_name, ref_out=None, tokenizer=False):
    cfg = json.load(open(os.path.join(src, "config.json")))
    tensors = load_file(os.path.join(src, "model.safetensors"))
    arch = cfg["model_type"]
    if arch not in ("llama", "qwen2", "qwen3"):
        raise SystemExit(f"unsupported model_type {arch}")
    n_head, n_kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // n_head
    w = gguf.GGUFWriter(out, arch)
    w.add_name(os.path.basename(os.path.normpath(src)))
    w.add_context_length(cfg.get("max_position_embeddings", 2048))
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_rope_dimension_count(head_dim)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
    w.add_rope_freq_base(cfg.get("rope_theta", 10000.0))
    if cfg.get("head_dim"):
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_vocab_size(cfg["vocab_size"])
    w.add_file_type(0 if qtype_name == "f32" else 1)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    if tokenizer:  # SpecialVocab also reads BOS/EOS from config.json
        add_tokenizer(w, src, cfg["vocab_size"])
    else:
        if cfg.get("bos_token_id") is not None:
            w.add_bos_token_id(cfg["bos_token_id"])
        eos = cfg.get("eos_token_id")
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        if eos is not None:
            w.add_eos_token_id(eos)
    ref = {}
    tied = not any(gguf_name(hf) == "output.weight" for hf in tensors)
    for hf, x in sorted(tensors.items()):
        g = gguf_name(hf)
        x = x.astype(np.float32)
        perm = arch == "llama" and g.endswith(("attn_q.weight", "attn_q.bias", "attn_k.weight", "attn_k.bias"))
        nh = n_head if "attn_q" in g else n_kv
        if perm:
            x = permute(x, nh)
        qt = type_for(g, x.shape, qtype_name, tied)
        stored, raw = quantize(x, qt)
        if raw is None:
            w.add_tensor(g, stored)
        else:
            w.add_tensor(g, stored, raw_dtype=raw)
        back = dequantize(stored, raw).reshape(x.shape)
        ref[hf] = unpermute(back, nh) if perm else back
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if ref_out:
        os.makedirs(ref_out, exist_ok=True)
        for f in os.listdir(src):
            if f.endswith(".json"):
                shutil.copy(os.path.join(src, f), ref_out)
        save_file({k: np.ascontiguousarray(v) for k, v in ref.items()}, os.path.join(ref_out, "model.safetensors"))


def write_dequant(out, seed=7):
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(out, "kvboost-dequant-test")
    for name, qt in TYPES.items():
        x = (rng.standard_normal((3, 512)) * rng.uniform(0.01, 4.0, (3, 1))).astype(np.float32)
        x[0, :40] = 0.0  # zero blocks / sub-blocks
        stored, raw = quantize(x, qt)
        if raw is None:
            w.add_tensor(name, stored)
        else:
            w.add_tensor(name, stored, raw_dtype=raw)
        back = dequantize(stored, raw)
        err = np.abs(back - x).max() / np.abs(x).max()
        if err > 0.2:
            raise SystemExit(f"{name}: quantizer round trip error {err:.3f}")
        w.add_tensor(name + ".ref", back)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# (name, kvboost-fixture flags, GGUF type, tolerance of max |logit diff| against the reference)
SUITE = [
    ("llama_f32", "--arch llama --hidden 64 --intermediate 192 --heads 8 --kv-heads 4 --no-tie", "f32"),
    ("llama_f32_tied", "--arch llama --hidden 64 --intermediate 192 --heads 8 --kv-heads 2 --tie", "f32"),
    ("qwen2_f32", "--arch qwen2 --hidden 64 --intermediate 192 --heads 8 --kv-heads 4 --no-tie", "f32"),
    ("qwen3_f32", "--arch qwen3 --hidden 64 --intermediate 192 --heads 4 --kv-heads 2 --head-dim 32", "f32"),
    ("llama_f16", "--arch llama --hidden 64 --intermediate 192 --heads 8 --kv-heads 4 --no-tie", "f16"),
    ("qwen2_bf16", "--arch qwen2 --hidden 64 --intermediate 192 --heads 8 --kv-heads 4", "bf16"),
    ("llama_q8_0", "--arch llama --hidden 64 --intermediate 192 --heads 8 --kv-heads 4 --no-tie", "q8_0"),
    ("qwen2_q8_0", "--arch qwen2 --hidden 64 --intermediate 192 --heads 8 --kv-heads 4 --no-tie", "q8_0"),
    ("llama_q4_0", "--arch llama --hidden 64 --intermediate 172 --heads 8 --kv-heads 4 --no-tie", "q4_0"),
    ("qwen2_q4_0", "--arch qwen2 --hidden 64 --intermediate 192 --heads 8 --kv-heads 4", "q4_0"),
    ("llama_q4_k_m", "--arch llama --hidden 256 --intermediate 512 --heads 4 --kv-heads 2 --no-tie", "q4_k_m"),
    ("qwen2_q4_k_m", "--arch qwen2 --hidden 256 --intermediate 512 --heads 4 --kv-heads 2 --no-tie", "q4_k_m"),
    ("qwen3_q5_k", "--arch qwen3 --hidden 256 --intermediate 512 --heads 4 --kv-heads 2", "q5_k"),
    ("llama_q6_k", "--arch llama --hidden 256 --intermediate 512 --heads 4 --kv-heads 2", "q6_k"),
]


def suite(fixture_bin, out):
    os.makedirs(out, exist_ok=True)
    cases = []
    for i, (name, flags, qt) in enumerate(SUITE):
        d = os.path.join(out, name)
        src, ref, g = d + "/src", d + "/ref", d + f"/{name}.gguf"
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        subprocess.run([fixture_bin, "--out", src, "--dtype", "f32", "--tokenizer-kind", "none", "--layers", "2",
                        "--seed", str(100 + i), *flags.split()], check=True,
                       stdout=subprocess.DEVNULL)
        convert_model(src, g, qt, ref)
        cases.append({"name": name, "type": qt, "src": src, "ref": ref, "gguf": g})
    write_dequant(os.path.join(out, "dequant.gguf"))
    json.dump({"cases": cases, "dequant": os.path.join(out, "dequant.gguf")},
              open(os.path.join(out, "manifest.json"), "w"), indent=1)
    print(f"wrote {len(cases)} GGUF models and dequant.gguf to {out}")


def write_tokenizer(src, out, n_vocab=None, pre=None):
    w = gguf.GGUFWriter(out, "llama")
    add_tokenizer(w, src, n_vocab, pre)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def tokenizer_suite(fixture_bin, shared, out, models=None):
    os.makedirs(out, exist_ok=True)
    # stories260K is committed in the repository's models/; the real tokenizers stay in ../shared.
    models = models or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models")
    srcs = {"qwen25": os.path.join(shared, "tokenizers/qwen2.5"), "llama3": os.path.join(shared, "tokenizers/llama3"),
            "stories260K": os.path.join(models, "stories260K")}
    for kind in ("bytelevel", "sentencepiece"):
        d = os.path.join(out, "fixture_" + kind + "_model")
        shutil.rmtree(d, ignore_errors=True)
        subprocess.run([fixture_bin, "--out", d, "--dtype", "f32", "--tokenizer-kind", kind, "--layers", "1"],
                       check=True, stdout=subprocess.DEVNULL)
        srcs["fixture_" + kind] = d
    manifest = {}
    for name, src in srcs.items():
        if not os.path.exists(os.path.join(src, "tokenizer.json")):
            print(f"skip {name}: {src} has no tokenizer.json", file=sys.stderr)
            continue
        g = os.path.join(out, name + ".gguf")
        write_tokenizer(src, g)
        manifest[name] = {"src": src, "gguf": g}
    json.dump(manifest, open(os.path.join(out, "manifest.json"), "w"), indent=1)
    print(f"wrote {len(manifest)} tokenizer GGUFs to {out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("model")
    m.add_argument("--src", required=True)
    m.add_argument("--out", required=True)
    m.add_argument("--type", default="f32", choices=sorted(TYPES) + ["q4_k_m"])
    m.add_argument("--ref-out")
    m.add_argument("--tokenizer", action="store_true", help="embed --src's tokenizer as tokenizer.ggml.*")
    t = sub.add_parser("tokenizer")
    t.add_argument("--src", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--pre")
    t.add_argument("--n-vocab", type=int)
    ts = sub.add_parser("tokenizers")
    ts.add_argument("--fixture", required=True)
    ts.add_argument("--shared", required=True)
    ts.add_argument("--out", required=True)
    ts.add_argument("--models", help="the repository's models/ (default: ../../models from this script)")
    d = sub.add_parser("dequant")
    d.add_argument("--out", required=True)
    s = sub.add_parser("suite")
    s.add_argument("--fixture", required=True)
    s.add_argument("--out", required=True)
    a = ap.parse_args()
    if a.cmd == "model":
        convert_model(a.src, a.out, a.type, a.ref_out, a.tokenizer)
    elif a.cmd == "tokenizer":
        write_tokenizer(a.src, a.out, a.n_vocab, a.pre)
    elif a.cmd == "tokenizers":
        tokenizer_suite(a.fixture, a.shared, a.out, a.models)
    elif a.cmd == "dequant":
        write_dequant(a.out)
    else:
        suite(a.fixture, a.out)


if __name__ == "__main__":
    main()
