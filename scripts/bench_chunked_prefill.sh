#!/usr/bin/env bash
# What chunked prefill buys the running streams: their inter-token latency while a burst of long
# prompts arrives, for several scheduler.max_prefill_tokens. For each budget and repetition it
# starts `pipeline run`, streams 24 requests of 400 tokens from short prompts (4 at a time), and
# 0.3 s later sends 16 requests whose 480-word prompts must be prefilled; both through
# `pipeline bench-serve --json`. Prints the medians over the repetitions (bench/README.md).
#
#   scripts/bench_chunked_prefill.sh                 # build/, stories260K from ../shared
#   BUILD_DIR=build-bench MODEL=/path/to/model REPS=5 scripts/bench_chunked_prefill.sh
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
model=${MODEL:-../shared/models/stories260K}
reps=${REPS:-3}
budgets=(${BUDGETS:-100000 2048 512 128})
port=${PORT:-2311}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
[[ -x $build/pipeline ]] || { echo "no $build/pipeline: build it first (scripts/test.sh)"; exit 1; }
[[ -f $model/config.json ]] || { echo "no model at $model (set MODEL)"; exit 1; }

for rep in $(seq "$reps"); do
  for budget in "${budgets[@]}"; do
    "$build/pipeline" run configs/llama2_serve.yaml --model "$model" --device cpu --port "$port" \
      --set scheduler.window_ms=50 --set scheduler.max_num_seqs=32 \
      --set scheduler.max_prefill_tokens="$budget" >"$out/server.log" 2>&1 &
    server=$!
    for _ in $(seq 100); do
      curl -sf "127.0.0.1:$port/health" >/dev/null && break
      sleep 0.2
    done
    "$build/pipeline" bench-serve --url "http://127.0.0.1:$port" --requests 24 --concurrency 4 \
      --max-tokens 400 --prompt-tokens 32 --json >"$out/streams-$budget-$rep.json" &
    streams=$!
    sleep 0.3
    "$build/pipeline" bench-serve --url "http://127.0.0.1:$port" --requests 16 --max-tokens 8 \
      --prompt-tokens 480 --json >"$out/long-$budget-$rep.json"
    wait "$streams"
    kill "$server"
    wait "$server" || true
  done
done

PYTHONPATH=scripts PYTHONDONTWRITEBYTECODE=1 python3 - "$out" "$reps" "${budgets[@]}" <<'EOF'
import sys
import bench_medians
out, reps, budgets = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def median(kind, budget, *path):
    return bench_medians.median(out, reps, f"{kind}-{budget}", *path)
print(f"medians of {reps}: running streams (24 x 400 tokens, 4 at a time) and long prompts (16 x 481 tokens)")
print(f"{'max_prefill_tokens':>18} {'ITL median ms':>14} {'ITL p99 ms':>11} {'ITL max ms':>11} "
      f"{'streams tok/s':>14} {'long TTFT median ms':>20} {'long TTFT p99 ms':>17}")
for b in budgets:
    print(f"{b:>18} {median('streams', b, 'itl_ms', 'median'):>14.2f} "
          f"{median('streams', b, 'itl_ms', 'p99'):>11.1f} {median('streams', b, 'itl_ms', 'max'):>11.1f} "
          f"{median('streams', b, 'output_tokens_per_s'):>14.0f} "
          f"{median('long', b, 'ttft_ms', 'median'):>20.0f} {median('long', b, 'ttft_ms', 'p99'):>17.0f}")
EOF
