#!/usr/bin/env python3
"""Compare KVBoost's logits with a reference (hf_reference.py), both in the same JSON schema:

    {"prompt_logits": [[f]*vocab]*n_prompt, "greedy_ids": [i]*N, "greedy_logits": [[f]*vocab]*N}

    compare_logits.py OURS.json REFERENCE.json [--rtol 1e-4] [--atol 2e-4] [--tie-margin X] [--strict-ties]

Tolerance: |ours - ref| <= atol + rtol * max(1, max|ref logit|) for every logit compared. Scaling by
the largest reference logit keeps the check meaningful for models with large logits, where fp32
summation-order differences grow with magnitude; the defaults suit fp32 compute on fp32/bf16/f16
weights (the reference upcasts all weights to fp32 exactly).

Greedy: run ours teacher-forced on the reference's greedy ids (`kvboost logits --force-ids`, as
tests/oracle/hf_compare.py does): the ids are then equal by construction and every row is
compared. Each row's argmax must also agree with the reference's; where it does not, the
reference's preference for its own argmax over ours is the gap: a gap within --tie-margin
(default: the logit tolerance) is a near-tie, reported, failing only with --strict-ties; a wider
gap fails. Without teacher forcing (greedy ids that differ), rows after the first differing id are
not comparable (the inputs differ), so they are skipped and the report says how many were.

Exit status: 0 agree; 1 disagree (the message says where and by how much); 2 unusable input.
"""

import argparse
import json
import math
import sys


def load(path):
    try:
        with open(path) as f:
            d = json.load(f)
    except (OSError, ValueError) as e:
        print(f"compare_logits: error: {path}: {e}", file=sys.stderr)
        sys.exit(2)
    for key in ("prompt_logits", "greedy_ids", "greedy_logits"):
        if key not in d:
            print(f"compare_logits: error: {path}: missing key {key!r}", file=sys.stderr)
            sys.exit(2)
    return d


def argmax(row):
    best = 0
    for i, v in enumerate(row):
        if v > row[best]:
            best = i
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ours")
    ap.add_argument("reference")
    ap.add_argument("--rtol", type=float, default=1e-4, help="relative to max(1, max|reference logit|)")
    ap.add_argument("--atol", type=float, default=2e-4)
    ap.add_argument("--tie-margin", type=float, default=None,
                    help="a differing argmax whose reference gap is at most this is a near-tie (default: the tolerance)")
    ap.add_argument("--strict-ties", action="store_true", help="a differing argmax at a near-tie fails too")
    ap.add_argument("--label", default="", help="name printed in the report")
    a = ap.parse_args()

    ours, ref = load(a.ours), load(a.reference)
    tag = f"[{a.label}] " if a.label else ""

    def shape_error(msg):
        print(f"compare_logits: {tag}error: {msg}", file=sys.stderr)
        sys.exit(2)

    n_prompt = len(ref["prompt_logits"])
    if len(ours["prompt_logits"]) != n_prompt:
        shape_error(f"prompt_logits has {len(ours['prompt_logits'])} rows in {a.ours}, {n_prompt} in {a.reference}")
    vocab = len(ref["prompt_logits"][0]) if n_prompt else 0
    for name, d in (("ours", ours), ("reference", ref)):
        for key in ("prompt_logits", "greedy_logits"):
            for i, r in enumerate(d[key]):
                if len(r) != vocab:
                    shape_error(f"{name} {key}[{i}] has {len(r)} logits, expected {vocab}")
        if len(d["greedy_logits"]) != len(d["greedy_ids"]):
            shape_error(f"{name}: {len(d['greedy_ids'])} greedy_ids but {len(d['greedy_logits'])} greedy_logits rows "
                        "(schema: one row per greedy id, row k = logits of the step that consumed greedy_ids[k])")
    if len(ours["greedy_ids"]) != len(ref["greedy_ids"]):
        shape_error(f"greedy length {len(ours['greedy_ids'])} in {a.ours}, {len(ref['greedy_ids'])} in {a.reference}")

    scale = max((abs(v) for r in ref["prompt_logits"] + ref["greedy_logits"] for v in r), default=0.0)
    tol = a.atol + a.rtol * max(1.0, scale)
    tie_margin = tol if a.tie_margin is None else a.tie_margin

    # Greedy ids: find the first divergence; rows up to it are comparable.
    g_ours, g_ref = ours["greedy_ids"], ref["greedy_ids"]
    first_diff = next((k for k in range(len(g_ref)) if g_ours[k] != g_ref[k]), None)
    n_greedy_rows = len(g_ref)
    tie_note = None
    if first_diff is not None:
        # The id at step k is the argmax of the previous row: the last prompt row for k = 0.
        prev = ref["prompt_logits"][-1] if first_diff == 0 else ref["greedy_logits"][first_diff - 1]
        gap = prev[g_ref[first_diff]] - prev[g_ours[first_diff]]
        tie_note = (first_diff, gap, gap <= tie_margin)
        # greedy_logits[k] consumed greedy_ids[k]: rows from k on had different inputs.
        n_greedy_rows = first_diff

    rows = [("prompt", i, ours["prompt_logits"][i], ref["prompt_logits"][i]) for i in range(n_prompt)]
    rows += [("greedy", k, ours["greedy_logits"][k], ref["greedy_logits"][k]) for k in range(n_greedy_rows)]

    worst = (0.0, None)
    bad_rows, argmax_mismatch = [], []
    for kind, i, r_o, r_r in rows:
        d = 0.0
        for x, y in zip(r_o, r_r):
            if not math.isfinite(x):
                d = math.inf
                break
            d = max(d, abs(x - y))
        if d > worst[0] or worst[1] is None:
            worst = (d, (kind, i))
        if d > tol:
            bad_rows.append((kind, i, d))
        if argmax(r_o) != argmax(r_r):
            argmax_mismatch.append((kind, i, r_r[argmax(r_r)] - r_r[argmax(r_o)]))

    print(f"{tag}rows compared: {n_prompt} prompt + {n_greedy_rows} greedy, vocab {vocab}")
    print(f"{tag}max |logit| (reference) = {scale:.4g}; tolerance = {a.atol:g} + {a.rtol:g} * max(1, {scale:.4g})"
          f" = {tol:.3e}")
    if worst[1] is not None:
        print(f"{tag}max |delta logit| = {worst[0]:.3e} at {worst[1][0]} row {worst[1][1]}"
              f" ({worst[0] / max(1.0, scale):.2e} of the logit scale)")
    print(f"{tag}argmax agreement: {len(rows) - len(argmax_mismatch)}/{len(rows)} rows"
          + ("; differs at " + ", ".join(f"{k}[{i}] (reference gap {g:.2e})" for k, i, g in argmax_mismatch[:8])
             if argmax_mismatch else ""))
    if n_greedy_rows < len(g_ref):
        print(f"{tag}warning: not teacher-forced: {len(g_ref) - n_greedy_rows} of {len(g_ref)} greedy rows "
              "not compared (run ours with --force-ids)")
    print(f"{tag}greedy ids: " + ("equal" if first_diff is None else
          f"differ from step {first_diff}: ours {g_ours[first_diff:first_diff + 8]} vs reference "
          f"{g_ref[first_diff:first_diff + 8]}"))

    failures = []
    if bad_rows:
        shown = ", ".join(f"{k}[{i}] {d:.2e}" for k, i, d in bad_rows[:8])
        failures.append(f"{len(bad_rows)} row(s) exceed the tolerance {tol:.2e}: {shown}")
    ties = [(k, i, g) for k, i, g in argmax_mismatch if g <= tie_margin]
    wide = [(k, i, g) for k, i, g in argmax_mismatch if g > tie_margin]
    if ties:
        print(f"{tag}note: {len(ties)} row(s) are near-ties (argmax differs, reference gap <= {tie_margin:.2e})")
        if a.strict_ties:
            failures.append(f"argmax differs at {len(ties)} near-tie row(s) (--strict-ties)")
    if wide:
        shown = ", ".join(f"{k}[{i}] gap {g:.2e}" for k, i, g in wide[:8])
        failures.append(f"argmax differs at {len(wide)} row(s) where the reference prefers its own by more than "
                        f"the tie margin {tie_margin:.2e}: {shown}")
    if tie_note is not None:
        k, gap, near = tie_note
        if near:
            print(f"{tag}note: greedy step {k} is a near-tie: the reference scores its id {gap:.2e} above ours "
                  f"(within the tie margin); later greedy rows not compared")
            if a.strict_ties:
                failures.append(f"greedy ids differ at step {k} (near-tie, --strict-ties)")
        else:
            failures.append(f"greedy ids differ at step {k}: reference prefers its id by {gap:.2e} > tie margin")
    if failures:
        for f in failures:
            print(f"compare_logits: {tag}FAIL: {f}", file=sys.stderr)
        return 1
    print(f"{tag}OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
