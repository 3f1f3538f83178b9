"""The package's surface: python -m kvboost runs the CLI; the documented names exist."""
import os
import subprocess
import sys

import kvboost


def test_python_m_kvboost_runs_the_cli(tiny_dir):
    r = subprocess.run([sys.executable, "-m", "kvboost", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "generate" in r.stdout, r.stderr
    r = subprocess.run([sys.executable, "-m", "kvboost", "generate", "-m", tiny_dir, "-p", "Once", "-n", "3",
                        "--quiet"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("Once")


def test_public_names_and_docstrings():
    for name in kvboost.__all__:
        assert hasattr(kvboost, name), name
    for f in (kvboost.KVBoost.from_pretrained, kvboost.KVBoost.generate, kvboost.KVBoost.generate_batch,
              kvboost.KVBoost.warm, kvboost.KVBoost.verify_correctness, kvboost.KVBoost.cache_stats):
        assert f.__doc__ and f.__annotations__, f
    assert issubclass(kvboost.ModelNotFoundError, kvboost.Error)
    assert issubclass(kvboost.InvalidRequestError, ValueError)
    assert os.path.isfile(os.path.join(os.path.dirname(kvboost.__file__), "py.typed"))
