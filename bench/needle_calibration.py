#!/usr/bin/env python3
"""Writes a guard calibration file (the format of src/runtime/guard_file.cpp) from the lead
errors in `kvboost bench reuse --task needle --per-prompt FILE` files: the `error` column of
each selective and cacheblend row (its first-token lead minus the full prefill's lead of the
same two tokens), the samples `--calibrate` would write; for runs stopped before their end,
when --calibrate never wrote its file. The model id is the one `--calibrate` prints or writes
(`model kvb1-...`, Engine::model_id()). Also replays the guard: for each --risk, the threshold
guard_threshold() gives over the samples and how many prompts it would keep, and how many of
those kept a changed first token.

    bench/needle_calibration.py --model-id kvb1-... --out calib.txt diag-harbour.tsv diag-gpl.tsv
"""
import argparse
import csv
import math
import statistics


def t_quantile(p, nu):
    """Student's t quantile by bisection on the CDF (Simpson's rule on the density)."""
    c = math.exp(math.lgamma((nu + 1) / 2) - math.lgamma(nu / 2)) / math.sqrt(nu * math.pi)

    def cdf(t, steps=4000):
        a = -80.0
        h = (t - a) / steps
        s = sum((1 if i in (0, steps) else 4 if i % 2 else 2) * (1 + (a + i * h) ** 2 / nu) ** (-(nu + 1) / 2)
                for i in range(steps + 1))
        return c * s * h / 3

    lo, hi = -50.0, 50.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def threshold(errors, risk):
    """guard_threshold() of src/runtime/reuse.cpp: median + t(n-1, 1-risk) sd sqrt(1 + 1/n), in [0, 4]."""
    n = len(errors)
    m = statistics.median(errors)
    sd = math.sqrt(sum((x - m) ** 2 for x in errors) / (n - 1)) * math.sqrt(1 + 1 / n)
    return min(max(m + sd * t_quantile(1 - risk, n - 1), 0.0), 4.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-id", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--risk", default="0.05,0.01")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    rows = {"selective": [], "cacheblend": []}
    for f in a.files:
        with open(f, encoding="utf-8") as fh:
            for r in csv.DictReader(fh, delimiter="\t"):
                if r["mode"] in rows and r.get("error", "nan") != "nan":
                    rows[r["mode"]].append(r)
    with open(a.out, "w", encoding="utf-8") as o:
        o.write(f"kvboost-guard-calibration 1\nmodel {a.model_id}\n")
        for m in ("prefix", "none", "selective", "cacheblend"):
            e = [float(r["error"]) for r in rows.get(m, [])][-64:]
            o.write(f"mode {m} checked 0 tripped 0 errors {len(e)}" + "".join(f" {x:.9g}" for x in e) + "\n")
        o.write("end 4\n")
    for m, rs in rows.items():
        if len(rs) < 4:
            continue
        e = [float(r["error"]) for r in rs]
        agree = sum(int(r["first_agree"]) for r in rs)
        print(f"{m}: {len(rs)} samples, first token = full {agree}/{len(rs)}, error median {statistics.median(e):.3f} "
              f"sd {statistics.stdev(e):.3f}")
        for risk in map(float, a.risk.split(",")):
            L = threshold(e, risk)
            kept = [r for r in rs if float(r["lead"]) >= L]
            bad = sum(1 for r in kept if r["first_agree"] == "0")
            print(f"  risk {risk}: threshold {L:.2f}, kept {len(kept)}/{len(rs)}, changed first token among kept {bad}")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
