#!/usr/bin/env python3
"""Turn benchmark JSON into PNG charts.

    scripts/plot_bench.py FILE.json... [-o OUTDIR]

Inputs (each file is recognised by its shape):
  * `kvboost bench reuse --json`: TTFT by mode and scenario beside the full prefill
    -> OUTDIR/reuse_ttft.png
  * `kvboost bench model --json`, one file per weight format (the label is the file name without
    .json, or LABEL=FILE), plus llama.cpp's `llama-bench -o json` output as llamacpp-LABEL.json:
    prefill and decode tokens/s per format, ours beside llama.cpp's -> OUTDIR/model_tps.png
  * `build/bench/server_load --json FILE`: TTFT and inter-token latency p50/p99 per client count
    -> OUTDIR/server_latency.png
  * any other `kvboost bench ... --json`: one bar chart per table of its first numeric column
    -> OUTDIR/<command>_<n>.png

matplotlib (pinned in scripts/install-deps.sh) renders without a display (Agg backend).
"""
import argparse
import json
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

NUM = re.compile(r"-?\d[\d,]*\.?\d*")


def number(v):
    """A cell as a float: JSON numbers as they are, text by its first number ("2.09x" -> 2.09)."""
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        m = NUM.search(v.replace("*", ""))
        if m:
            return float(m.group(0).replace(",", ""))
    return None


def save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    print(path)


def plot_reuse(doc, out):
    rows = []
    for t in doc["tables"]:
        if "TTFT ms" in t["columns"] and "mode" in t["columns"]:
            rows += t["rows"]
    if not rows:
        raise SystemExit("bench reuse JSON without a TTFT table")
    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    fig, ax = plt.subplots(figsize=(7, 3.6))
    width = 0.8 / len(modes)
    for i, m in enumerate(modes):
        ys = []
        for s in scenarios:
            v = [number(r["TTFT ms"]) for r in rows if r["scenario"] == s and r["mode"] == m]
            ys.append(v[0] if v else 0)
        xs = [k + (i - (len(modes) - 1) / 2) * width for k in range(len(scenarios))]
        ax.bar(xs, ys, width, label=m)
    ax.set_xticks(range(len(scenarios)))
    ax.set_xticklabels(scenarios)
    ax.set_ylabel("time to first token (ms, median)")
    ax.set_title("TTFT by reuse mode vs the full prefill")
    ax.legend(fontsize=8)
    save(fig, os.path.join(out, "reuse_ttft.png"))


def ours_tps(doc):
    """(prefill tok/s, decode tok/s) from `kvboost bench model --json`: the first pp and tg rows."""
    pp = tg = None
    for t in doc["tables"]:
        for r in t["rows"]:
            what = str(r.get("what", ""))
            if pp is None and what.startswith("prefill"):
                pp = number(r.get("tokens/s"))
            if tg is None and what.startswith("decode"):
                tg = number(r.get("tokens/s"))
    return pp, tg


def llamacpp_tps(rows):
    pp = tg = None
    for r in rows:
        if r.get("n_gen", 0) == 0 and r.get("n_prompt", 0) > 0:
            pp = float(r["avg_ts"])
        elif r.get("n_gen", 0) > 0 and r.get("n_prompt", 0) == 0:
            tg = float(r["avg_ts"])
    return pp, tg


def plot_model(ours, peers, out):
    labels = list(ours)
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.4))
    for ax, k, name in ((axes[0], 0, "prefill tokens/s"), (axes[1], 1, "decode tokens/s")):
        xs = range(len(labels))
        ax.bar([x - 0.2 for x in xs], [ours[l][k] or 0 for l in labels], 0.4, label="KVBoost")
        if peers:
            ax.bar([x + 0.2 for x in xs], [(peers.get(l) or (0, 0))[k] or 0 for l in labels], 0.4, label="llama.cpp")
        ax.set_xticks(list(xs))
        ax.set_xticklabels(labels)
        ax.set_title(name)
        ax.legend(fontsize=8)
    save(fig, os.path.join(out, "model_tps.png"))


def plot_server(phases, out):
    clients = [p["clients"] for p in phases]
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.4))
    for ax, key, name in ((axes[0], "ttft_ms", "time to first token (ms)"), (axes[1], "itl_ms", "inter-token latency (ms)")):
        for q in ("p50", "p99"):
            ax.plot(clients, [p[f"{key}_{q}"] for p in phases], marker="o", label=q)
        ax.set_xlabel("concurrent clients")
        ax.set_title(name)
        ax.legend(fontsize=8)
    save(fig, os.path.join(out, "server_latency.png"))


def plot_generic(doc, out):
    name = doc["command"].replace(" ", "_")
    for n, t in enumerate(doc["tables"]):
        cols = t["columns"]
        for c in cols[1:]:
            ys = [number(r.get(c)) for r in t["rows"]]
            if ys and all(y is not None for y in ys):
                fig, ax = plt.subplots(figsize=(7, 3.4))
                ax.bar(range(len(ys)), ys)
                ax.set_xticks(range(len(ys)))
                ax.set_xticklabels([str(r.get(cols[0]))[:18] for r in t["rows"]], rotation=20, fontsize=7)
                ax.set_title(f"{t['title'][:60]}: {c}", fontsize=9)
                save(fig, os.path.join(out, f"{name}_{n}.png"))
                break


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", help="JSON files (LABEL=FILE names a bench model file's format)")
    ap.add_argument("-o", "--out", default=".", help="directory for the PNGs")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    ours, peers = {}, {}
    for spec in a.files:
        label, _, path = spec.rpartition("=") if "=" in spec else ("", "", spec)
        label = label or os.path.splitext(os.path.basename(path))[0]
        with open(path) as f:
            doc = json.load(f)
        if isinstance(doc, list) and doc and "ttft_ms_p50" in doc[0]:
            plot_server(doc, a.out)
        elif isinstance(doc, list) and doc and "avg_ts" in doc[0]:
            peers[label.removeprefix("llamacpp-")] = llamacpp_tps(doc)
        elif isinstance(doc, dict) and doc.get("command") == "bench reuse":
            plot_reuse(doc, a.out)
        elif isinstance(doc, dict) and doc.get("command") == "bench model":
            ours[label] = ours_tps(doc)
        elif isinstance(doc, dict) and "tables" in doc:
            plot_generic(doc, a.out)
        else:
            sys.exit(f"{path}: not a kvboost bench --json, server_load --json or llama-bench JSON file")
    if ours:
        plot_model(ours, peers, a.out)


if __name__ == "__main__":
    main()
