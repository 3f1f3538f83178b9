#!/usr/bin/env python3
"""AWQ oracle for KVBoost's tests: an independent numpy dequantization of AutoAWQ "gemm" tensors.

  dequant --model DIR --out FILE.safetensors
          For every <prefix>.qweight / .qzeros / .scales triple of the model directory (single file
          or shards), writes <prefix>.weight = (q - z) * s as f32 [out_features, in_features]
          (nn.Linear layout). The unpacking follows AutoAWQ's awq/utils/packing_utils.py
          (unpack_awq + reverse_awq_order + dequantize_gemm): shifts 0, 4, ..., 28 along each
          int32, then AWQ_REVERSE_ORDER [0, 4, 1, 5, 2, 6, 3, 7] within each group of 8 columns,
          scales and zeros repeated group_size times along the input dimension. Arithmetic is f32
          (AutoAWQ's CPU fallback multiplies in f16; the f32 product is the exact value).
  suite   --fixture BIN --out DIR
          Writes AWQ fixture models with `kvboost-fixture --quant awq --dequant-out`, the numpy
          dequantization of each, and DIR/manifest.json {name: {model, reference, oracle}} for
          tests/model/test_awq.cpp.

Exit status 77 when numpy / safetensors are missing.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

try:
    import numpy as np
    from safetensors.numpy import save_file
except ImportError as e:  # pragma: no cover
    print(f"skip: {e}", file=sys.stderr)
    sys.exit(77)

AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]


def load_awq_tensors(path):
    """The I32 / F16 / F32 tensors of a safetensors file (numpy has no bfloat16, and the AWQ
    tensors are never bf16), read from the header by hand."""
    dtypes = {"I32": np.int32, "F16": np.float16, "F32": np.float32}
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__" or t["dtype"] not in dtypes:
            continue
        b, e = t["data_offsets"]
        out[name] = np.frombuffer(data[b:e], dtype=dtypes[t["dtype"]]).reshape(t["shape"])
    return out


def load_dir(model_dir):
    single = os.path.join(model_dir, "model.safetensors")
    if os.path.isfile(single):
        return load_awq_tensors(single)
    with open(os.path.join(model_dir, "model.safetensors.index.json")) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    out = {}
    for fn in files:
        out.update(load_awq_tensors(os.path.join(model_dir, fn)))
    return out


def unpack(packed):
    """int32 [rows, cols/8] -> int [rows, cols] in logical column order."""
    shifts = np.arange(0, 32, 4, dtype=np.uint32)
    u = packed.astype(np.uint32)[:, :, None] >> shifts[None, None, :]
    nib = (u & 0xF).astype(np.int32)  # [rows, cols/8, 8]: nibble i of each int32
    nib = nib[:, :, AWQ_REVERSE_ORDER]  # column j of the group is nibble AWQ_REVERSE_ORDER[j]
    return nib.reshape(packed.shape[0], -1)


def dequant_layer(qweight, qzeros, scales, group_size):
    iw = unpack(qweight)  # [in, out]
    iz = unpack(qzeros)   # [in/g, out]
    iz = np.repeat(iz, group_size, axis=0)
    s = np.repeat(scales.astype(np.float32), group_size, axis=0)
    w = (iw - iz).astype(np.float32) * s  # [in, out]
    return np.ascontiguousarray(w.T)


def dequant(model_dir, out_path):
    with open(os.path.join(model_dir, "config.json")) as f:
        qc = json.load(f)["quantization_config"]
    assert qc["quant_method"] == "awq" and qc["bits"] == 4 and qc["version"].lower() == "gemm", qc
    t = load_dir(model_dir)
    out = {}
    for name in sorted(t):
        if not name.endswith(".qweight"):
            continue
        p = name[: -len(".qweight")]
        qw, qz, sc = t[name], t[p + ".qzeros"], t[p + ".scales"]
        assert qw.dtype == np.int32 and qz.dtype == np.int32 and sc.dtype == np.float16
        g = qc["group_size"] if qc["group_size"] > 0 else qw.shape[0]
        out[p + ".weight"] = dequant_layer(qw, qz, sc, g)
    if not out:
        raise SystemExit(f"{model_dir}: no AWQ layers")
    save_file(out, out_path)
    return len(out)


SUITE = {
    # name: kvboost-fixture flags
    "llama_g32": "--preset tiny --arch llama --dtype f16 --intermediate 192 --no-tie --group-size 32 --seed 5",
    "qwen2_g64": ("--preset tiny --arch qwen2 --dtype bf16 --hidden 128 --heads 4 --kv-heads 2 --intermediate 256"
                  " --group-size 64 --awq-not-convert down_proj --shards 2 --seed 6"),
    "qwen3_g128": ("--preset tiny --arch qwen3 --dtype f16 --hidden 128 --heads 4 --kv-heads 2 --head-dim 32"
                   " --intermediate 384 --group-size 128 --seed 7"),
}


def suite(fixture, out_dir):
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    manifest = {}
    for name, flags in SUITE.items():
        d = os.path.join(out_dir, name)
        model, ref, oracle = os.path.join(d, "model"), os.path.join(d, "reference"), os.path.join(d, "oracle.safetensors")
        cmd = [fixture, *flags.split(), "--quant", "awq", "--out", model, "--dequant-out", ref]
        print("+ " + " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
        n = dequant(model, oracle)
        print(f"{name}: {n} AWQ layers dequantized -> {oracle}", flush=True)
        manifest[name] = {"model": model, "reference": ref, "oracle": oracle}
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("dequant")
    a.add_argument("--model", required=True)
    a.add_argument("--out", required=True)
    b = sub.add_parser("suite")
    b.add_argument("--fixture", required=True)
    b.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.cmd == "dequant":
        print(f"{dequant(args.model, args.out)} AWQ layers -> {args.out}")
    else:
        suite(args.fixture, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
