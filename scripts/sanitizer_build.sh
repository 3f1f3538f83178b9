# Sourced by scripts/sanitize.sh and scripts/fuzz.sh: configures the one clang-14 build they share
# (build-san/ by default), in which every library is compiled with
# -fsanitize=fuzzer-no-link,address,undefined (KVBOOST_FUZZ=ON). The test executables link it
# with ASan+UBSan (coverage counters unused), the fuzz targets with libFuzzer: one build serves
# both stages, so CI compiles the tree once for them. -O1 -gline-tables-only: symbolized reports
# at a fraction of -O2 -g's compile time (the kernels keep their own -O3).
# Sets san_build_dir, san_jobs; defines san_build TARGET...
san_build_dir="${KVBOOST_SANITIZE_BUILD_DIR:-build-san}"
san_jobs="${KVBOOST_JOBS:-$(nproc)}"
command -v clang++-14 >/dev/null || { echo "clang++-14 is missing (scripts/install-deps.sh installs it)" >&2; exit 1; }
san_build() {
  local launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  cmake -S . -B "$san_build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only -DNDEBUG" \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only -DNDEBUG" \
    -DKVBOOST_FUZZ=ON -DKVBOOST_BUILD_TESTS=ON "${launcher[@]}" >/dev/null
  nice ninja -C "$san_build_dir" -j"$san_jobs" "$@"
}
