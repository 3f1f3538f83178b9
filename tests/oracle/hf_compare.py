#!/usr/bin/env python3
"""One ctest case: KVBoost's logits against Hugging Face transformers on a random-weight fixture.

    hf_compare.py --name NAME --kvboost BIN --fixture BIN --workdir DIR [--n-ids 24] [--greedy 16]
                  [--hf-on-dequant] [--compare-args ARGS] -- FIXTURE_FLAGS...

1. `kvboost-fixture FIXTURE_FLAGS --out DIR/model` writes the model directory;
2. tools/oracle/hf_reference.py runs a NAME-seeded id sequence and its greedy continuation, and
   `kvboost logits` the same ids teacher-forced on the reference's continuation (--force-ids);
3. tools/oracle/compare_logits.py judges (tolerance flags pass through with --compare-args).

Run with the oracle interpreter (CMake's KVBOOST_PYTHON). Without torch/transformers it exits 77
(ctest: skipped), unless KVBOOST_REQUIRE_ORACLES=1, when a missing oracle is a failure.
"""

import argparse
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import zlib

SKIP = 77
ORACLE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "oracle")


def require_oracles() -> bool:
    return os.environ.get("KVBOOST_REQUIRE_ORACLES", "0") not in ("", "0")


def check_oracle_available():
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except Exception as e:  # ImportError, or a broken install raising something else
        msg = (f"oracle unavailable in {sys.executable}: {type(e).__name__}: {e} "
               "(run scripts/install-deps.sh)")
        if require_oracles():
            print(f"FAIL: {msg}; KVBOOST_REQUIRE_ORACLES=1", file=sys.stderr)
            sys.exit(1)
        print(f"SKIP: {msg}")
        sys.exit(SKIP)


def run(cmd, what):
    print("+ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.stdout:
        print(p.stdout.rstrip(), flush=True)
    if p.returncode != 0:
        print(f"FAIL: {what} exited with status {p.returncode}", file=sys.stderr)
        sys.exit(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", required=True)
    ap.add_argument("--kvboost", required=True)
    ap.add_argument("--fixture", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--n-ids", type=int, default=24)
    ap.add_argument("--greedy", type=int, default=16)
    ap.add_argument("--compare-args", default="", help="extra compare_logits.py flags, e.g. '--rtol 2e-4'")
    ap.add_argument("--hf-on-dequant", action="store_true",
                    help="quantized fixture (e.g. --quant awq): kvboost runs the quantized model, transformers "
                         "the f32 model it exactly represents (kvboost-fixture --dequant-out)")
    ap.add_argument("fixture_flags", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    flags = a.fixture_flags[1:] if a.fixture_flags[:1] == ["--"] else a.fixture_flags

    check_oracle_available()

    shutil.rmtree(a.workdir, ignore_errors=True)
    os.makedirs(a.workdir)
    model = os.path.join(a.workdir, "model")
    hf_model = model
    if a.hf_on_dequant:
        hf_model = os.path.join(a.workdir, "dequantized")
        flags = [*flags, "--dequant-out", hf_model]
    run([a.fixture, *flags, "--out", model], "kvboost-fixture")

    with open(os.path.join(model, "config.json")) as f:
        cfg = json.load(f)
    window = cfg.get("sliding_window") if cfg.get("model_type") == "mistral" or cfg.get("use_sliding_window") else None
    if window and a.n_ids + a.greedy <= window:
        print(f"FAIL: sequence of {a.n_ids}+{a.greedy} tokens does not exceed sliding_window {window}", file=sys.stderr)
        sys.exit(1)
    # Ids drawn from the whole vocabulary, seeded by the test name: reproducible, and different per test.
    rng = random.Random(zlib.crc32(a.name.encode()))
    ids = " ".join(str(rng.randrange(cfg["vocab_size"])) for _ in range(a.n_ids))

    ours = os.path.join(a.workdir, "kvboost.json")
    ref = os.path.join(a.workdir, "hf.json")
    run([sys.executable, os.path.join(ORACLE_DIR, "hf_reference.py"), "--model", hf_model, "--ids", ids,
         "--greedy", str(a.greedy), "--out", ref], "hf_reference.py")
    # Teacher-forced on the reference's greedy ids: every continuation row is compared, also past
    # a near-tie where our argmax differs (compare_logits.py reports those; see its docstring).
    with open(ref) as f:
        forced = " ".join(str(i) for i in json.load(f)["greedy_ids"])
    run([a.kvboost, "logits", "--model", model, "--ids", ids, "--greedy", str(a.greedy), "--out", ours,
         *(["--force-ids", forced] if a.greedy else [])], "kvboost logits")
    run([sys.executable, os.path.join(ORACLE_DIR, "compare_logits.py"), ours, ref, "--label", a.name,
         *shlex.split(a.compare_args)], "compare_logits.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
