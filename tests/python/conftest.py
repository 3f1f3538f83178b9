"""Shared fixtures of the Python package tests (tests/python/CMakeLists.txt runs them under ctest).

Environment (set by ctest): KVBOOST_BUILD_DIR (kvboost, kvboost-fixture, python/_kvboost*.so),
KVBOOST_SHARED_DIR (stories260K, real tokenizers), KVBOOST_TEST_WORKDIR (generated models).
PYTHONPATH holds <build>/python and the source tree's python/.
"""
import os
import subprocess
import sys

import pytest

BUILD = os.environ.get("KVBOOST_BUILD_DIR", "")
SHARED = os.environ.get("KVBOOST_SHARED_DIR", "")
WORK = os.environ.get("KVBOOST_TEST_WORKDIR") or os.path.join(BUILD or "/tmp", "python_tests")
REQUIRE = os.environ.get("KVBOOST_REQUIRE_ORACLES") == "1"
SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(SOURCE, "tools", "oracle"))


def need(cond: bool, why: str) -> None:
    if not cond:
        if REQUIRE:
            pytest.fail(why)
        pytest.skip(why)


def make_fixture(name: str, *args: str) -> str:
    """A kvboost-fixture model directory under WORK (generated once)."""
    out = os.path.join(WORK, name)
    if not os.path.exists(os.path.join(out, "model.safetensors")):
        os.makedirs(WORK, exist_ok=True)
        subprocess.run([os.path.join(BUILD, "kvboost-fixture"), "--out", out, *args], check=True,
                       stdout=subprocess.DEVNULL)
    return out


@pytest.fixture(scope="session")
def tiny_dir() -> str:
    return make_fixture("tiny", "--preset", "tiny", "--max-pos", "4096")


@pytest.fixture(scope="session")
def tiny(tiny_dir):
    import kvboost
    return kvboost.KVBoost.from_pretrained(tiny_dir, recompute_strategy="prefix")


@pytest.fixture(scope="session")
def stories_dir() -> str:
    d = os.path.join(SOURCE, "models", "stories260K")  # committed in the repository
    if not os.path.isfile(os.path.join(d, "model.safetensors")):
        d = os.path.join(SHARED, "models", "stories260K")
    need(os.path.isfile(os.path.join(d, "model.safetensors")), f"{d}: stories260K missing")
    return d


@pytest.fixture(scope="session")
def stories(stories_dir):
    import kvboost
    return kvboost.KVBoost.from_pretrained(stories_dir, recompute_strategy="cacheblend")
