#!/usr/bin/env bash
# What the prefix cache buys a prompt the server has seen before (a shared system prompt, a
# document asked about again): for scheduler.enable_prefix_caching false and true, it starts
# `pipeline run` and sends the same long prompt 16 times, one request at a time, then 4 at a
# time, each generating 16 tokens, through `pipeline bench-serve --json`. Prints the medians of
# time to first token and of requests served per second over the repetitions. Then, on a server
# with the config's batch window, 4 calls one after another, each with n = 16 choices of a prompt
# of its own: the choices compute their prompt once (bench/README.md).
#
#   scripts/bench_prefix_cache.sh                    # build/, stories260K from ../shared
#   BUILD_DIR=build-bench MODEL=/path/to/model REPS=5 WORDS=1000 scripts/bench_prefix_cache.sh
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
model=${MODEL:-../shared/models/stories260K}
reps=${REPS:-3}
words=${WORDS:-480}
port=${PORT:-2312}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
[[ -x $build/pipeline ]] || { echo "no $build/pipeline: build it first (scripts/test.sh)"; exit 1; }
[[ -f $model/config.json ]] || { echo "no model at $model (set MODEL)"; exit 1; }
prompt=$(python3 -c "import sys; print(' '.join(['a'] * int(sys.argv[1])))" "$words")

# Starts `pipeline run` on the model with extra --set options; sets $server to its pid.
start_server() {
  "$build/pipeline" run configs/llama2_serve.yaml --model "$model" --device cpu --port "$port" \
    "$@" >"$out/server.log" 2>&1 &
  server=$!
  for _ in $(seq 100); do
    curl -sf "127.0.0.1:$port/health" >/dev/null && break
    sleep 0.2
  done
}

for rep in $(seq "$reps"); do
  for caching in false true; do
    start_server --set scheduler.window_ms=0 --set scheduler.enable_prefix_caching="$caching"
    for concurrency in 1 4; do
      "$build/pipeline" bench-serve --url "http://127.0.0.1:$port" --requests 16 \
        --concurrency "$concurrency" --max-tokens 16 --prompt "$prompt" --json \
        >"$out/$caching-$concurrency-$rep.json"
    done
    kill "$server"
    wait "$server" || true
  done
  for caching in false true; do
    start_server --set scheduler.enable_prefix_caching="$caching"
    "$build/pipeline" bench-serve --url "http://127.0.0.1:$port" --requests 4 --concurrency 1 \
      --n 16 --max-tokens 16 --prompt-tokens "$words" --json >"$out/$caching-n16-$rep.json"
    kill "$server"
    wait "$server" || true
  done
done

PYTHONPATH=scripts PYTHONDONTWRITEBYTECODE=1 python3 - "$out" "$reps" <<'PY'
import json, sys
import bench_medians
out, reps = sys.argv[1], int(sys.argv[2])
def median(caching, concurrency, *path):
    return bench_medians.median(out, reps, f"{caching}-{concurrency}", *path)
with open(f"{out}/false-1-1.json") as report:
    first = json.load(report)
print(f"medians of {reps}: 16 requests of one {first['prompt_tokens'] // 16}-token prompt, 16 tokens each")
print(f"{'prefix caching':>14} {'concurrency':>11} {'TTFT median ms':>15} {'TTFT p99 ms':>12} "
      f"{'requests/s':>11}")
for concurrency in (1, 4):
    for caching in ("false", "true"):
        print(f"{caching:>14} {concurrency:>11} {median(caching, concurrency, 'ttft_ms', 'median'):>15.1f} "
              f"{median(caching, concurrency, 'ttft_ms', 'p99'):>12.1f} "
              f"{median(caching, concurrency, 'requests_per_s'):>11.1f}")
with open(f"{out}/false-n16-1.json") as report:
    first = json.load(report)
print(f"\nmedians of {reps}: 4 calls, one at a time, each n = 16 choices of its own "
      f"{first['prompt_tokens'] // 4}-token prompt, 16 tokens each")
print(f"{'prefix caching':>14} {'TTFT median ms':>15} {'calls/s':>8} {'output tok/s':>13}")
for caching in ("false", "true"):
    print(f"{caching:>14} {median(caching, 'n16', 'ttft_ms', 'median'):>15.1f} "
          f"{median(caching, 'n16', 'requests_per_s'):>8.2f} "
          f"{median(caching, 'n16', 'output_tokens_per_s'):>13.0f}")
PY
