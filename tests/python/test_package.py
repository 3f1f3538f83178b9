"""The package's surface: python -m kvboost runs the CLI; the documented names exist."""
import os
import subprocess
import sys

import pytest

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


@pytest.mark.skipif(os.environ.get("KVBOOST_WHEEL_TEST") != "1",
                    reason="only against an installed manylinux wheel (scripts/build_wheel.sh sets KVBOOST_WHEEL_TEST=1)")
def test_installed_wheel_is_self_contained(tiny_dir):
    """The repaired wheel carries the libraries beyond the manylinux set in kvboost.libs/, and both
    the extension and the bundled CLI load them from there, not from the system."""
    import glob

    pkg = os.path.dirname(os.path.abspath(kvboost.__file__))
    site = os.path.dirname(pkg)
    libs = os.path.join(site, "kvboost.libs")
    assert os.path.isdir(libs), f"{libs}: no grafted libraries"
    assert not os.path.exists(os.path.join(site, "bin", "kvboost")), "the wheel put bin/ into site-packages"
    assert not os.path.exists(os.path.join(site, "include", "kvboost")), "the wheel put include/ into site-packages"
    cli = os.path.join(pkg, "bin", "kvboost")
    (ext,) = glob.glob(os.path.join(pkg, "_kvboost*.so"))
    for elf in (ext, cli):
        out = subprocess.run(["ldd", elf], capture_output=True, text=True, timeout=30).stdout
        assert "not found" not in out, out
        for name in ("libicuuc", "libpcre2-8", "libxxhash", "libhiredis", "libgomp"):
            lines = [ln for ln in out.splitlines() if name in ln]
            assert lines and os.path.realpath(libs) in os.path.realpath(lines[0].split("=>")[1].split()[0]), \
                f"{elf}: {name} is not loaded from {libs}: {lines}"
    r = subprocess.run([sys.executable, "-m", "kvboost", "generate", "-m", tiny_dir, "-p", "Once", "-n", "2", "--quiet"],
                       capture_output=True, text=True, timeout=120, env={k: v for k, v in os.environ.items() if k != "KVBOOST_CLI"})
    assert r.returncode == 0 and r.stdout.startswith("Once"), r.stderr
