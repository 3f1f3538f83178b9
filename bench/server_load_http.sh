#!/usr/bin/env bash
# The HTTP-layer measurement of docs/measurements/2026-12-01-http-library.md: `kvboost serve` on
# stories260K with 1 and with 8 batch slots, 16 streaming clients each (bench/server_load), then the
# slow-client test (N idle connections held while new clients are timed). REPS runs of each.
#   bench/server_load_http.sh BUILD_DIR OUT_DIR [REPS] [SLOW_N]
set -euo pipefail
build=${1:?build dir}; out=${2:?out dir}; reps=${3:-3}; slow=${4:-1000}
model=${MODEL:-$(dirname "$0")/../../shared/models/stories260K}
mkdir -p "$out"
ulimit -n "$(ulimit -Hn)"
run_server() {  # $1 = max-batch; prints the pid
  local port=$2
  "$build/kvboost" serve -m "$model" --port "$port" --max-batch "$1" -t 1 --max-connections-per-client 4096 \
    >"$out/server_$1_$port.log" 2>&1 &
  echo $!
}
wait_up() { for _ in $(seq 100); do curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0; sleep 0.1; done; return 1; }
port=18431
for rep in $(seq "$reps"); do
  for mb in 1 8; do
    port=$((port + 1)); pid=$(run_server "$mb" "$port"); wait_up "$port"
    nice "$build/bench/server_load" --port "$port" -c 16 -d "${DURATION:-10}" -n 32 --json "$out/load_mb${mb}_r${rep}.json" \
      | tee -a "$out/load.txt"
    kill "$pid"; wait "$pid" 2>/dev/null || true
  done
  port=$((port + 1)); pid=$(run_server 8 "$port"); wait_up "$port"
  nice "$build/bench/server_load" --port "$port" --slow "$slow" -d 5 --json "$out/slow_r${rep}.json" | tee -a "$out/slow.txt" || true
  kill "$pid"; wait "$pid" 2>/dev/null || true
done
