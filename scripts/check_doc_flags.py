#!/usr/bin/env python3
"""Check that every `kvboost <command> --flag` the docs mention is a flag the binary has.

    scripts/check_doc_flags.py [--kvboost build/kvboost] [FILE.md ...]

Default files: README.md and docs/*.md (not docs/measurements/: dated logs keep the commands as
they were run). A command is `kvboost SUB [SUBSUB]` (also `./build/kvboost`, `python -m kvboost`)
in a code block -- fenced or indented, `\\` continuations and indented synopsis lines joined --
or in an inline code span; a span may also start with the command name alone when a flag follows
(`serve --chat-template`). Each `-x` / `--long` after it must appear in `kvboost SUB --help`.
`kvboost-fixture ...` is checked against `kvboost-fixture --help` (beside the kvboost binary).

Prints one line per unknown flag (file:line: command flag) and exits 1 if there is any; exit 0
and a summary otherwise. No Python packages needed beyond the standard library.
"""
import argparse
import glob
import os
import re
import subprocess
import sys

FLAG = re.compile(r"(?<![\w\-/.=])(--?[A-Za-z][\w\-]*)")
# A command: the binary then its first word. Preceded by a start, a space, a slash or a backquote.
CMD = re.compile(r"(?:^|(?<=[\s/`(|;&$]))(kvboost(?:-fixture)?)(?=\s|$)((?:\s+[a-z][\w-]*)?(?:\s+[a-z][\w-]*)?)")
# Where one command ends inside a line (outside brackets: `(-p TEXT | -f FILE)` is one command).
END = re.compile(r"\s(?:\||&&|;|#|>|2>)\s|`")


def command_extent(rest):
    depth = 0
    for i, ch in enumerate(rest):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(0, depth - 1)
        elif depth == 0 and END.match(rest, i):
            return rest[:i]
    return rest


class Help:
    """`--help` text of kvboost commands, cached; knows which words are subcommands."""

    def __init__(self, kvboost):
        self.kvboost = kvboost
        self.fixture = os.path.join(os.path.dirname(kvboost), "kvboost-fixture")
        self.cache = {}

    def text(self, path):
        key = tuple(path)
        if key not in self.cache:
            exe = self.fixture if path and path[0] == "kvboost-fixture" else self.kvboost
            args = [exe, *path[1:], "--help"]
            try:
                r = subprocess.run(args, capture_output=True, text=True, timeout=30)
                self.cache[key] = r.stdout + r.stderr if r.returncode == 0 else None
            except OSError:
                self.cache[key] = None
        return self.cache[key]

    def subcommands(self, path):
        """Words listed under SUBCOMMANDS in `path --help`."""
        t = self.text(path) or ""
        m = re.search(r"^(?:SUBCOMMANDS|Subcommands):?\s*$(.*?)(?:^\S|\Z)", t, re.M | re.S)
        if not m:
            return set()
        return {ln.split()[0] for ln in m.group(1).splitlines() if ln.strip()}


def strip_quoted(s):
    """Quoted arguments are values, not flags ("-p 'a --b'")."""
    return re.sub(r"\"(?:[^\"\\]|\\.)*\"|'[^']*'", " ", s)


def candidate_lines(md):
    """(line number, text) of code: fenced blocks (continuations joined), indented blocks and
    inline spans. Indented synopsis lines following a command line are joined to it."""
    lines = md.split("\n")
    out = []
    fence = False
    i = 0
    while i < len(lines):
        ln = lines[i]
        if ln.lstrip().startswith("```"):
            fence = not fence
            i += 1
            continue
        indented = ln.startswith("    ") or ln.startswith("\t")
        if fence or indented:
            start = i
            text = ln
            # `\` continuations, and deeper-indented lines after a synopsis line
            base = len(ln) - len(ln.lstrip())
            while i + 1 < len(lines):
                nxt = lines[i + 1]
                deeper = (len(nxt) - len(nxt.lstrip())) > base + 2 and nxt.strip().startswith("[")
                if text.rstrip().endswith("\\") or deeper:
                    text = text.rstrip().rstrip("\\") + " " + nxt.strip()
                    i += 1
                else:
                    break
            out.append((start + 1, text))
        else:
            for m in re.finditer(r"`([^`]+)`", ln):
                out.append((i + 1, "`" + m.group(1) + "`"))
        i += 1
    return out


def commands_in(text, help_):
    """(command path, flags) for each kvboost command in one code line or span. A placeholder
    after the binary (`kvboost <command> --flag`, `kvboost ... -m`) or prose ("kvboost is") is
    not a command; an unknown word where a bench-like command expects its subcommand is reported
    (path ending in "?")."""
    found = []
    for m in CMD.finditer(text):
        binary = m.group(1)
        rest = command_extent(text[m.end(1):])
        toks = strip_quoted(rest).split()
        path = [binary]
        if binary == "kvboost":
            if not toks:
                continue
            if toks[0] in help_.subcommands(path):
                path.append(toks.pop(0))
                subsubs = help_.subcommands(path)
                if subsubs and toks and not toks[0].startswith("-"):
                    if toks[0] in subsubs:
                        path.append(toks.pop(0))
                    elif re.fullmatch(r"[a-z][\w-]*", toks[0]) and not (toks[1:2] and toks[1] == "|"):
                        found.append((path + [toks[0] + "?"], []))
                        continue
                    else:
                        continue  # `kvboost bench <any> --json`, `roofline | model`: placeholders
            elif not toks[0].startswith("-"):
                continue
        found.append((path, FLAG.findall(" ".join(toks))))
    return found


def span_without_binary(text, help_):
    """`serve --chat-template` (an inline span naming a subcommand, then flags)."""
    m = re.fullmatch(r"`([a-z][\w-]*)((?:\s+[a-z][\w-]*)?)\s+(-.*)`", text)
    if not m or "kvboost" in text:
        return []
    subs = help_.subcommands(["kvboost"])
    if m.group(1) not in subs:
        return []
    path = ["kvboost", m.group(1)]
    if m.group(2).strip() and m.group(2).strip() in help_.subcommands(path):
        path.append(m.group(2).strip())
    return [(path, FLAG.findall(strip_quoted(m.group(3))))]


def main():
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvboost", default=os.path.join(here, "build", "kvboost"), help="the kvboost binary")
    ap.add_argument("--list", action="store_true", help="print every command and flag checked")
    ap.add_argument("files", nargs="*")
    a = ap.parse_args()
    files = a.files or [os.path.join(here, "README.md"), *sorted(glob.glob(os.path.join(here, "docs", "*.md")))]
    help_ = Help(a.kvboost)
    if help_.text(["kvboost"]) is None:
        sys.exit(f"check_doc_flags: {a.kvboost} --help failed (build kvboost first, or pass --kvboost PATH)")
    bad = checked = 0
    for f in files:
        with open(f, encoding="utf-8") as fh:
            md = fh.read()
        rel = os.path.relpath(f, here)
        for lineno, text in candidate_lines(md):
            cmds = commands_in(text, help_) or (span_without_binary(text, help_) if text.startswith("`") else [])
            for path, flags in cmds:
                name = " ".join(path)
                h = None if name.endswith("?") else help_.text(path)
                if h is None:
                    print(f"{rel}:{lineno}: {name.rstrip('?')}: no such command (`{name.rstrip('?')} --help` fails)")
                    bad += 1
                    continue
                if a.list:
                    print(f"{rel}:{lineno}: {name} {' '.join(dict.fromkeys(flags))}")
                for fl in dict.fromkeys(flags):
                    checked += 1
                    if not re.search(r"(?<![\w-])" + re.escape(fl) + r"(?![\w-])", h):
                        print(f"{rel}:{lineno}: {name} {fl}: not in `{name} --help`")
                        bad += 1
    print(f"check_doc_flags: {checked} flag mentions in {len(files)} files, {bad} unknown", file=sys.stderr)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
