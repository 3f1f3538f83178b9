#!/usr/bin/env python3
"""Summarizes `kvboost bench reuse --task needle --per-prompt FILE` files (one or more, e.g. two
corpora, or a run stopped early): per mode, exact-match accuracy, agreement with the full
prefill's first token and all generated tokens, mean matching tokens, mean TTFT and its ratio to
the full prefill's over the same prompts.

    bench/needle_summary.py needle-harbour.tsv needle-gpl.tsv
"""
import collections
import statistics
import sys

rows = collections.defaultdict(list)
for path in sys.argv[1:]:
    with open(path, encoding="utf-8") as f:
        head = f.readline().rstrip("\n").split("\t")
        for line in f:
            d = dict(zip(head, line.rstrip("\n").split("\t")))
            rows[(path, d["prompt"])].append(d)
# only prompts every mode finished
modes = collections.OrderedDict()
complete = [k for k, v in rows.items() if len(v) == max(len(x) for x in rows.values())]
for k in complete:
    for d in rows[k]:
        modes.setdefault(d["mode"], []).append(d)
full = {k: next(d for d in rows[k] if d["mode"] == "full prefill") for k in complete}
print(f"{len(complete)} prompts from {len(sys.argv) - 1} file(s)\n")
print("| mode | accuracy | full prefill's accuracy on the same prompts | first token = full | all tokens = full | "
      "mean matching tokens | TTFT mean ms | mean vs full | repair that stood |\n|---|---|---|---|---|---|---|---|---|")


def stood(d):
    """The last step of a prompt's ladder ("selective:0.41/0.30/d0.0123>recompute" -> "recompute")."""
    steps = d.get("steps", "-")
    if steps in ("", "-"):
        return None
    return steps.split(">")[-1].split(":")[0]


t_full = statistics.mean(float(full[k]["ttft_ms"]) for k in complete)
for m, ds in modes.items():
    n = len(ds)
    acc = sum(int(d["correct"]) for d in ds)
    fa = sum(int(d["first_agree"]) for d in ds)
    n_tok = [int(d["matching_tokens"]) for d in ds]
    full_len = max(n_tok) if n_tok else 0
    all_eq = sum(1 for k, d in zip(complete, ds) if d["text"] == full[k]["text"])
    t = statistics.mean(float(d["ttft_ms"]) for d in ds)
    print(f"| {m} | {100 * acc / n:.1f}% ({acc}/{n}) | {sum(int(full[k]['correct']) for k in complete)}/{n} | "
          f"{100 * fa / n:.1f}% | {100 * all_eq / n:.1f}% | {statistics.mean(n_tok):.1f} | {t:.0f} | {t_full / t:.2f}x | "
          + (", ".join(f"{k} {v}" for k, v in sorted(collections.Counter(filter(None, map(stood, ds))).items())) or "-")
          + " |")


def late_trip(d):
    """A step that passed the first token and tripped at a later one (the multi-token guard,
    `--guard-tokens`): its steps entry reads e.g. "cacheblendx:2.04/1.36/t2" (token 2 tripped)."""
    for s in d.get("steps", "-").split(">"):
        name, _, rest = s.partition(":")
        if name.endswith("x") and "/t" in rest:
            return True
    return False


def answer_same(d, f):
    """The answer (the text up to the next line, as the task scores it) equals the full prefill's."""
    cut = lambda t: t.split("Answer:")[0].split("Question:")[0].strip()
    return cut(d["text"]) == cut(f["text"])


print("\n| mode | prompts a later guarded token escalated | answer text = full prefill's | per-prompt TTFT ratio full/mode, median |\n|---|---|---|---|")
for m, ds in modes.items():
    n = len(ds)
    lt = sum(late_trip(d) for d in ds)
    same = sum(answer_same(d, full[k]) for k, d in zip(complete, ds))
    ratios = [float(full[k]["ttft_ms"]) / max(1e-9, float(d["ttft_ms"])) for k, d in zip(complete, ds)]
    print(f"| {m} | {lt}/{n} | {same}/{n} | {statistics.median(ratios):.2f}x |")
