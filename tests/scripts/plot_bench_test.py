#!/usr/bin/env python3
"""scripts/plot_bench.py on the committed bench outputs in tests/data/bench/: each chart is made,
is a valid PNG of a sensible size and is not blank; a file of another shape is a clear error.

    python tests/scripts/plot_bench_test.py     # ctest: scripts.plot_bench; exit 77 without matplotlib

The fixtures: reuse.json (`kvboost bench reuse --model models/stories260K --runs 1 --json`),
bf16.json (`kvboost bench model --json`), logits.json (`kvboost bench logits --json`, a table
without a dedicated chart), server_load.json (`build/bench/server_load --json` shape) and
llamacpp-bf16.json (`llama-bench -o json` shape).
"""
import os
import struct
import subprocess
import sys
import tempfile
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DATA = os.path.join(REPO, "tests", "data", "bench")
SCRIPT = os.path.join(REPO, "scripts", "plot_bench.py")

try:
    import matplotlib  # noqa: F401
except ImportError as e:
    if os.environ.get("KVBOOST_REQUIRE_ORACLES") == "1":
        sys.exit(f"missing: {e}")
    print(f"SKIP: {e} (scripts/install-deps.sh pins matplotlib)", file=sys.stderr)
    sys.exit(77)


def png_info(path):
    """(width, height, distinct pixel rows) of a PNG, read with zlib alone; raises on a bad file."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path}: not a PNG signature"
    pos, idat = 8, b""
    w = h = 0
    color = depth = None
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + n]
        (crc,) = struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])
        assert zlib.crc32(kind + body) == crc, f"{path}: bad CRC in {kind!r}"
        if kind == b"IHDR":
            w, h, depth, color = struct.unpack(">IIBB", body[:10])
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
        pos += 12 + n
    assert w and h, f"{path}: no IHDR"
    raw = zlib.decompress(idat)
    channels = {2: 3, 6: 4, 0: 1, 4: 2}[color]
    stride = 1 + w * channels * depth // 8
    assert len(raw) == stride * h, f"{path}: {len(raw)} bytes of pixels for {w}x{h}"
    # Filtered rows: identical rows (e.g. a blank image) compress to one distinct row after the
    # first; count distinct raw rows as a cheap "something is drawn" measure.
    rows = {raw[i * stride:(i + 1) * stride] for i in range(h)}
    return w, h, len(rows)


def run(args, cwd):
    return subprocess.run([sys.executable, SCRIPT, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def check(path, min_w=300, min_h=150):
    assert os.path.isfile(path), f"{path} was not written"
    w, h, distinct = png_info(path)
    assert w >= min_w and h >= min_h, f"{path}: {w}x{h}"
    assert distinct > 20, f"{path}: looks blank ({distinct} distinct rows)"
    try:
        from PIL import Image  # matplotlib's own dependency: a second, independent decoder
        with Image.open(path) as im:
            im.verify()
    except ImportError:
        pass
    return w, h


def main():
    failures = []
    with tempfile.TemporaryDirectory() as out:
        files = ["reuse.json", "bf16.json", "llamacpp-bf16.json", "server_load.json", "logits.json"]
        r = run([os.path.join(DATA, f) for f in files] + ["-o", out], cwd=out)
        if r.returncode != 0:
            failures.append(f"plot_bench.py failed ({r.returncode}): {r.stderr}")
        else:
            printed = r.stdout.split()
            for name in ("reuse_ttft.png", "model_tps.png", "server_latency.png", "bench_logits_0.png"):
                p = os.path.join(out, name)
                try:
                    w, h = check(p)
                    print(f"ok {name} {w}x{h}")
                except AssertionError as e:
                    failures.append(str(e))
                if p not in printed:
                    failures.append(f"{name}: its path was not printed (stdout: {r.stdout!r})")
        # A JSON file of another shape: a non-zero exit naming the file, and no traceback.
        bad = os.path.join(out, "other.json")
        with open(bad, "w") as f:
            f.write('{"hello": 1}')
        r = run([bad, "-o", out], cwd=out)
        if r.returncode == 0 or "other.json" not in r.stderr or "Traceback" in r.stderr:
            failures.append(f"a foreign JSON file: rc {r.returncode}, stderr {r.stderr!r}")
        else:
            print("ok foreign JSON rejected:", r.stderr.strip())
    for f in failures:
        print("FAIL", f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
