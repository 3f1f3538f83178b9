#!/usr/bin/env bash
# An AddressSanitizer + UndefinedBehaviorSanitizer build (KVBOOST_SANITIZE=ON, gcc) of the tests
# that read outside data or serve clients, run under ctest: the server over real HTTP (and its
# hostile-client tests), the runtime, the KV cache and chunk store, the tokenizer, the model
# loaders and the bad-input catalog. A subset, so that CI stays within its time on 2 cores; the
# kernel tests (pure arithmetic, slow under ASan) are left to the release build.
#
#   scripts/sanitize.sh [extra ctest args...]
#
# Environment: KVBOOST_SANITIZE_BUILD_DIR (default build-asan), KVBOOST_JOBS (default nproc).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

build_dir="${KVBOOST_SANITIZE_BUILD_DIR:-build-asan}"
jobs="${KVBOOST_JOBS:-$(nproc)}"
targets=(test_server test_http_hostile test_runtime test_kv test_tokenizer test_model test_gguf test_chat
         test_bad_input)
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
start=$SECONDS
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVBOOST_SANITIZE=ON "${launcher[@]}" >/dev/null
nice ninja -C "$build_dir" -j"$jobs" "${targets[@]}"
echo "[sanitize] built in $((SECONDS - start)) s"
# Executables not built above register as "<target>_NOT_BUILT" (gtest_discover_tests): skipped,
# with the Python/CLI tests that need other binaries.
export ASAN_OPTIONS="detect_leaks=${KVBOOST_DETECT_LEAKS:-0}:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export LSAN_OPTIONS="suppressions=$PWD/scripts/lsan.supp"
ctest --test-dir "$build_dir" -j"$jobs" --output-on-failure --timeout 600 \
  -E '_NOT_BUILT|openai_client|oracle|Oracle|^cli\.|^server\.|^hf_compare\.|_fixture\.|tokenizer_diff' "$@"
echo "[sanitize] done in $((SECONDS - start)) s"
