#!/usr/bin/env python3
"""The module dependency rule, checked (docs/architecture.md "Module layering").

Each module (src/<module>/, its public header include/kvboost/<module>.h, and the interface
folders python/ and tools/) has a rank; a module may use only modules of a LOWER rank. Peers of
one rank do not use each other. The edges come from the code, three ways:

  * #include "kvboost/<header>.h" in the module's sources and in its public header(s);
  * #include "../<module>/..." and "testing/..." (a sibling module's internal header);
  * the CMake files: target_link_libraries(<target> ... kvboost_<x> ...) and
    target_include_directories(<target> ... ${CMAKE_SOURCE_DIR}/src/<x> ...) of the module's
    targets.

Exit 1 listing every upward or sideways edge that is not a KNOWN_EXCEPTION; exit 0 otherwise.
--inject FROM:TO adds a fake edge (the ctest layering.check_fails_on_violation uses it to show
that the check can fail).
"""
import argparse
import os
import re
import sys

# The rule, low to high. Same rank = peers (no edges between them).
RANKS = {
    "common": 0,     # errors, logging, threads, CPU features, mapped files
    "kernels": 1,    # free functions: matmul per weight type, norms, RoPE, attention (cpu/, cuda/)
    "hub": 1,        # Hugging Face Hub downloads (uses common only)
    "dist": 1,       # tensor-parallel collectives: shared memory between processes, NCCL (common only)
    "sampling": 1,   # header only (include/kvboost/sampling.h): the sampling settings the model's
                     # generation_config defaults, requests, the server and the CLI share
    "tokenizer": 2,  # tokenizer.json / GGUF vocabularies, streaming detokenizer
    # kv uses only common and kernels (RoPE re-rotation); it ranks below model because the model's
    # forward pass takes its K/V views from it (kvboost/kv_layout.h: KvLayout, Pager).
    "kv": 2,         # block pool, block tables, K/V layout, tiers, chunk hashing and stores (no model)
    "chat": 3,       # chat templates (Jinja subset)
    "reuse": 3,      # chunk reuse: policy, chunk keys, prompt plans over the chunk store, the repair
                     # ladder's cost model, the adaptive guard (uses kv and common; the engine applies it)
    "grammar": 3,    # GBNF / JSON-schema token masks (over the tokenizer's vocabulary)
    "model": 4,      # config, weight formats, architectures (arch/), forward pass over K/V views
    # gpu ranks below runtime: it is the device backend of the engine's model runner (the paged
    # device runner, kvboost/gpu.h PagedRunner), as model is its CPU backend; it knows block ids
    # (kv) and weights (model), never the scheduler. docs/gpu.md "Module layering".
    "gpu": 5,        # the CUDA decoder and the engine's paged device runner (binds a model's weight files)
    "testing": 5,    # kvboost_testing: fixture writer for tests, tools and the CLI demo
    "runtime": 6,    # engine: scheduling, prefill/decode, reuse, sampling, stop strings
    "server": 7,     # OpenAI-compatible HTTP server
    "cli": 8,        # the kvboost command
    "python": 8,     # the _kvboost module
    "tools": 8,      # kvboost-fixture and other generators
}

# Headers of include/kvboost/ that belong to a module other than their own name says.
HEADER_MODULE = {"model_files": "model", "engine": "runtime", "sampler": "runtime", "kv_layout": "kv"}

# Edges the rule allows anyway, each with its reason: (from, to) -> reason.
KNOWN_EXCEPTIONS = {
    # None today. Add one only with a reason a reviewer can check.
}

CMAKE_TARGET_MODULE = {
    "kvboost_cuda_kernels": "kernels",  # built in src/gpu/CMakeLists.txt, sources in src/kernels/cuda
    "kvboost": "cli",
    "_kvboost": "python",
    "kvboost-fixture": "tools",
}

SRC_EXT = (".cpp", ".h", ".inc", ".cu", ".cuh", ".hpp")


def module_of_target(t):
    if t in CMAKE_TARGET_MODULE:
        return CMAKE_TARGET_MODULE[t]
    if t.startswith("kvboost_") and t[len("kvboost_"):] in RANKS:
        return t[len("kvboost_"):]
    return None


def module_dirs(root):
    dirs = {}
    for m in RANKS:
        for base in ("src", ""):
            d = os.path.join(root, base, m) if base else os.path.join(root, m)
            if base == "" and m not in ("python", "tools"):
                continue
            if os.path.isdir(d):
                dirs[m] = d
    return dirs


INC_PUBLIC = re.compile(r'^\s*#\s*include\s+"kvboost/([A-Za-z0-9_]+)\.h"', re.M)
INC_SIBLING = re.compile(r'^\s*#\s*include\s+"\.\./([A-Za-z0-9_]+)/', re.M)
INC_TESTING = re.compile(r'^\s*#\s*include\s+"testing/', re.M)


def header_module(h):
    return HEADER_MODULE.get(h, h)


def include_edges(path, owner, edges):
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    rel = os.path.relpath(path)
    for h in INC_PUBLIC.findall(text):
        edges.append((owner, header_module(h), f'{rel}: #include "kvboost/{h}.h"'))
    for m in INC_SIBLING.findall(text):
        # "../kernels/cuda/..." from src/gpu; a file's own subfolders ("../arch.h" from
        # src/model/arch/) are not modules.
        if m in RANKS:
            edges.append((owner, m, f'{rel}: #include "../{m}/..."'))
    if INC_TESTING.search(text):
        edges.append((owner, "testing", f'{rel}: #include "testing/..."'))


def cmake_edges(path, owner, edges):
    with open(path, encoding="utf-8") as f:
        text = re.sub(r"#[^\n]*", "", f.read())
    rel = os.path.relpath(path)
    for call in re.finditer(r"target_(link_libraries|include_directories)\s*\(([^)]*)\)", text):
        kind, args = call.group(1), call.group(2).split()
        if not args:
            continue
        src = module_of_target(args[0]) or owner
        for a in args[1:]:
            if kind == "link_libraries":
                dst = module_of_target(a)
            else:
                m = re.match(r"\$\{CMAKE_SOURCE_DIR\}/src/([A-Za-z0-9_]+)", a)
                dst = m.group(1) if m and m.group(1) in RANKS else None
                if m and m.group(1) == "kernels" and src == "kernels":
                    dst = None
            if dst:
                edges.append((src, dst, f"{rel}: target_{kind}({args[0]} ... {a})"))


def collect(root):
    edges = []
    for m, d in module_dirs(root).items():
        for dirpath, _, files in os.walk(d):
            for fn in files:
                p = os.path.join(dirpath, fn)
                if fn == "CMakeLists.txt":
                    cmake_edges(p, m, edges)
                elif fn.endswith(SRC_EXT):
                    # src/kernels/cuda is the kernels module even though src/gpu builds it.
                    include_edges(p, m, edges)
    inc = os.path.join(root, "include", "kvboost")
    for fn in sorted(os.listdir(inc)):
        if fn.endswith(".h"):
            owner = header_module(fn[:-2])
            if owner not in RANKS:
                sys.exit(f"check_layers: include/kvboost/{fn} belongs to no module of the rule (add it to RANKS)")
            include_edges(os.path.join(inc, fn), owner, edges)
    for m in os.listdir(os.path.join(root, "src")):
        if os.path.isdir(os.path.join(root, "src", m)) and m not in RANKS:
            sys.exit(f"check_layers: src/{m}/ is not in the rule (add it to RANKS in {__file__})")
    return edges


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--inject", action="append", default=[], help="FROM:TO, a fake edge (self-test)")
    ap.add_argument("--print-graph", action="store_true", help="print the module graph as it is")
    args = ap.parse_args()
    os.chdir(args.root)
    edges = collect(".")
    for e in args.inject:
        a, b = e.split(":")
        edges.append((a, b, "--inject"))
    bad, graph = [], {}
    for a, b, where in edges:
        if a == b:
            continue
        if a not in RANKS or b not in RANKS:
            bad.append(f"{where}: module '{b if b not in RANKS else a}' is not in the rule")
            continue
        graph.setdefault(a, set()).add(b)
        if RANKS[b] < RANKS[a] or (a, b) in KNOWN_EXCEPTIONS:
            continue
        kind = "sideways (peers)" if RANKS[a] == RANKS[b] else "upward"
        bad.append(f"{where}: {a} (rank {RANKS[a]}) -> {b} (rank {RANKS[b]}) is {kind}")
    if args.print_graph:
        for a in sorted(graph, key=lambda m: (RANKS[m], m)):
            print(f"{a:10s} -> {', '.join(sorted(graph[a], key=lambda m: (RANKS[m], m)))}")
    if bad:
        print("check_layers: the module dependency rule (docs/architecture.md) is broken:")
        for b in sorted(set(bad)):
            print("  " + b)
        return 1
    print(f"check_layers: {len(edges)} edges, every one downward ({len(KNOWN_EXCEPTIONS)} known exceptions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
