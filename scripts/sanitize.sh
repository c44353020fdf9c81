#!/usr/bin/env bash
# Builds the pipeline and server tests with a sanitizer and runs them:
#   scripts/sanitize.sh address   (AddressSanitizer, with LeakSanitizer)
#   scripts/sanitize.sh thread    (ThreadSanitizer)
# The CPU backend only: CUDA code is not instrumented.
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:?usage: scripts/sanitize.sh address|thread}
# The pipeline's and the servers' tests: the concurrent code (graph, scheduler, engine, HTTP and
# batch front ends) and what it calls per request. A new test of that code belongs here.
tests=(test_metrics test_graph test_scheduler_policy test_scheduler test_model_step test_batching test_engine test_engine_stress test_openai_request test_openai_response test_token_endpoints test_server_e2e test_server_http test_peer_connection test_on_demand_thread_pool test_batch test_runner_failure test_stage_failure)
dir=build-$kind
# -O1 with line tables only (-g1): the sanitizers' reports still name each frame's file and line,
# and the build takes about half the time of -O2 -g, which was most of CI's time here.
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
  -DPIPELINE_CUDA=OFF -DPIPELINE_BENCH=OFF -DPIPELINE_SANITIZE="$kind"
cmake --build "$dir" -j"$(nproc)" --target pipeline "${tests[@]}"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
# oneTBB's hand-offs are made visible to TSan by kernels/cpu/tsan_tbb_hooks.cpp (compiled into
# thread builds only); scripts/tsan.supp covers calls from inside the uninstrumented libraries
# (cpp-httplib, libtbb, libsentencepiece).
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/scripts/tsan.supp"
for t in "${tests[@]}"; do
  echo "== $kind: $t"
  "$dir/$t" --gtest_brief=1 || { echo "$kind sanitizer: $t failed"; exit 1; }
done
echo "$kind sanitizer: ${tests[*]} clean"
