#!/usr/bin/env bash
# Builds the pipeline and server tests with a sanitizer and runs them:
#   scripts/sanitize.sh address   (AddressSanitizer, with LeakSanitizer)
#   scripts/sanitize.sh thread    (ThreadSanitizer)
# The CPU backend only: CUDA code is not instrumented.
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:?usage: scripts/sanitize.sh address|thread}
# The pipeline's and the servers' tests: the concurrent code (graph, scheduler, engine, HTTP and
# batch front ends) and what it calls per request. A new test of that code belongs here. They run
# two at a time, longest first (most of the longest ones' time is spent waiting on timeouts), so
# the run takes about as long as its longest test.
tests=(test_server_http test_server_e2e test_batch test_engine_stress test_engine test_openai_request test_token_endpoints test_runner_failure test_scheduler test_graph test_peer_connection test_batching test_stage_failure test_on_demand_thread_pool test_openai_response test_model_step test_scheduler_policy test_metrics)
at_once=2
dir=build-$kind
# -O1 with line tables only (-g1): the sanitizers' reports still name each frame's file and line,
# and the build takes about half the time of -O2 -g, which was most of CI's time here. The test
# programs' own code at -O0: instrumented, their -O1 builds took 30 s longer on two cores.
# Ninja: Make builds the targets named below one after another, leaving a core idle most of the
# time (9.4 minutes against Ninja's 6.2 for the AddressSanitizer build on two cores).
export CMAKE_GENERATOR=${CMAKE_GENERATOR:-Ninja}
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
  -DPIPELINE_TEST_OPTIMIZATION=-O0 -DPIPELINE_CUDA=OFF -DPIPELINE_BENCH=OFF -DPIPELINE_SANITIZE="$kind"
cmake --build "$dir" -j"$(nproc)" --target pipeline "${tests[@]}"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
# oneTBB's hand-offs are made visible to TSan by kernels/cpu/tsan_tbb_hooks.cpp (compiled into
# thread builds only); scripts/tsan.supp covers calls from inside the uninstrumented libraries
# (cpp-httplib, libtbb, libsentencepiece).
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/scripts/tsan.supp"
# Each test's output goes to its own log, printed in one piece when it ends, so two running at
# once do not interleave their reports.
logs=$dir/sanitizer-logs
rm -rf "$logs" && mkdir -p "$logs"
run_test() {
  local status=0
  "$dir/$1" --gtest_brief=1 >"$logs/$1.log" 2>&1 || status=$?
  printf '== %s: %s ended with exit status %d\n%s\n' "$kind" "$1" "$status" "$(cat "$logs/$1.log")"
  [ "$status" -eq 0 ] || touch "$logs/$1.failed"
}
for t in "${tests[@]}"; do
  while (($(jobs -rp | wc -l) >= at_once)); do wait -n; done
  echo "-- $kind: $t started"
  run_test "$t" &
done
wait
failed=()
for t in "${tests[@]}"; do
  if [ -e "$logs/$t.failed" ]; then failed+=("$t"); fi
done
if ((${#failed[@]})); then
  echo "$kind sanitizer: failed: ${failed[*]}"
  exit 1
fi
echo "$kind sanitizer: ${tests[*]} clean"
