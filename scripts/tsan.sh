#!/usr/bin/env bash
# A ThreadSanitizer build (clang-14 -fsanitize=thread, build-tsan/) of the tests where threads meet:
# the HTTP server's event loop and handler pool over real loopback HTTP (test_server,
# test_http_hostile, test_api_extra), the engine's scheduler and streams (test_runtime,
# test_runtime_stream; test_runtime_tp: tensor parallelism's rank threads; test_layer_stream: the layer
# reader thread), the thread pool, the chunk
# store and KV cache (test_kv), and the remote chunk tier against a real redis-server
# (test_remote_store, test_remote_server). No Python.
# A data race, a lock-order inversion or any other TSan report fails the test that showed it.
#
#   scripts/tsan.sh [extra ctest args...]
#
# Environment: KVBOOST_TSAN_BUILD_DIR (default build-tsan), KVBOOST_JOBS (default nproc),
#   KVBOOST_TSAN_TARGETS (default: the eleven executables below).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

build_dir="${KVBOOST_TSAN_BUILD_DIR:-build-tsan}"
jobs="${KVBOOST_JOBS:-$(nproc)}"
targets=(test_server test_http_hostile test_api_extra test_runtime test_runtime_stream test_runtime_tp test_layer_stream
         test_thread_pool test_kv test_remote_store test_remote_server)
# KVBOOST_TSAN_TARGETS="a b ...": only these test executables (CI's bounded stage runs the core).
[[ -n "${KVBOOST_TSAN_TARGETS:-}" ]] && read -r -a targets <<< "$KVBOOST_TSAN_TARGETS"
command -v clang++-14 >/dev/null || { echo "clang++-14 is missing (scripts/install-deps.sh installs it)" >&2; exit 1; }
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
start=$SECONDS
# clang 14 like scripts/sanitizer_build.sh (its libomp has libarcher, the OMPT tool that tells
# TSan about OpenMP's barriers; gcc's libgomp would need a TSan-built copy). -O1
# -gline-tables-only: symbolized reports for less compile time (the kernels keep their -O3).
tsan_flags="-fsanitize=thread -O1 -gline-tables-only -DNDEBUG"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="$tsan_flags" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$tsan_flags" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread" -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread" \
  -DKVBOOST_BUILD_TESTS=ON -DKVBOOST_PYTHON_BINDINGS=OFF "${launcher[@]}" >/dev/null
nice ninja -C "$build_dir" -j"$jobs" "${targets[@]}"
echo "[tsan] built in $((SECONDS - start)) s"
# halt_on_error=0: every race of a test is printed; exitcode 66 fails it.
# ignore_noninstrumented_modules=1: what libarcher asks for (accesses inside libomp itself, which is
# not built with TSan, are not reported; its synchronisation still is, through archer).
export TSAN_OPTIONS="halt_on_error=0:exitcode=66:second_deadlock_stack=1:ignore_noninstrumented_modules=1:suppressions=$PWD/scripts/tsan.supp"
export KVBOOST_REQUIRE_REDIS=1
# libarcher (LLVM's OpenMP tool for TSan) makes OpenMP's fork/join and barriers visible to TSan, so
# the kernels' parallel loops are not reported as races with the thread that started them.
archer="$(ls /usr/lib/llvm-14/lib/libarcher.so 2>/dev/null || true)"
[[ -n "$archer" ]] && export OMP_TOOL_LIBRARIES="$archer"
ctest --test-dir "$build_dir" -j"$jobs" --output-on-failure --timeout 600 \
  -E '_NOT_BUILT|openai_client|oracle|Oracle|^cli\.|^server\.|^python\.|^hf_compare\.|_fixture\.|tokenizer_diff|^scripts\.|^docs\.|^layering\.' "$@"
echo "[tsan] done in $((SECONDS - start)) s"
