"""Hugging Face ids: a fake cache laid out as huggingface_hub writes it (refs/, snapshots/ with
symlinks into blobs/), HF_HUB_OFFLINE, revisions, a missing id, the CLI and the server taking
ids, and the download path against a fake Hub on loopback (HF_ENDPOINT) -- never a real one."""
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request

import pytest

import kvboost
from conftest import BUILD

HERE = os.path.dirname(os.path.abspath(__file__))
MAIN = "a" * 40
OLD = "b" * 40


def add_snapshot(cache, repo, commit, src_dir, ref=None):
    """Copies src_dir's files into cache as huggingface_hub does: blobs/<sha256>, snapshots/<commit>/
    entries relative symlinks to them, refs/<ref> holding the commit."""
    root = os.path.join(cache, "models--" + repo.replace("/", "--"))
    snap = os.path.join(root, "snapshots", commit)
    os.makedirs(os.path.join(root, "blobs"), exist_ok=True)
    os.makedirs(snap, exist_ok=True)
    for name in sorted(os.listdir(src_dir)):
        with open(os.path.join(src_dir, name), "rb") as f:
            data = f.read()
        etag = hashlib.sha256(data).hexdigest()
        with open(os.path.join(root, "blobs", etag), "wb") as f:
            f.write(data)
        os.symlink(os.path.join("..", "..", "blobs", etag), os.path.join(snap, name))
    if ref:
        os.makedirs(os.path.join(root, "refs"), exist_ok=True)
        with open(os.path.join(root, "refs", ref), "w") as f:
            f.write(commit)
    return snap


@pytest.fixture()
def cache(tmp_path, monkeypatch, tiny_dir):
    c = str(tmp_path / "hub")
    monkeypatch.setenv("HF_HUB_CACHE", c)
    add_snapshot(c, "acme/tiny", MAIN, tiny_dir, ref="main")
    old = tmp_path / "old"
    shutil.copytree(tiny_dir, old)
    add_snapshot(c, "acme/tiny", OLD, str(old), ref="v1")
    return c


def test_hub_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert kvboost.hf_hub_cache_dir() == str(tmp_path / "home" / "hub")
    import huggingface_hub.constants as hc  # what huggingface_hub itself computes, in a fresh process
    out = subprocess.run([sys.executable, "-c", "import huggingface_hub.constants as c; print(c.HF_HUB_CACHE)"],
                         capture_output=True, text=True, check=True, env=dict(os.environ)).stdout.strip()
    assert out == kvboost.hf_hub_cache_dir()
    assert hc  # imported


def test_from_pretrained_takes_a_cached_hub_id(cache, tiny_dir):
    e = kvboost.KVBoost.from_pretrained("acme/tiny", recompute_strategy="prefix")
    assert e.model_id == "acme/tiny"
    assert e.path == os.path.join(cache, "models--acme--tiny", "snapshots", MAIN)
    local = kvboost.KVBoost.from_pretrained(tiny_dir, recompute_strategy="prefix")
    a = e.generate("Once upon", max_new_tokens=6, temperature=0, ignore_eos=True)
    b = local.generate("Once upon", max_new_tokens=6, temperature=0, ignore_eos=True)
    assert a.token_ids == b.token_ids


def test_revisions_by_branch_and_commit(cache):
    assert kvboost.resolve_model("acme/tiny@v1")[0].endswith(OLD)
    assert kvboost.resolve_model("acme/tiny", revision="v1")[0].endswith(OLD)
    assert kvboost.resolve_model(f"acme/tiny@{MAIN}")[0].endswith(MAIN)
    e = kvboost.KVBoost.from_pretrained("acme/tiny", revision="v1")
    assert e.model_id == "acme/tiny@v1" and e.path.endswith(OLD)


def test_missing_id_offline_names_id_folder_and_command(cache, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(kvboost.ModelNotFoundError) as ei:
        kvboost.KVBoost.from_pretrained("acme/absent")
    m = str(ei.value)
    assert "acme/absent" in m and os.path.join(cache, "models--acme--absent") in m
    assert "huggingface-cli download acme/absent" in m and "HF_HUB_OFFLINE" in m
    with pytest.raises(kvboost.ModelNotFoundError, match="huggingface-cli download acme/tiny --revision v9"):
        kvboost.KVBoost.from_pretrained("acme/tiny@v9")


def test_cli_takes_hub_ids(cache):
    env = dict(os.environ, HF_HUB_CACHE=cache)
    kv = os.path.join(BUILD, "kvboost")
    r = subprocess.run([kv, "generate", "-m", "acme/tiny", "-p", "Once upon", "-n", "4", "--temperature", "0",
                        "--quiet"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([kv, "generate", "-m", "acme/absent", "-p", "x"], capture_output=True, text=True, env=env)
    assert r.returncode != 0
    assert "huggingface-cli download acme/absent" in r.stderr and "models--acme--absent" in r.stderr, r.stderr
    r = subprocess.run([kv, "generate", "-m", "/no/such/model", "-p", "x"], capture_output=True, text=True, env=env)
    assert r.returncode != 0 and "no such directory" in r.stderr and "tokenizer" not in r.stderr, r.stderr


def test_server_serves_the_hub_id_as_model_name(cache):
    env = dict(os.environ, HF_HUB_CACHE=cache)
    p = subprocess.Popen([os.path.join(BUILD, "kvboost"), "serve", "-m", "acme/tiny@v1", "--port", "0"],
                         stderr=subprocess.PIPE, text=True, env=env)
    try:
        port = None
        for line in p.stderr:
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)/v1", line)
            if m:
                port = int(m.group(1))
                break
        assert port, "server did not start"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=30) as resp:
            models = json.load(resp)
        assert [m["id"] for m in models["data"]] == ["acme/tiny@v1"]
    finally:
        p.terminate()
        p.wait(timeout=60)


def test_download_from_a_fake_hub_on_loopback(tmp_path, tiny_dir):
    """from_pretrained of an id not in the cache downloads it through huggingface_hub from
    $HF_ENDPOINT (a fake Hub on 127.0.0.1) into the cache layout, then loads it. Runs in a
    subprocess: huggingface_hub reads HF_ENDPOINT when it is first imported."""
    log = tmp_path / "requests.log"
    srv = subprocess.Popen([sys.executable, os.path.join(HERE, "fake_hub.py"), "--repo", "acme/remote",
                            "--dir", tiny_dir, "--commit", MAIN, "--log", str(log)],
                           stdout=subprocess.PIPE, text=True)
    try:
        port = int(srv.stdout.readline().split()[-1])
        env = dict(os.environ, HF_ENDPOINT=f"http://127.0.0.1:{port}", HF_HUB_CACHE=str(tmp_path / "hub"),
                   HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_PROGRESS_BARS="1", HF_HUB_ETAG_TIMEOUT="30")
        env.pop("HF_HUB_OFFLINE", None)
        code = ("import kvboost; e = kvboost.KVBoost.from_pretrained('acme/remote'); "
                "r = e.generate('Once upon', max_new_tokens=4, temperature=0, ignore_eos=True); "
                "print(e.model_id, e.path, len(r.token_ids))")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr
        model_id, path, n = r.stdout.split()
        assert model_id == "acme/remote" and n == "4"
        assert path == str(tmp_path / "hub" / "models--acme--remote" / "snapshots" / MAIN)
        root = tmp_path / "hub" / "models--acme--remote"
        assert (root / "refs" / "main").read_text() == MAIN
        assert os.path.islink(os.path.join(path, "config.json"))
        assert os.path.realpath(os.path.join(path, "config.json")).startswith(str(root / "blobs"))
        reqs = log.read_text().splitlines()
        assert "GET /api/models/acme/remote/revision/main" in reqs
        assert f"GET /acme/remote/resolve/{MAIN}/model.safetensors" in reqs
        # now cached: offline works, and does not ask the Hub again
        n_before = len(reqs)
        env["HF_HUB_OFFLINE"] = "1"
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr
        assert len(log.read_text().splitlines()) == n_before
    finally:
        srv.terminate()
        srv.wait(timeout=30)
