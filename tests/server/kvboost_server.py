"""What the Python server tests share: the oracles they import (or skip), the generated fixture
model, `kvboost serve --port 0` started and its port read from the log, and check().

Each test script puts its own directory on sys.path (it does when run as a script) and does:

    from kvboost_server import Checks, Server, fixture_model, require
    openai, = require("openai")            # exit 77 (skip) / 1 under KVBOOST_REQUIRE_ORACLES=1
    model = fixture_model(a.fixture, a.workdir, "tiny")
    with Server(a.kvboost, model, "tiny", "--api-key", key) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key=key, max_retries=0)
"""
import importlib
import os
import re
import signal
import subprocess
import sys
import threading
import time


def require(*modules):
    """Imports each module (dotted names allowed); on failure exits 77 (ctest's skip), or 1 when
    KVBOOST_REQUIRE_ORACLES=1."""
    out = []
    for name in modules:
        try:
            out.append(importlib.import_module(name))
        except ImportError as e:
            if os.environ.get("KVBOOST_REQUIRE_ORACLES") == "1":
                print(f"oracle missing: {e}", file=sys.stderr)
                sys.exit(1)
            print(f"SKIP: {e}; run scripts/install-deps.sh", file=sys.stderr)
            sys.exit(77)
    return out


def fixture_model(fixture, workdir, name, *args):
    """A kvboost-fixture model in workdir/name (made once; later runs reuse it). Default: the tiny
    preset; extra args go to kvboost-fixture (e.g. "--tokenizer", DIR)."""
    out = os.path.join(workdir, name)
    if not os.path.exists(os.path.join(out, "model.safetensors")):
        os.makedirs(workdir, exist_ok=True)
        subprocess.run([fixture, "--out", out, "--preset", "tiny", *args], check=True, stdout=subprocess.DEVNULL)
    return out


class Server:
    """`kvboost serve --model MODEL --port 0 --served-model-name NAME --threads 1 [--max-batch N] *extra`;
    port from its "listening on" line, stderr drained into .log. stop() sends SIGTERM (or `sig`)
    and returns the exit status ("killed after N s" when it had to be killed)."""

    def __init__(self, kvboost, model, name, *extra, max_batch=4, start_timeout=90):
        self.name = name
        self.log = []
        self.proc = subprocess.Popen(
            [kvboost, "serve", "--model", model, "--port", "0", "--served-model-name", name, "--max-batch",
             str(max_batch), "--threads", "1", *extra],
            stderr=subprocess.PIPE, text=True)
        self.port = None
        deadline = time.time() + start_timeout
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.log.append(line)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)/v1", line)
            if m:
                self.port = int(m.group(1))
                break
        if self.port is None:
            self.proc.kill()
            raise RuntimeError("server did not start:\n" + "".join(self.log))
        # Keep draining stderr so the server never blocks on it.
        threading.Thread(target=lambda: self.log.extend(self.proc.stderr), daemon=True).start()
        self.url = f"http://127.0.0.1:{self.port}"
        self.base_url = self.url + "/v1"

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.proc.poll() is not None:
            return self.proc.returncode
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return f"killed after {timeout} s"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False


class Checks:
    """check(cond, what) prints ok/FAIL and collects the failures; result(log) prints them and
    the server log's tail, and returns the exit status."""

    def __init__(self):
        self.failures = []

    def __call__(self, cond, what):
        print(("ok   " if cond else "FAIL ") + what)
        if not cond:
            self.failures.append(what)
        return cond

    def result(self, log=()):
        if not self.failures:
            return 0
        print("server log (tail):\n" + "".join(list(log)[-40:]), file=sys.stderr)
        print(f"{len(self.failures)} failure(s)", file=sys.stderr)
        return 1
